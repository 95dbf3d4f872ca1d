/**
 * `explain` over the rules themselves (iptables mode): the rules a first sync would write, or the rules
 * `iptables-save` reads from this node's kernel (`explain --live`), loaded into the iptables model and walked
 * by the packet tracer; and where the two differ on the packet's path (drift: a rule removed by hand, another
 * tool's rule in the way).
 * @module
 */
import { detectIptablesBackend, iptablesTools } from "../dataplane/iptables_backend.ts";
import { IptablesTables, isBuiltinChain } from "../dataplane/iptables/model.ts";
import type { CommandRunner } from "../exec.ts";
import {
  formatStep,
  type Trace,
  type Traced,
  traceIptables,
  type TracePacket,
} from "../dataplane/iptables/trace.ts";
import type { IPFamily } from "../net/ip.ts";
import type { FirstSync } from "./engine.ts";
import type { PacketSpec } from "./explain.ts";
import { diffLines, type DriftLine, formatDrift } from "./explain_drift.ts";

/** The iptables rules of `family` a first sync writes, applied to empty tables. */
export function renderedIptables(sync: FirstSync, family: IPFamily): IptablesTables {
  const t = new IptablesTables();
  for (const c of sync.commands) {
    if (c.family === family && /tables(-nft|-legacy)?-restore$/.test(c.cmd)) t.restore(c.stdin);
  }
  return t;
}

/**
 * Reads this node's rules of `family` as the agent's backend sees them (`iptables-nft-save` or
 * `iptables-legacy-save`, chosen as the agent chooses) into the iptables model.
 * @throws {Error} When the save program fails.
 */
export async function readLiveIptables(
  runner: CommandRunner,
  family: IPFamily,
): Promise<{ tables: IptablesTables; source: string }> {
  const { backend } = await detectIptablesBackend(runner);
  const save = iptablesTools(backend, family).save;
  const out = await runner.run({ cmd: save, args: [], timeoutMs: 60_000 });
  return { tables: IptablesTables.parse(out.stdout), source: save };
}

/** The packet as the tracer takes it; `src` is the source explain decided on (a node IP when not given). */
export function tracePacket(
  packet: PacketSpec,
  src: string,
  from: "pod" | "node" | "outside",
  nodeIPs: readonly string[],
): TracePacket {
  return {
    family: packet.family,
    src,
    dst: packet.destination,
    protocol: packet.protocol.toLowerCase() as TracePacket["protocol"],
    dport: packet.port,
    from,
    inInterface: packet.inInterface,
    localAddresses: nodeIPs,
  };
}

/** The live trace, the trace of what the agent would write now, and the drift on either path. */
export interface LiveComparison {
  readonly live: Trace;
  readonly rendered: Trace;
  readonly drift: readonly DriftLine[];
  /** Whether both traces end the same (same verdicts, endpoints and shares). */
  readonly sameOutcome: boolean;
}

/** Traces `p` through the kernel's rules and the rendered ones and compares the chains either path visits. */
export function compareLive(live: IptablesTables, rendered: IptablesTables, p: TracePacket): LiveComparison {
  const liveTrace = traceIptables(live, p);
  const renderedTrace = traceIptables(rendered, p);
  const chains = new Set<string>();
  for (const t of [liveTrace, renderedTrace]) {
    for (const o of t.outcomes) {
      for (const s of o.steps) {
        chains.add(`${s.table} ${s.chain}`);
        if (s.rule.target !== null && rendered.chain(s.table, s.rule.target)) {
          chains.add(`${s.table} ${s.rule.target}`);
        }
      }
    }
  }
  const drift: DriftLine[] = [];
  for (const tc of [...chains].sort()) {
    const [table, chain] = tc.split(" ");
    const want = rendered.chain(table, chain)?.rules ?? [];
    const have = live.chain(table, chain)?.rules ?? [];
    // Other tools' rules in built-in chains are expected there; they count only when the packet matched them.
    const builtin = isBuiltinChain(table, chain);
    diffLines(
      `${table} ${chain}`,
      want,
      have,
      drift,
      (r) => r.text,
      (r) => r.key,
      (r) => !builtin || onPath(liveTrace, table, chain, r.text),
    );
  }
  return {
    live: liveTrace,
    rendered: renderedTrace,
    drift,
    sameOutcome: sameOutcome(liveTrace, renderedTrace),
  };
}

function onPath(t: Trace, table: string, chain: string, text: string): boolean {
  return t.outcomes.some((o) =>
    o.steps.some((s) => s.table === table && s.chain === chain && s.rule.text === text)
  );
}

function outcomeKey(t: Trace): string {
  return t.outcomes
    .map((o) => `${o.verdict} ${o.endpoint} ${o.masqueraded} ${o.probability.toFixed(4)}`)
    .sort()
    .join("; ");
}

/** Whether two traces end the same (same verdicts, endpoints, masquerading and shares). */
export function sameOutcome(a: Trace, b: Trace): boolean {
  return outcomeKey(a) === outcomeKey(b);
}

function percent(p: number): string {
  const v = p * 100;
  return Number.isInteger(v) ? `${v}%` : `${v.toFixed(1)}%`;
}

/** One trace as text: each outcome with its share and the rules it matched. */
export function formatTrace(t: Trace, indent = "  "): string[] {
  return formatOutcomes(t, formatStep, indent);
}

/** Any mode's trace as text, each matched step printed by `step`. */
export function formatOutcomes<S>(t: Traced<S>, step: (s: S) => string, indent = "  "): string[] {
  const out: string[] = [];
  for (const o of t.outcomes) {
    const what = o.verdict === "dnat"
      ? `DNAT to ${o.endpoint}${o.masqueraded ? ", masqueraded" : ""}`
      : o.verdict === "untouched"
      ? "not handled by kube-proxy (no rule took it)"
      : o.verdict === "reject"
      ? "rejected"
      : "dropped";
    out.push(`${indent}${percent(o.probability)}: ${what}`);
    for (const s of o.steps) out.push(`${indent}    ${step(s)}`);
  }
  for (const a of t.assumptions) out.push(`${indent}Assumed: ${a}`);
  return out;
}

/** The live comparison as text for a terminal. */
export function formatLive(c: LiveComparison, source: string): string {
  const lines = [`Live:       the kernel's rules (${source}) take this packet to:`];
  lines.push(...formatTrace(c.live));
  if (c.drift.length > 0 || c.sameOutcome) lines.push(...formatDrift(c.drift));
  else {lines.push(
      "Drift:      the kernel's rules take it elsewhere than the agent's would, off the chains compared:",
    );}
  if (!c.sameOutcome) {
    lines.push("  the agent's rules would take it to:");
    lines.push(...formatTrace(c.rendered, "    "));
  }
  return lines.join("\n") + "\n";
}
