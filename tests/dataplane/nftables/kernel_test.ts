/**
 * Real kernel (root): a series of transactions shaped like upstream kube-proxy's nftables proxier
 * (v1.35: base chains with hooks and priorities, verdict maps keyed `ipv4_addr . inet_proto . inet_service`,
 * numgen vmaps, affinity sets updated from the packet path, interval sets, elements with comments, flush
 * and delete of chains) is applied both with `nft -f -` in a fresh network namespace and to the fake.
 * After every step `nft list table` must equal the fake's dump, up to the two run-time differences
 * normalizeListing() removes (element expiry times, hash-set element order), and every failing
 * transaction must fail in both with the same error class and line and change neither.
 */
import assert from "node:assert/strict";
import {
  FakeNftables,
  type Family,
  NftablesError,
  NftablesRunner,
  type Operation,
  type Transaction,
} from "../../../lib/dataplane/nftables/mod.ts";
import { type NetnsRunner, nftKernelUnavailableReason, normalizeListing, withNetns } from "./helpers.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";

const unavailable = nftKernelUnavailableReason();

Deno.test("normalizeListing() drops expiry times and sorts hash-set elements, keeping the wrapping", () => {
  const kernel = `table ip t {
	set s {
		type ipv4_addr
		elements = { 172.30.0.5, 172.30.0.41,
			     172.30.0.100 comment "a, b" }
	}

	set a {
		type ipv4_addr
		flags dynamic,timeout
		timeout 3h
		elements = { 1.2.3.5 timeout 5s expires 4s996ms, 1.2.3.4 expires 2h59m59s996ms }
	}

	set i {
		type ipv4_addr
		flags interval
		elements = { 192.168.0.0/16, 10.0.0.0/8 }
	}
}`;
  assert.equal(
    normalizeListing(kernel),
    `table ip t {
	set s {
		type ipv4_addr
		elements = { 172.30.0.100 comment "a, b", 172.30.0.41,
			     172.30.0.5 }
	}

	set a {
		type ipv4_addr
		flags dynamic,timeout
		timeout 3h
		elements = { 1.2.3.4, 1.2.3.5 timeout 5s }
	}

	set i {
		type ipv4_addr
		flags interval
		elements = { 192.168.0.0/16, 10.0.0.0/8 }
	}
}`,
  );
});

/** Applies each transaction to the kernel and to the fake and compares outcomes and listings. */
class Pair {
  readonly real: NftablesRunner;
  readonly fake: FakeNftables;
  constructor(readonly runner: NetnsRunner, readonly family: Family) {
    this.real = new NftablesRunner({ family, table: "kube-proxy", runner });
    this.fake = new FakeNftables(family, "kube-proxy");
  }

  async listing(): Promise<string> {
    const r = await this.runner.tryRun({ cmd: "nft", args: ["list", "table", this.family, "kube-proxy"] });
    if (r.code !== 0) {
      assert.match(r.stderr, /No such file or directory/);
      return "";
    }
    return r.stdout;
  }

  /** Rule handles of a chain in the kernel, in order. */
  async kernelHandles(chain: string): Promise<number[]> {
    const out = await this.runner.run({
      cmd: "nft",
      args: ["-j", "list", "chain", this.family, "kube-proxy", chain],
    });
    return JSON.parse(out.stdout).nftables.filter((o: { rule?: unknown }) => o.rule).map((o: {
      rule: { handle: number };
    }) => o.rule.handle);
  }

  /**
   * Builds the transaction twice (once per side, so that rules can be addressed by each side's own
   * handles), runs it on both, and compares the outcomes and the listings.
   * @returns the kernel's error (undefined on success)
   */
  async apply(
    name: string,
    build: (tx: Transaction, handles: (chain: string) => number[]) => void,
    handleChains: string[] = [],
  ): Promise<NftablesError | undefined> {
    const kernelHandles = new Map<string, number[]>();
    for (const c of handleChains) kernelHandles.set(c, await this.kernelHandles(c));
    const realTx = this.real.newTransaction();
    build(realTx, (c) => kernelHandles.get(c) ?? []);
    const fakeTx = this.fake.newTransaction();
    build(fakeTx, (c) => this.fake.defaultTable?.chains.get(c)?.rules.map((r) => r.handle) ?? []);
    assert.equal(realTx.error, undefined, `${name}: ${realTx.error?.message}`);
    const realErr = await this.real.run(realTx).then(() => undefined, (e) => e);
    const fakeErr = await this.fake.run(fakeTx).then(() => undefined, (e) => e);
    if (realErr !== undefined && !(realErr instanceof NftablesError)) throw realErr;
    if (fakeErr !== undefined && !(fakeErr instanceof NftablesError)) throw fakeErr;
    assert.equal(
      fakeErr === undefined,
      realErr === undefined,
      `${name}: kernel ${realErr?.message ?? "succeeded"}; fake ${fakeErr?.message ?? "succeeded"}`,
    );
    if (realErr && fakeErr) {
      assert.equal(
        fakeErr.code,
        realErr.code,
        `${name}: kernel: ${realErr.message}\nfake: ${fakeErr.message}`,
      );
      assert.equal(
        fakeErr.line,
        realErr.line,
        `${name}: kernel: ${realErr.message}\nfake: ${fakeErr.message}`,
      );
    }
    assert.equal(normalizeListing(this.fake.dump()), normalizeListing(await this.listing()), name);
    return realErr;
  }

