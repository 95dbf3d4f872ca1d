/**
 * The nftables mode's packet tracer: the agent's transaction applied to the table model and walked hook by
 * hook; the outcome follows the table (an element or rule removed changes where the packet goes), and what it
 * cannot read is said; the table as the kernel lists it traces as the transaction written.
 */
import assert from "node:assert/strict";
import {
  applyNftTransaction,
  formatNftTrace,
  type NftTable,
  sameNftOutcome,
  tableFromListing,
  traceNftables,
} from "../../lib/cli/explain_trace_nftables.ts";
import { parseNftListing } from "../../lib/dataplane/nftables/listing.ts";
import type { TracePacket } from "../../lib/dataplane/iptables/trace.ts";
import { configureLogging } from "../../lib/log.ts";
import { netnsUnavailableReason, withNetns } from "../../testkit/netns.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import {
  ALLOWED_CLIENT,
  CLIENT,
  corpusFirstSync,
  NODE_IP,
  outcomeLines,
  POD,
  SHAPES,
  tcpPacket,
} from "./helpers.ts";

configureLogging({ sink: () => {} });

const sync = await corpusFirstSync("nftables");
const TX = sync.commands.filter((c) => c.cmd === "nft" && c.family === "IPv4").map((c) => c.stdin).join("\n");
const CLUSTER_IP = "10.96.1.1"; // dp/clusterip: endpoints a (this node) and c, 80 → 8080
const LBSR_IP = "172.30.1.4"; // dp/lbsr: source range 203.0.113.0/24, endpoint a

function packet(src: string, from: TracePacket["from"], dst = CLUSTER_IP, dport = 80): TracePacket {
  return tcpPacket(src, from, dst, dport, [NODE_IP]);
}

function summary(t: NftTable, p: TracePacket): string[] {
  return outcomeLines(traceNftables(t, p));
}

Deno.test("nftables tracer: numgen shares, hairpin masquerade, the source-range firewall and a port without a Service", () => {
  const t = applyNftTransaction(TX);
  assert.deepEqual(summary(t, packet(POD.x, "pod")), [`dnat ${POD.a}:8080 0.5`, `dnat ${POD.c}:8080 0.5`]);
  assert.deepEqual(summary(t, packet(POD.a, "pod")), [
    `dnat ${POD.a}:8080 masq 0.5`,
    `dnat ${POD.c}:8080 0.5`,
  ]);
  assert.deepEqual(summary(t, packet(CLIENT, "outside", LBSR_IP)), ["drop 1"]);
  assert.deepEqual(summary(t, packet(ALLOWED_CLIENT, "outside", LBSR_IP)), [`dnat ${POD.a}:8080 masq 1`]);
  const wrongPort = traceNftables(t, packet(POD.x, "pod", CLUSTER_IP, 81));
  assert.deepEqual(wrongPort.outcomes.map((o) => o.verdict), ["reject"]);
  assert.equal(wrongPort.outcomes[0].steps.at(-1)!.chain, "cluster-ips-check");
  assert.deepEqual(wrongPort.assumptions, []);
});

Deno.test("nftables tracer: follows the table: removed elements and chains change the outcome", () => {
  // Without the service-ips element the ClusterIP's port is not a Service port: rejected by cluster-ips-check.
  const noElement = applyNftTransaction(
    `delete element ip kube-proxy service-ips { ${CLUSTER_IP} . tcp . 80 }`,
    applyNftTransaction(TX),
  );
  assert.deepEqual(summary(noElement, packet(POD.x, "pod")), ["reject 1"]);
  // Without the hairpin element the endpoint's own connection keeps its source.
  const noHairpin = applyNftTransaction(
    `delete element ip kube-proxy hairpin-connections { ${POD.a} . ${POD.a} . tcp . 8080 }`,
    applyNftTransaction(TX),
  );
  assert.deepEqual(summary(noHairpin, packet(POD.a, "pod")), [
    `dnat ${POD.a}:8080 0.5`,
    `dnat ${POD.c}:8080 0.5`,
  ]);
  // Without the firewall's rule every client reaches the LoadBalancer IP.
  const open = applyNftTransaction(TX);
  for (const [name, c] of open.chains) {
    if (name.startsWith("firewall-") && name.includes("lbsr")) c.rules = [];
  }
  assert.deepEqual(summary(open, packet(CLIENT, "outside", LBSR_IP)), [`dnat ${POD.a}:8080 masq 1`]);
  // Without the nat hook chain nothing DNATs the packet, and filter-forward's cluster-ips-check rejects it.
  const noNat = applyNftTransaction("delete chain ip kube-proxy nat-prerouting", applyNftTransaction(TX));
  const t = traceNftables(noNat, packet(POD.x, "pod"));
  assert.deepEqual(t.outcomes.map((o) => o.verdict), ["reject"]);
  assert.equal(t.outcomes[0].steps.at(-1)!.chain, "cluster-ips-check");
});

Deno.test("nftables tracer: an expression it does not read is an assumption, and its rule does not match", () => {
  const t = applyNftTransaction(`add table ip t
add chain ip t pre { type nat hook prerouting priority -100 ; }
add rule ip t pre meta skuid 0 dnat to 10.0.0.9:80
add rule ip t pre ip daddr 10.0.0.1 tcp dport 80 dnat to 10.0.0.2:8080`);
  const tr = traceNftables(t, packet(CLIENT, "outside", "10.0.0.1"));
  assert.deepEqual(tr.outcomes.map((o) => `${o.verdict} ${o.endpoint}`), ["dnat 10.0.0.2:8080"]);
  assert.deepEqual(tr.assumptions, [`"meta skuid" is not evaluated: rules with it taken as not matching`]);
});

privilegedTest(netnsUnavailableReason(), {
  name:
    "nftables tracer: the table as the kernel lists it (nft list table) traces as the transaction written",
  fn: () =>
    withNetns(async (runner) => {
      await runner.run({ cmd: "nft", args: ["-f", "-"], stdin: TX });
      const listed = await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] });
      const fromKernel = tableFromListing(parseNftListing(listed.stdout));
      const written = applyNftTransaction(TX);
      let compared = 0;
      for (const src of [POD.x, POD.a, NODE_IP, CLIENT, ALLOWED_CLIENT]) {
        for (const s of SHAPES) {
          const ports = [80, 81, ...(s.svc.ports ?? []).flatMap((p) => [p.port, p.nodePort ?? 80])];
          const dsts = [s.svc.clusterIP!, ...(s.svc.lbIPs ?? []), ...(s.svc.externalIPs ?? []), NODE_IP];
          for (const dst of dsts) {
            for (const dport of ports) {
              for (const protocol of ["tcp", "udp"] as const) {
                const from = src === NODE_IP ? "node" : src.startsWith("10.244.") ? "pod" : "outside";
                const p = { ...packet(src, from, dst, dport), protocol };
                const a = traceNftables(written, p), b = traceNftables(fromKernel, p);
                assert.ok(
                  sameNftOutcome(a, b),
                  `${JSON.stringify(p)}\n${formatNftTrace(a).join("\n")}\nlisted:\n${
                    formatNftTrace(b).join("\n")
                  }`,
                );
                assert.deepEqual([...a.assumptions, ...b.assumptions], [], JSON.stringify(p));
                compared++;
              }
            }
          }
        }
      }
      assert.ok(compared > 500, `${compared} packets compared`);
    }),
});
