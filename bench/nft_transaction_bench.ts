/**
 * nftables transaction benchmarks: building and rendering a kube-proxy-shaped transaction, and applying it
 * to the fake and (optionally) to the kernel.
 *
 * `deno bench --allow-all bench/nft_transaction_bench.ts`: build + render at 1k and 10k services.
 * `deno run --allow-all bench/nft_transaction_bench.ts [--services 10000] [--endpoints 2] [--ports 10]`:
 * a table of build, render (toString, encode) and fake-apply times, operations and bytes.
 * `... --apply 1000,2000`: also `nft -f -` of the cold transaction at those sizes in a throwaway network
 * namespace (root), then one partial update (one service's endpoints changed).
 *
 * The shape follows upstream's proxier: per service a service chain (masquerade rule + numgen vmap), per
 * endpoint a chain (hairpin masquerade + dnat), one cluster-ips element, and `--ports` service-ips
 * elements (`ip . proto . port : goto chain`); 10k services × 10 ports = 100k map elements.
 */
import { DenoCommandRunner } from "../lib/exec.ts";
import { FakeNftables, NftablesRunner, Transaction } from "../lib/dataplane/nftables/mod.ts";

interface Shape {
  services: number;
  endpoints: number;
  ports: number;
}

function ipOf(prefix: number, i: number): string {
  return `${prefix}.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
}

/** Base chains, top-level chains, sets and maps, as upstream's setupNFTables() (trimmed). */
function setup(tx: Transaction): void {
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  tx.add({ kind: "chain", name: "nat-prerouting", type: "nat", hook: "prerouting", priority: "dstnat" });
  tx.add({ kind: "chain", name: "nat-output", type: "nat", hook: "output", priority: "dstnat" });
  for (const c of ["services", "mark-for-masquerade"]) {
    tx.add({ kind: "chain", name: c });
    tx.flush({ kind: "chain", name: c });
  }
  tx.add({ kind: "rule", chain: "nat-prerouting", rule: "jump services" });
  tx.add({ kind: "rule", chain: "nat-output", rule: "jump services" });
  tx.add({ kind: "rule", chain: "mark-for-masquerade", rule: "mark set mark or 0x4000" });
  tx.add({ kind: "set", name: "cluster-ips", type: "ipv4_addr", comment: "Active ClusterIPs" });
  tx.add({
    kind: "map",
    name: "service-ips",
    type: "ipv4_addr . inet_proto . inet_service : verdict",
    comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic",
  });
  tx.add({ kind: "rule", chain: "services", rule: "ip daddr . meta l4proto . th dport vmap @service-ips" });
}

/** One service: endpoint chains, the service chain and its elements. */
function service(tx: Transaction, i: number, shape: Shape, epOffset = 0): void {
  const name = `ns${i % 100}/svc${i}/tcp/p80`;
  const svcChain = `service-${(i + 0x10000000).toString(36).toUpperCase().slice(-8)}-${name}`;
  const eps: string[] = [];
  for (let e = 0; e < shape.endpoints; e++) {
    const ip = ipOf(10, i * shape.endpoints + e + epOffset);
    const chain = `endpoint-${
      (i * 7 + e).toString(36).toUpperCase().padStart(8, "A").slice(-8)
    }-${name}__${ip}/80`;
    eps.push(chain);
    tx.add({ kind: "chain", name: chain });
    tx.flush({ kind: "chain", name: chain });
    tx.add({ kind: "rule", chain, rule: `ip saddr ${ip} jump mark-for-masquerade` });
    tx.add({ kind: "rule", chain, rule: `meta l4proto tcp dnat to ${ip}:80` });
  }
  tx.add({ kind: "chain", name: svcChain });
  tx.flush({ kind: "chain", name: svcChain });
  const vip = ipOf(172, i);
  tx.add({
    kind: "rule",
    chain: svcChain,
    rule: `ip daddr ${vip} ip saddr != 10.0.0.0/8 jump mark-for-masquerade`,
  });
  const vmap = eps.map((c, k) => `${k} : goto ${c}`).join(" , ");
  tx.add({ kind: "rule", chain: svcChain, rule: `numgen random mod ${eps.length} vmap { ${vmap} }` });
  tx.add({ kind: "element", set: "cluster-ips", key: [vip] });
  for (let p = 0; p < shape.ports; p++) {
    tx.add({
      kind: "element",
      map: "service-ips",
      key: [vip, "tcp", String(80 + p)],
      value: [`goto ${svcChain}`],
    });
  }
}

/** The cold-start transaction for a shape. */
export function coldTransaction(shape: Shape): Transaction {
  const tx = new Transaction("ip", "kube-proxy");
  setup(tx);
  for (let i = 0; i < shape.services; i++) service(tx, i, shape);
  return tx;
}

function time<T>(f: () => T): [T, number] {
  const t0 = performance.now();
  const r = f();
  return [r, performance.now() - t0];
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

function mib(n: number): string {
  return (n / 1048576).toFixed(1) + " MiB";
}

for (const n of import.meta.main ? [] : [1000, 10000]) {
  const shape = { services: n, endpoints: 2, ports: 10 };
  Deno.bench(`nft transaction build, ${n} services x 2 endpoints x 10 ports`, () => {
    coldTransaction(shape);
  });
  const tx = coldTransaction(shape);
  Deno.bench(`nft transaction encode, ${n} services x 2 endpoints x 10 ports`, () => {
    tx.encode();
  });
}

function arg(name: string, dflt: string): string {
  const i = Deno.args.indexOf(name);
  return i === -1 ? dflt : Deno.args[i + 1];
}

async function applyInNetns(sizes: number[], endpoints: number, ports: number): Promise<void> {
  const host = new DenoCommandRunner();
  const ns = `dkp-nftbench-${crypto.randomUUID().slice(0, 8)}`;
  await host.run({ cmd: "ip", args: ["netns", "add", ns] });
  try {
    const runner = {
      run: (s: Parameters<DenoCommandRunner["run"]>[0]) =>
        host.run({ ...s, cmd: "ip", args: ["netns", "exec", ns, s.cmd, ...s.args] }),
      tryRun: (s: Parameters<DenoCommandRunner["run"]>[0]) =>
        host.tryRun({ ...s, cmd: "ip", args: ["netns", "exec", ns, s.cmd, ...s.args] }),
    };
    const nft = new NftablesRunner({ family: "ip", table: "kube-proxy", runner, timeoutMs: 3_600_000 });
    console.log(
      "\nnft -f - in a network namespace (cold = empty table; partial = one service's endpoints replaced)",
    );
    console.log("services | operations | bytes | cold apply | partial apply");
    for (const n of sizes) {
      await nft.deleteTable();
      const shape = { services: n, endpoints, ports };
      const tx = coldTransaction(shape);
      const bytes = tx.encode().length;
      const t0 = performance.now();
      await nft.run(tx);
      const cold = performance.now() - t0;
      const partial = new Transaction("ip", "kube-proxy");
      service(partial, 0, shape, 1_000_000);
      const t1 = performance.now();
      await nft.run(partial);
      const part = performance.now() - t1;
      console.log(
        `${n} | ${tx.numOperations} | ${mib(bytes)} | ${(cold / 1000).toFixed(2)} s | ${part.toFixed(0)} ms`,
      );
    }
    await nft.deleteTable();
  } finally {
    await host.tryRun({ cmd: "ip", args: ["netns", "del", ns] });
  }
}

if (import.meta.main) {
  const services = Number(arg("--services", "10000"));
  const endpoints = Number(arg("--endpoints", "2"));
  const ports = Number(arg("--ports", "10"));
  const shape = { services, endpoints, ports };
  const builds: number[] = [], strings: number[] = [], encodes: number[] = [], fakes: number[] = [];
  let ops = 0, bytes = 0, lines = 0;
  for (let run = 0; run < 5; run++) {
    const [tx, b] = time(() => coldTransaction(shape));
    const [text, s] = time(() => tx.toString());
    const [buf, e] = time(() => tx.encode());
    const fake = new FakeNftables("ip", "kube-proxy");
    const [, f] = time(() => fake.run(tx));
    builds.push(b);
    strings.push(s);
    encodes.push(e);
    fakes.push(f);
    ops = tx.numOperations;
    bytes = buf.length;
    lines = text.split("\n").length - 1;
  }
  const elements = services * (ports + 1);
  console.log(
    `${services} services x ${endpoints} endpoints x ${ports} ports: ${ops} operations, ${lines} lines, ` +
      `${elements} elements, ${mib(bytes)} (${bytes} bytes)`,
  );
  console.log("median of 5 | build | toString | encode (UTF-8) | apply to the fake");
  console.log(
    `ms | ${median(builds).toFixed(0)} | ${median(strings).toFixed(0)} | ${median(encodes).toFixed(0)} | ${
      median(fakes).toFixed(0)
    }`,
  );
  const apply = arg("--apply", "");
  if (apply) await applyInNetns(apply.split(",").map(Number), endpoints, ports);
}