  /** A transaction that must fail in both, with the given class, leaving both unchanged. */
  async fails(name: string, code: string | undefined, build: (tx: Transaction) => void): Promise<void> {
    const before = normalizeListing(await this.listing());
    const err = await this.apply(name, build);
    assert.ok(err, `${name}: the kernel accepted it`);
    assert.equal(err.code, code, `${name}: ${err.message}`);
    assert.equal(normalizeListing(await this.listing()), before, `${name}: the kernel changed`);
  }
}

const M = "0x4000";
const SVC1 = "service-ULMVA6XW-ns1/svc1/tcp/p80";
const EP1 = "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80";
const EP2 = "endpoint-2OCDJSZQ-ns1/svc1/tcp/p80__10.180.0.2/80";
const EP3 = "endpoint-YQGOIMTP-ns1/svc1/tcp/p80__10.180.0.3/80";
const AFF = (ep: string) => ep.replace(/^endpoint-/, "affinity-");
const SVC2 = "service-42NFTM6N-ns2/svc2/udp/p53";
const SVC3 = "service-4AT6LBPK-ns3/svc3/tcp/p80";
const EXT3 = "external-4AT6LBPK-ns3/svc3/tcp/p80";
const SVC4 = "service-LAUZTJTB-ns4/svc4/tcp/p80";
const FW4 = "firewall-LAUZTJTB-ns4/svc4/tcp/p80";

const BASE_CHAINS = [
  ["filter-prerouting-pre-dnat", "filter", "prerouting", "dstnat-10"],
  ["filter-output-pre-dnat", "filter", "output", "dstnat-10"],
  ["filter-input", "filter", "input", "filter"],
  ["filter-forward", "filter", "forward", "filter"],
  ["filter-output", "filter", "output", "filter"],
  ["nat-prerouting", "nat", "prerouting", "dstnat"],
  ["nat-output", "nat", "output", "dstnat"],
  ["nat-postrouting", "nat", "postrouting", "srcnat"],
] as const;

const JUMPS = [
  ["nodeport-endpoints-check", "filter-input", "ct state new"],
  ["service-endpoints-check", "filter-input", "ct state new"],
  ["service-endpoints-check", "filter-forward", "ct state new"],
  ["service-endpoints-check", "filter-output", "ct state new"],
  ["firewall-check", "filter-prerouting-pre-dnat", "ct state new"],
  ["firewall-check", "filter-output-pre-dnat", "ct state new"],
  ["services", "nat-output", ""],
  ["services", "nat-prerouting", ""],
  ["masquerading", "nat-postrouting", ""],
  ["cluster-ips-check", "filter-forward", "ct state new"],
  ["cluster-ips-check", "filter-output", "ct state new"],
] as const;

