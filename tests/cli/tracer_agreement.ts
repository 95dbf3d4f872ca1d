/**
 * The check that ties `explain` to the rules in the iptables and ipvs modes: the packet tracer, walking the
 * rules (and in the ipvs mode the ipsets and virtual servers) render prints, ends where explain says.
 */
import assert from "node:assert/strict";
import type { FirstSync } from "../../lib/cli/engine.ts";
import type { Explanation, PacketOrigin } from "../../lib/cli/explain.ts";
import { parsePacket } from "../../lib/cli/explain.ts";
import { formatTrace, renderedIptables, tracePacket } from "../../lib/cli/explain_trace.ts";
import { renderedIpvs, traceIpvs } from "../../lib/cli/explain_trace_ipvs.ts";
import {
  applyNftTransaction,
  formatNftTrace,
  type NftTrace,
  traceNftables,
} from "../../lib/cli/explain_trace_nftables.ts";
import { type Trace, traceIptables } from "../../lib/dataplane/iptables/trace.ts";

/** A packet as explain's flags give it. */
export interface TracedPacket {
  readonly src: string;
  readonly dst: string;
  readonly from: PacketOrigin;
  readonly protocol?: string;
}

/**
 * Asserts that the tracer over the rendered rules gives explain's verdict, the same endpoints with the same
 * shares, and masquerading where explain says (the source's own endpoint always: hairpin).
 */
export function assertTracerAgrees(
  sync: FirstSync,
  c: TracedPacket,
  e: Explanation,
  what: string,
  mode: "iptables" | "nftables" | "ipvs" = "iptables",
): void {
  const packet = parsePacket({
    source: c.src,
    destination: c.dst,
    protocol: c.protocol ?? "tcp",
    from: c.from,
    inInterface: "",
  });
  const nodeIPs = sync.nodeIPs.filter((ip) => (ip.includes(":") ? "IPv6" : "IPv4") === packet.family);
  const tp = tracePacket(packet, c.src, c.from, nodeIPs);
  const nft = () =>
    applyNftTransaction(
      sync.commands.filter((x) => x.cmd === "nft" && x.family === packet.family).map((x) => x.stdin).join(
        "\n",
      ),
    );
  const t: Trace | NftTrace = mode === "ipvs"
    ? traceIpvs(renderedIpvs(sync, packet.family), tp)
    : mode === "nftables"
    ? traceNftables(nft(), tp)
    : traceIptables(renderedIptables(sync, packet.family), tp);
  const text = mode === "nftables" ? formatNftTrace(t as NftTrace) : formatTrace(t as Trace);
  const msg = `${what}\ntracer:\n${text.join("\n")}`;
  if (e.verdict.kind !== "dnat") {
    assert.deepEqual(t.outcomes.map((o) => o.verdict), [e.verdict.kind], msg);
    return;
  }
  assert.ok(t.outcomes.every((o) => o.verdict === "dnat"), msg);
  assert.deepEqual(t.outcomes.map((o) => o.endpoint).sort(), e.endpoints.map((x) => x.endpoint).sort(), msg);
  for (const x of e.endpoints) {
    const o = t.outcomes.find((o) => o.endpoint === x.endpoint)!;
    if (x.probability !== null) assert.ok(Math.abs(o.probability - x.probability) < 1e-6, msg);
    assert.equal(o.masqueraded, e.masquerade!.masqueraded || x.hairpin, msg);
  }
}
