/**
 * The ipvs mode's packet tracer: ipset lookups as the kernel builds them, IPVS's pick of real servers, and
 * outcomes that follow the objects (an entry or real server removed changes where the packet goes).
 */
import assert from "node:assert/strict";
import {
  inIpset,
  type IpvsObjects,
  ipvsPick,
  renderedIpvs,
  traceIpvs,
} from "../../lib/cli/explain_trace_ipvs.ts";
import type { KernelVirtualServer } from "../../lib/dataplane/ipvs/ipvsadm.ts";
import type { TracePacket } from "../../lib/dataplane/iptables/trace.ts";
import { configureLogging } from "../../lib/log.ts";
import { CLIENT, corpusFirstSync, NODE_IP, outcomeLines, POD, tcpPacket } from "./helpers.ts";

configureLogging({ sink: () => {} });

const sync = await corpusFirstSync("ipvs");
const CLUSTER_IP = "10.96.1.1"; // dp/clusterip, endpoints a (this node) and c (the other node), port 80 → 8080

function packet(src: string, from: TracePacket["from"], dst = CLUSTER_IP, dport = 80): TracePacket {
  return tcpPacket(src, from, dst, dport, [NODE_IP]);
}

function summary(o: IpvsObjects, p: TracePacket): string[] {
  return outcomeLines(traceIpvs(o, p));
}

/** The rendered objects with maps and sets of their own, to change by hand. */
function objects(): IpvsObjects & {
  sets: Map<string, { type: string; options: string; entries: Set<string> }>;
  virtualServers: Map<string, KernelVirtualServer>;
} {
  const o = renderedIpvs(sync, "IPv4");
  const sets = new Map([...o.sets].map(([k, v]) => [k, { ...v, entries: new Set(v.entries) }]));
  const vss = new Map(
    [...o.virtualServers].map((
      [k, v],
    ) => [k, { def: v.def, reals: new Map(v.reals) } as KernelVirtualServer]),
  );
  return { ...o, sets, virtualServers: vss };
}

Deno.test("ipvs tracer: a ClusterIP goes to each real server in equal shares; the endpoint itself is masqueraded (KUBE-LOOP-BACK)", () => {
  const o = objects();
  assert.deepEqual(summary(o, packet(POD.x, "pod")), [`dnat ${POD.a}:8080 0.5`, `dnat ${POD.c}:8080 0.5`]);
  assert.deepEqual(summary(o, packet(POD.a, "pod")), [
    `dnat ${POD.a}:8080 masq 0.5`,
    `dnat ${POD.c}:8080 0.5`,
  ]);
  // Without the loop-back entry the hairpin connection keeps the pod's own address as its source.
  o.sets.get("KUBE-LOOP-BACK")!.entries.delete(`${POD.a},tcp:8080,${POD.a}`);
  assert.deepEqual(summary(o, packet(POD.a, "pod")), [`dnat ${POD.a}:8080 0.5`, `dnat ${POD.c}:8080 0.5`]);
});

Deno.test("ipvs tracer: follows the objects: no KUBE-CLUSTER-IP entry is rejected by KUBE-IPVS-FILTER, no live real server by IPVS", () => {
  const o = objects();
  o.sets.get("KUBE-CLUSTER-IP")!.entries.delete(`${CLUSTER_IP},tcp:80`);
  const t = traceIpvs(o, packet(CLIENT, "outside"));
  assert.deepEqual(t.outcomes.map((x) => x.verdict), ["reject"]);
  assert.equal(t.outcomes[0].steps.at(-1)!.chain, "KUBE-IPVS-FILTER");

  const o2 = objects();
  const vs = o2.virtualServers.get(`-t ${CLUSTER_IP}:80`)!;
  vs.reals.set(`${POD.a}:8080`, 0); // being drained: no new connections
  assert.deepEqual(summary(o2, packet(POD.x, "pod")), [`dnat ${POD.c}:8080 1`]);
  vs.reals.set(`${POD.c}:8080`, 0);
  assert.deepEqual(summary(o2, packet(POD.x, "pod")), ["reject 1"]);
  o2.virtualServers.delete(`-t ${CLUSTER_IP}:80`);
  // No virtual server: the address is still on kube-ipvs0 and the packet is delivered to the node itself.
  assert.deepEqual(summary(o2, packet(POD.x, "pod")), ["untouched 1"]);
});

Deno.test("ipvs tracer: ipset lookups build the key from the set's type and the match's directions", () => {
  const set = (type: string, ...entries: string[]) => ({ type, options: "", entries: new Set(entries) });
  const pkt = { src: "203.0.113.7", dst: "172.30.1.4", protocol: "tcp", dport: 80 };
  assert.equal(inIpset(set("hash:ip,port", "172.30.1.4,tcp:80"), ["dst", "dst"], pkt), true);
  assert.equal(inIpset(set("hash:ip,port", "172.30.1.4,udp:80"), ["dst", "dst"], pkt), false);
  assert.equal(inIpset(set("hash:ip,port", "203.0.113.7,tcp:80"), ["src", "dst"], pkt), true);
  assert.equal(
    inIpset(set("hash:ip,port,ip", "172.30.1.4,tcp:80,203.0.113.7"), ["dst", "dst", "src"], pkt),
    true,
  );
  const cidr = set("hash:ip,port,net", "172.30.1.4,tcp:80,203.0.113.0/24", "172.30.1.4,tcp:80,198.51.100.9");
  assert.equal(inIpset(cidr, ["dst", "dst", "src"], pkt), true);
  assert.equal(inIpset(cidr, ["dst", "dst", "src"], { ...pkt, src: "198.51.100.9" }), true);
  assert.equal(inIpset(cidr, ["dst", "dst", "src"], { ...pkt, src: "198.51.100.10" }), false);
  assert.equal(inIpset(set("bitmap:port", "30080"), ["dst"], { ...pkt, dport: 30080 }), true);
  assert.equal(inIpset(set("hash:ip", "172.30.1.4"), ["dst"], pkt), true);
  // A source port is not known: a lookup that needs one does not match.
  assert.equal(inIpset(set("hash:ip,port", "172.30.1.4,tcp:80"), ["dst", "src"], pkt), false);
});

Deno.test("ipvs tracer: IPVS shares new connections by weight except with rr, and never to weight 0", () => {
  const vs = (scheduler: string): KernelVirtualServer => ({
    def: { scheduler, persistence: 0, flags: "" },
    reals: new Map([["10.0.0.1:80", 1], ["10.0.0.2:80", 3], ["[fd00::3]:80", 0]]),
  });
  const key = { addr: "10.96.0.1", port: 80 };
  assert.deepEqual((ipvsPick(vs("rr"), key) as { share: number }[]).map((b) => b.share), [0.5, 0.5]);
  assert.deepEqual((ipvsPick(vs("wrr"), key) as { share: number }[]).map((b) => b.share), [0.25, 0.75]);
  assert.equal(ipvsPick(undefined, key), null);
});