/** upstream v1.37's setupNFTables(), IPv4, nodePortAddresses set to one node IP. */
function setup(tx: Transaction, firstSync: boolean): void {
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  if (firstSync) {
    for (const [name] of BASE_CHAINS) {
      tx.add({ kind: "chain", name });
      tx.delete({ kind: "chain", name });
    }
  }
  for (const [name, type, hook, priority] of BASE_CHAINS) {
    tx.add({ kind: "chain", name, type, hook, priority });
    tx.flush({ kind: "chain", name });
  }
  const created = new Set<string>();
  const ensure = (name: string, comment?: string) => {
    if (created.has(name)) return;
    created.add(name);
    tx.add(comment ? { kind: "chain", name, comment } : { kind: "chain", name });
    tx.flush({ kind: "chain", name });
  };
  for (const [dst, src, extra] of JUMPS) {
    ensure(dst);
    tx.add({ kind: "rule", chain: src, rule: extra ? `${extra} jump ${dst}` : `jump ${dst}` });
  }
  for (const c of ["services", "cluster-ips-check", "masquerading"]) ensure(c);
  tx.add({
    kind: "set",
    name: "hairpin-connections",
    type: "ipv4_addr . ipv4_addr . inet_proto . inet_service",
    comment: "service hairpin connections",
  });
  tx.add({
    kind: "rule",
    chain: "masquerading",
    rule: `mark and ${M} != 0 mark set mark xor ${M} masquerade fully-random`,
  });
  tx.add({
    kind: "rule",
    chain: "masquerading",
    rule:
      "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
  });
  tx.add({ kind: "set", name: "cluster-ips", type: "ipv4_addr", comment: "Active ClusterIPs" });
  tx.add({
    kind: "rule",
    chain: "cluster-ips-check",
    rule: "ip daddr @cluster-ips reject",
    comment: "Reject traffic to invalid ports of ClusterIPs",
  });
  tx.add({
    kind: "rule",
    chain: "cluster-ips-check",
    rule: "ip daddr { 172.30.0.0/16 } drop",
    comment: "Drop traffic to unallocated ClusterIPs",
  });
  tx.add({
    kind: "set",
    name: "nodeport-ips",
    type: "ipv4_addr",
    comment: "IPs that accept NodePort traffic",
  });
  tx.flush({ kind: "set", name: "nodeport-ips" });
  tx.add({ kind: "element", set: "nodeport-ips", key: ["192.168.0.2"] });
  tx.add({
    kind: "map",
    name: "no-endpoint-services",
    type: "ipv4_addr . inet_proto . inet_service : verdict",
    comment: "vmap to drop or reject packets to services with no endpoints",
  });
  tx.add({
    kind: "map",
    name: "no-endpoint-nodeports",
    type: "inet_proto . inet_service : verdict",
    comment: "vmap to drop or reject packets to service nodeports with no endpoints",
  });
  tx.add({
    kind: "chain",
    name: "reject-chain",
    comment: "helper for @no-endpoint-services / @no-endpoint-nodeports",
  });
  tx.flush({ kind: "chain", name: "reject-chain" });
  tx.add({ kind: "rule", chain: "reject-chain", rule: "reject" });
  tx.add({
    kind: "rule",
    chain: "service-endpoints-check",
    rule: "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
  });
  tx.add({
    kind: "rule",
    chain: "nodeport-endpoints-check",
    rule: "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports",
  });
  tx.add({
    kind: "map",
    name: "firewall-ips",
    type: "ipv4_addr . inet_proto . inet_service : verdict",
    comment: "destinations that are subject to LoadBalancerSourceRanges",
  });
  ensure("firewall-check");
  tx.add({
    kind: "rule",
    chain: "firewall-check",
    rule: "ip daddr . meta l4proto . th dport vmap @firewall-ips",
  });
  tx.add({
    kind: "map",
    name: "service-ips",
    type: "ipv4_addr . inet_proto . inet_service : verdict",
    comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic",
  });
  tx.add({
    kind: "map",
    name: "service-nodeports",
    type: "inet_proto . inet_service : verdict",
    comment: "NodePort traffic",
  });
  tx.add({
    kind: "rule",
    chain: "services",
    rule: `ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or ${M}`,
    comment: "masquerade clusterIP traffic from outside cluster",
  });
  tx.add({ kind: "rule", chain: "services", rule: "ip daddr . meta l4proto . th dport vmap @service-ips" });
  tx.add({
    kind: "rule",
    chain: "services",
    rule: "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
  });
}

/** The rules of one endpoint chain (v1.37: only with session affinity). */
function endpoint(tx: Transaction, chain: string, ip: string, port: number, proto: string) {
  tx.add({ kind: "chain", name: chain });
  tx.flush({ kind: "chain", name: chain });
  tx.add({ kind: "rule", chain, rule: `update @${AFF(chain)} { ip saddr }` });
  tx.add({ kind: "rule", chain, rule: `meta l4proto ${proto} dnat to ${ip}:${port}` });
}

