/** The batch encoder without a kernel: what it declines (the transaction then goes to nft). */
import assert from "node:assert/strict";
import { encodeBatch } from "../../../../lib/dataplane/nftables/netlink/batch.ts";
import { Transaction } from "../../../../lib/dataplane/nftables/transaction.ts";

function tx(build: (t: Transaction) => void): Transaction {
  const t = new Transaction("ip", "kube-proxy");
  build(t);
  return t;
}

Deno.test("encodeBatch declines what a partial sync does not write, and what does not fit a message", () => {
  const declined = [
    tx((t) => t.add({ kind: "table", flags: ["dormant"] })),
    tx((t) => t.add({ kind: "set", name: "s", type: "ipv4_addr", flags: ["interval"] })),
    tx((t) => t.add({ kind: "counter", name: "c" })),
    tx((t) => t.add({ kind: "chain", name: "nat-output", type: "nat", hook: "output", priority: "dstnat" })),
    tx((t) => t.add({ kind: "rule", chain: "c", rule: "ct state new jump x" })),
    tx((t) => t.add({ kind: "rule", chain: "c", rule: "ip6 saddr ::1 drop" })), // another family's match
    tx((t) => t.add({ kind: "rule", chain: "c", rule: "goto a b" })),
    tx((t) => t.add({ kind: "element", map: "unknown-map", key: ["1.2.3.4"], value: ["drop"] })),
    tx((t) => t.add({ kind: "element", set: "cluster-ips", key: ["1.2.3.400"] })),
    tx((t) => t.add({ kind: "map", name: "m", type: "ipv4_addr : verdict" })),
  ];
  for (const t of declined) {
    assert.equal(encodeBatch("ip", "kube-proxy", t.operations, 1), null, t.toString());
  }
  // A numgen map of 3000 endpoints: more than a 64 KiB attribute.
  const map = Array.from({ length: 3000 }, (_, i) => `${i} : 10.${i >> 8}.${i & 255}.1 . 8080`).join(" , ");
  const big = tx((t) =>
    t.add({
      kind: "rule",
      chain: "c",
      rule: `meta l4proto tcp dnat ip addr . port to numgen random mod 3000 map { ${map} }`,
    })
  );
  assert.equal(encodeBatch("ip", "kube-proxy", big.operations, 1), null);
  const ok = tx((t) => t.add({ kind: "rule", chain: "c", rule: "meta l4proto tcp dnat to 10.0.0.1:80" }));
  assert.notEqual(encodeBatch("ip", "kube-proxy", ok.operations, 1), null);
});
