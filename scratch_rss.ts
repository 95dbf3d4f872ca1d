import { NetfilterSocket } from "./lib/dataplane/nftables/netlink/socket.ts";
import { encodeBatch } from "./lib/dataplane/nftables/netlink/batch.ts";
import { Transaction } from "./lib/dataplane/nftables/transaction.ts";
const rss = () => Math.round(Deno.memoryUsage().rss / 2 ** 20);
const r0 = rss();
const s = new NetfilterSocket("nlx");
const r1 = rss();
for (let i = 0; i < 50; i++) {
  const tx = new Transaction("ip", "kube-proxy");
  tx.add({ kind: "element", set: "cluster-ips", key: [`10.96.200.${i}`] });
  const b = encodeBatch("ip", "kube-proxy", tx.operations, s.nextSeq)!;
  s.usedSeq(b.endSeq);
  await s.exchange(b.bytes);
}
const r2 = rss();
console.log({
  start: r0,
  afterOpen: r1,
  after50: r2,
  threads: Deno.readTextFileSync("/proc/self/status").match(/Threads:\s+(\d+)/)![1],
});