/** A service chain balancing over endpoint chains, affinity rules first. */
function stickyService(tx: Transaction, chain: string, eps: string[]) {
  tx.add({ kind: "chain", name: chain });
  tx.flush({ kind: "chain", name: chain });
  for (const ep of eps) tx.add({ kind: "rule", chain, rule: `ip saddr @${AFF(ep)} goto ${ep}` });
  const vmap = eps.map((ep, i) => `${i} : goto ${ep}`).join(" , ");
  tx.add({ kind: "rule", chain, rule: `numgen random mod ${eps.length} vmap { ${vmap} }` });
}

/** A service chain DNATing itself: one endpoint directly, more through a numgen map of address . port. */
function service(tx: Transaction, chain: string, proto: string, eps: [string, number][]) {
  tx.add({ kind: "chain", name: chain });
  tx.flush({ kind: "chain", name: chain });
  const rule = eps.length === 1
    ? `meta l4proto ${proto} dnat to ${eps[0][0]}:${eps[0][1]}`
    : `meta l4proto ${proto} dnat ip addr . port to numgen random mod ${eps.length} map { ${
      eps.map(([ip, port], i) => `${i} : ${ip} . ${port}`).join(" , ")
    } }`;
  tx.add({ kind: "rule", chain, rule });
}

/** An endpoint on this node in the hairpin set. */
function hairpin(tx: Transaction, ip: string, proto: string, port: number) {
  tx.add({ kind: "element", set: "hairpin-connections", key: [ip, ip, proto, String(port)] });
}

function affinitySet(tx: Transaction, ep: string, seconds: number) {
  tx.add({ kind: "set", name: AFF(ep), type: "ipv4_addr", flags: ["dynamic", "timeout"], timeout: seconds });
}

/** First full sync: four services (affinity, no endpoints, NodePort, LoadBalancer with source ranges). */
function fullSync(tx: Transaction) {
  setup(tx, true);
  for (const ip of ["172.30.0.41", "172.30.0.42", "172.30.0.43", "172.30.0.44"]) {
    tx.add({ kind: "element", set: "cluster-ips", key: [ip] });
  }
  // ns1/svc1: ClusterIP, ClientIP affinity, two endpoints.
  affinitySet(tx, EP1, 10800);
  affinitySet(tx, EP2, 10800);
  endpoint(tx, EP1, "10.180.0.1", 80, "tcp");
  endpoint(tx, EP2, "10.180.0.2", 80, "tcp");
  stickyService(tx, SVC1, [EP1, EP2]);
  hairpin(tx, "10.180.0.1", "tcp", 80);
  tx.add({ kind: "element", map: "service-ips", key: ["172.30.0.41", "tcp", "80"], value: [`goto ${SVC1}`] });
  // ns2/svc2: UDP, no endpoints yet.
  tx.add({
    kind: "element",
    map: "no-endpoint-services",
    key: ["172.30.0.42", "udp", "53"],
    value: ["goto reject-chain"],
    comment: "ns2/svc2:p53",
  });
  // ns3/svc3: NodePort 30080.
  service(tx, SVC3, "tcp", [["10.180.0.31", 80], ["10.180.0.32", 8080]]);
  hairpin(tx, "10.180.0.32", "tcp", 8080);
  tx.add({ kind: "chain", name: EXT3 });
  tx.flush({ kind: "chain", name: EXT3 });
  tx.add({ kind: "rule", chain: EXT3, rule: `mark set mark or ${M}`, comment: "masquerade" });
  tx.add({ kind: "rule", chain: EXT3, rule: `goto ${SVC3}` });
  tx.add({ kind: "element", map: "service-ips", key: ["172.30.0.43", "tcp", "80"], value: [`goto ${SVC3}`] });
  tx.add({ kind: "element", map: "service-nodeports", key: ["tcp", "30080"], value: [`goto ${EXT3}`] });
  // ns4/svc4: LoadBalancer 5.6.7.8 with source ranges.
  service(tx, SVC4, "tcp", [["10.180.0.41", 80]]);
  tx.add({ kind: "chain", name: FW4 });
  tx.flush({ kind: "chain", name: FW4 });
  tx.add({ kind: "rule", chain: FW4, rule: "ip saddr != { 203.0.113.0/25, 192.168.0.0/16 } drop" });
  tx.add({ kind: "element", map: "service-ips", key: ["172.30.0.44", "tcp", "80"], value: [`goto ${SVC4}`] });
  tx.add({ kind: "element", map: "service-ips", key: ["5.6.7.8", "tcp", "80"], value: [`goto ${SVC4}`] });
  tx.add({ kind: "element", map: "firewall-ips", key: ["5.6.7.8", "tcp", "80"], value: [`goto ${FW4}`] });
  // Not used by kube-proxy, but part of the brief: an interval set with prefixes and ranges.
  tx.add({ kind: "set", name: "ranges", type: "ipv4_addr", flags: ["interval"], comment: "test" });
  for (const k of ["10.0.0.0/8", "192.168.1.1-192.168.1.5", "172.16.0.0-172.16.255.255", "1.2.3.4/32"]) {
    tx.add({ kind: "element", set: "ranges", key: [k] });
  }
}

privilegedTest(unavailable, {
  name: "kernel: the fake lists the same table as nft after each kube-proxy-like transaction (ip)",
  fn: () =>
    withNetns(async (runner) => {
      const p = new Pair(runner, "ip");
      await p.apply("first full sync", fullSync);

      await p.apply("second full sync re-adds everything (no-ops and flushes)", (tx) => {
        setup(tx, false);
        affinitySet(tx, EP1, 10800);
        affinitySet(tx, EP2, 10800);
        endpoint(tx, EP1, "10.180.0.1", 80, "tcp");
        endpoint(tx, EP2, "10.180.0.2", 80, "tcp");
        stickyService(tx, SVC1, [EP1, EP2]);
        hairpin(tx, "10.180.0.1", "tcp", 80); // present already: no-op
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["172.30.0.41", "tcp", "80"],
          value: [`goto ${SVC1}`],
        });
      });

      await p.apply("partial sync: endpoints change, svc2 gets one, svc3 element changes value", (tx) => {
        affinitySet(tx, EP3, 10800);
        endpoint(tx, EP3, "10.180.0.3", 80, "tcp");
        stickyService(tx, SVC1, [EP2, EP3]);
        tx.flush({ kind: "chain", name: EP1 }); // stale: flushed now, deleted later
        tx.delete({ kind: "set", name: AFF(EP1) }); // stale affinity sets go at once
        tx.delete({
          kind: "element",
          set: "hairpin-connections",
          key: ["10.180.0.1", "10.180.0.1", "tcp", "80"],
        });
        tx.delete({ kind: "element", map: "no-endpoint-services", key: ["172.30.0.42", "udp", "53"] });
        service(tx, SVC2, "udp", [["10.180.0.21", 53], ["10.180.0.22", 53], ["10.180.0.23", 5353]]);
        hairpin(tx, "10.180.0.21", "udp", 53);
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["172.30.0.42", "udp", "53"],
          value: [`goto ${SVC2}`],
        });
        tx.delete({ kind: "element", map: "service-ips", key: ["172.30.0.43", "tcp", "80"] });
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["172.30.0.43", "tcp", "80"],
          value: [`goto ${EXT3}`],
        });
        tx.add({ kind: "element", set: "ranges", key: ["10.0.0.0/8"] }); // identical: no-op
      });

      await p.apply("stale chain deleted on a later sync", (tx) => tx.delete({ kind: "chain", name: EP1 }));

      await p.fails("delete a chain a map element goes to", "EBUSY", (tx) =>
        tx.delete({ kind: "chain", name: EXT3 }));
      await p.fails("delete a chain a rule jumps to", "EBUSY", (tx) => {
        tx.add({ kind: "element", set: "cluster-ips", key: ["172.30.0.99"] });
        tx.delete({ kind: "chain", name: "masquerading" });
      });
      await p.fails("delete a set a rule uses (hairpin)", "EBUSY", (tx) =>
        tx.delete({ kind: "set", name: "hairpin-connections" }));
      await p.fails("delete a set a rule uses", "EBUSY", (tx) =>
        tx.delete({ kind: "set", name: AFF(EP2) }));
      await p.fails("delete a map a rule uses", "EBUSY", (tx) =>
        tx.delete({ kind: "map", name: "service-ips" }));
      await p.fails("jump to a missing chain", "ENOENT", (tx) => {
        tx.add({ kind: "chain", name: "new-chain" });
        tx.add({ kind: "rule", chain: "new-chain", rule: "jump no-such-chain" });
      });
      await p.fails("goto a missing chain inside a vmap", "ENOENT", (tx) =>
        tx.add({
          kind: "rule",
          chain: SVC3,
          rule: "numgen random mod 2 vmap { 0 : goto no-such , 1 : drop }",
        }));
      await p.fails("rule using a missing set", "ENOENT", (tx) =>
        tx.add({ kind: "rule", chain: SVC3, rule: "ip saddr @no-such-set drop" }));
      await p.fails("rule using a missing map", "ENOENT", (tx) =>
        tx.add({ kind: "rule", chain: SVC3, rule: "ip daddr . meta l4proto . th dport vmap @no-such-map" }));
      await p.fails("vmap of a set that is not a map", undefined, (tx) =>
        tx.add({ kind: "rule", chain: SVC3, rule: "ip daddr vmap @cluster-ips" }));
      await p.fails("rule in a missing chain", "ENOENT", (tx) =>
        tx.add({ kind: "rule", chain: "no-such-chain", rule: "accept" }));
      await p.fails("map element going to a missing chain", "ENOENT", (tx) =>
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["172.30.0.50", "tcp", "80"],
          value: ["goto no-such"],
        }));
      await p.fails("delete a missing chain", "ENOENT", (tx) =>
        tx.delete({ kind: "chain", name: EP1 }));
      await p.fails("delete a missing element", "ENOENT", (tx) =>
        tx.delete({ kind: "element", set: "cluster-ips", key: ["172.30.0.99"] }));
      await p.fails("delete a missing set", "ENOENT", (tx) =>
        tx.delete({ kind: "set", name: AFF(EP1) }));
      await p.fails("flush a missing map", "ENOENT", (tx) =>
        tx.flush({ kind: "map", name: "no-such-map" }));
      await p.fails("create an existing chain", "EEXIST", (tx) =>
        tx.create({ kind: "chain", name: SVC1 }));
      await p.fails("create an existing element", "EEXIST", (tx) =>
        tx.create({ kind: "element", set: "cluster-ips", key: ["172.30.0.41"] }));
      await p.fails("add a map element with another value", "EEXIST", (tx) =>
        tx.add({ kind: "element", map: "service-ips", key: ["172.30.0.41", "tcp", "80"], value: ["drop"] }));
      await p.fails("re-add a set with other flags", "EEXIST", (tx) =>
        tx.add({ kind: "set", name: "cluster-ips", type: "ipv4_addr", flags: ["interval"] }));
      await p.fails("re-add a regular chain as a base chain", "EEXIST", (tx) =>
        tx.add({ kind: "chain", name: "services", type: "filter", hook: "input", priority: 0 }));
      await p.fails("re-add a base chain with another priority", undefined, (tx) =>
        tx.add({ kind: "chain", name: "nat-output", type: "nat", hook: "output", priority: -90 }));
      await p.fails("element timeout in a set without the flag", undefined, (tx) =>
        tx.add({ kind: "element", set: "cluster-ips", key: ["172.30.0.98"], timeout: 5 }));
      await p.fails("overlapping interval", undefined, (tx) =>
        tx.add({ kind: "element", set: "ranges", key: ["10.1.0.0/16"] }));
      await p.fails("rule handle that does not exist", "ENOENT", (tx) =>
        tx.delete({ kind: "rule", chain: SVC1, handle: 99999 }));
      await p.fails("rule index out of range", "ENOENT", (tx) =>
        tx.add({ kind: "rule", chain: SVC1, rule: "accept", index: 50 }));

      await p.apply("a map used as a set lookup", (tx) => {
        tx.add({ kind: "chain", name: "lookups" });
        tx.add({
          kind: "rule",
          chain: "lookups",
          rule: "ip daddr . meta l4proto . th dport @service-ips accept",
        });
      });
      await p.apply("rules by index and handle", (tx) => {
        tx.add({ kind: "chain", name: "positions" });
        tx.add({ kind: "rule", chain: "positions", rule: "accept" });
        tx.add({ kind: "rule", chain: "positions", rule: "drop" });
        tx.add({ kind: "rule", chain: "positions", rule: "counter", index: 0 });
        tx.insert({ kind: "rule", chain: "positions", rule: "return", index: 1 });
        tx.insert({ kind: "rule", chain: "positions", rule: "jump reject-chain", comment: "first" });
      });
      await p.apply("replace, add after and delete by handle", (tx, handles) => {
        const h = handles("positions"); // jump reject-chain, counter, return, accept, drop
        tx.replace({ kind: "rule", chain: "positions", rule: "jump firewall-check", handle: h[3] });
        tx.add({ kind: "rule", chain: "positions", rule: "reject", handle: h[1] });
        tx.insert({ kind: "rule", chain: "positions", rule: "accept", handle: h[4], comment: "before drop" });
        tx.delete({ kind: "rule", chain: "positions", handle: h[0] });
      }, ["positions"]);
      await p.fails("delete a chain after replacing a rule that referenced it", "EBUSY", (tx) =>
        tx.delete({ kind: "chain", name: "firewall-check" }));
      await p.apply("a chain can go once the rule jumping to it is deleted", (tx) => {
        tx.delete({ kind: "chain", name: "reject-chain" });
      });

      await p.apply("affinity set re-added with a new timeout (kernel 6.18 updates it)", (tx) => {
        affinitySet(tx, EP2, 600);
      });
      await p.apply("named counter used by a rule", (tx) => {
        tx.add({ kind: "counter", name: "packets-seen", comment: "counted" });
        tx.add({ kind: "rule", chain: "positions", rule: "counter name packets-seen" });
      });
      await p.apply("flush a map, a set and the table", (tx) => {
        tx.flush({ kind: "map", name: "firewall-ips" });
        tx.flush({ kind: "set", name: "nodeport-ips" });
        tx.flush({ kind: "table" });
      });

      const [realAll, fakeAll] = [await p.real.listAll(), await p.fake.listAll()];
      assert.deepEqual(fakeAll, realAll);
      for (
        const [type, name] of [["map", "service-ips"], ["set", "cluster-ips"], ["set", "ranges"]] as const
      ) {
        const sort = (l: { key: readonly string[] }[]) =>
          l.map((e) =>
            JSON.stringify(e)
          ).sort();
        assert.deepEqual(
          sort(await p.fake.listElements(type, name)),
          sort(await p.real.listElements(type, name)),
          `${type} ${name}`,
        );
      }
      assert.equal(await p.real.tableExists(), true);
      assert.equal(await p.real.deleteTable(), true);
      assert.equal(await p.fake.deleteTable(), true);
      assert.equal(await p.real.deleteTable(), false);
      assert.equal(await p.real.tableExists(), false);
      assert.equal(await p.listing(), "");
      assert.equal(p.fake.dump(), "");
    }),
});

privilegedTest(unavailable, {
  name: "kernel: the fake lists the same table as nft for IPv6 sets, maps and rules (ip6)",
  fn: () =>
    withNetns(async (runner) => {
      const p = new Pair(runner, "ip6");
      await p.apply("ip6 table", (tx) => {
        tx.add({ kind: "table", comment: "rules for kube-proxy" });
        tx.add({ kind: "chain", name: "nat-output", type: "nat", hook: "output", priority: "dstnat" });
        tx.add({
          kind: "chain",
          name: "filter-forward",
          type: "filter",
          hook: "forward",
          priority: "filter - 10",
        });
        tx.add({ kind: "chain", name: "services" });
        tx.add({ kind: "chain", name: "cluster-ips-check" });
        tx.add({ kind: "chain", name: "svc" });
        tx.add({ kind: "chain", name: "ep" });
        tx.add({ kind: "rule", chain: "nat-output", rule: "jump services" });
        tx.add({ kind: "rule", chain: "filter-forward", rule: "ct state new jump cluster-ips-check" });
        tx.add({ kind: "set", name: "cluster-ips", type: "ipv6_addr", comment: "Active ClusterIPs" });
        tx.add({ kind: "set", name: "src", typeof: "ip6 saddr", flags: ["interval"], autoMerge: true });
        tx.add({ kind: "map", name: "service-ips", type: "ipv6_addr . inet_proto . inet_service : verdict" });
        tx.add({ kind: "set", name: "aff", type: "ipv6_addr", flags: ["dynamic", "timeout"], timeout: 300 });
        tx.add({
          kind: "rule",
          chain: "services",
          rule: "ip6 daddr . meta l4proto . th dport vmap @service-ips",
        });
        tx.add({ kind: "rule", chain: "cluster-ips-check", rule: "ip6 daddr @cluster-ips reject" });
        tx.add({ kind: "rule", chain: "cluster-ips-check", rule: "ip6 daddr { fd00:10:96::/112 } drop" });
        tx.add({ kind: "rule", chain: "ep", rule: "ip6 saddr fd00:10:180::1 jump svc" });
        tx.add({ kind: "rule", chain: "ep", rule: "update @aff { ip6 saddr }" });
        tx.add({ kind: "rule", chain: "ep", rule: "meta l4proto tcp dnat to [fd00:10:180:0::1]:80" });
        tx.add({ kind: "rule", chain: "svc", rule: "ip6 daddr != ::1 return" });
        tx.add({ kind: "rule", chain: "svc", rule: "ip6 saddr != { 2001:db8::/32, fd00::1 } drop" });
        tx.add({
          kind: "rule",
          chain: "svc",
          rule:
            "meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 1 : fd00:10:180:0::2 . 8080 , 0 : fd00:10:180::1 . 80 }",
        });
        tx.add({
          kind: "set",
          name: "hairpin-connections",
          type: "ipv6_addr . ipv6_addr . inet_proto . inet_service",
          comment: "service hairpin connections",
        });
        tx.add({ kind: "element", set: "hairpin-connections", key: ["fd00::1", "fd00:0::1", "tcp", "80"] });
        tx.add({ kind: "chain", name: "masquerading" });
        tx.add({
          kind: "rule",
          chain: "masquerading",
          rule:
            "ct status dnat ip6 saddr . ip6 daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
        });
        for (const ip of ["fd00:10:96::1", "fd00:10:96::a", "fd00:10:96:0:0::b", "fd00:10:96::c"]) {
          tx.add({ kind: "element", set: "cluster-ips", key: [ip] });
        }
        for (const k of ["2001:db8::/33", "2001:db8:8000::/33", "fd00::5-fd00::9", "fd00::1"]) {
          tx.add({ kind: "element", set: "src", key: [k] });
        }
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["fd00:10:96::1", "tcp", "80"],
          value: ["goto ep"],
        });
        tx.add({
          kind: "element",
          map: "service-ips",
          key: ["fd00:10:96::a", "udp", "53"],
          value: ["drop"],
          comment: "ns/svc:dns",
        });
        tx.add({ kind: "element", set: "aff", key: ["fd00::7"], timeout: 30 });
      });
      await p.apply("delete elements and a chain", (tx) => {
        tx.delete({ kind: "element", set: "cluster-ips", key: ["fd00:10:96::b"] });
        tx.delete({ kind: "element", map: "service-ips", key: ["fd00:10:96::1", "tcp", "80"] });
        tx.flush({ kind: "chain", name: "ep" });
        tx.delete({ kind: "chain", name: "ep" });
      });
      await p.fails("IPv4 address in an IPv6 set", undefined, (tx) =>
        tx.add({ kind: "element", set: "cluster-ips", key: ["10.0.0.1"] }));
    }),
});

privilegedTest(unavailable, {
  name: "kernel: a streamed transaction (runOperations) applies as one; a producer failing after megabytes " +
    "were sent, or a line nft rejects, applies nothing",
  fn: () =>
    withNetns(async (runner) => {
      const nft = new NftablesRunner({ family: "ip", table: "kube-proxy", runner });
      const listing = async () =>
        (await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] })).stdout;
      const chain = (i: number) => `endpoint-${String(i).padStart(6, "0")}-${"x".repeat(100)}`;
      function* ops(n: number, tail?: () => Iterable<Operation>): Generator<Operation> {
        for (let i = 0; i < n; i++) {
          yield { verb: "add", obj: { kind: "chain", name: chain(i) } };
          yield {
            verb: "add",
            obj: {
              kind: "rule",
              chain: chain(i),
              rule: `meta l4proto tcp dnat to 10.0.${i >> 8 & 255}.${i & 255}:80`,
            },
          };
        }
        if (tail) yield* tail();
      }
      await nft.runOperations([{ verb: "add", obj: { kind: "table", comment: "rules for kube-proxy" } }]);
      const before = await listing();
      // ~4 MiB of input, then the producer fails: nft is killed before its stdin ends, nothing is applied.
      const boom = new Error("producer failed");
      const err = await nft.runOperations(ops(20_000, () => {
        throw boom;
      })).catch((e) => e);
      assert.equal(err, boom);
      assert.equal(await listing(), before, "nothing of the failed stream was applied");
      // A line the kernel rejects at the end of a long stream: the whole transaction is rejected.
      const rejected = await nft.runOperations(ops(5_000, function* () {
        yield { verb: "add", obj: { kind: "rule", chain: "nope", rule: "accept" } };
      })).catch((e) => e);
      assert.ok(rejected instanceof NftablesError && rejected.code === "ENOENT", String(rejected));
      assert.equal(rejected.inputLine, "add rule ip kube-proxy nope accept");
      assert.equal(await listing(), before);
      // The same stream without the bad line: every chain is there.
      const bytes = await nft.runOperations(ops(5_000));
      assert.ok(bytes > 1_000_000, `${bytes} bytes`);
      const chains = await nft.list("chain");
      assert.equal(chains.length, 5_000);
      assert.equal(chains.at(-1), chain(4_999));
    }),
});
