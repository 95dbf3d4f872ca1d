/**
 * The packet's path as `explain` tells it, in every mode taken from the packet tracer over the objects a first
 * sync writes (iptables: the rules; nftables: the table; ipvs: the rules, ipsets, virtual servers and
 * kube-ipvs0 addresses). Nothing here decides what a rule does: each outcome, its share, its masquerading and
 * the rules it matched are the tracer's, and this module only puts the three tracers' steps into one shape
 * (a key to compare steps by, the step as text, which step DNATed, marked or ended the packet).
 * @module
 */
import {
  formatStep,
  type Outcome,
  stepComment,
  type Trace,
  traceIptables,
  type TracePacket,
  type TraceStep,
  type TraceVerdict,
} from "../dataplane/iptables/trace.ts";
import type { IptablesTables } from "../dataplane/iptables/model.ts";
import type { IPFamily } from "../net/ip.ts";
import type { FirstSync } from "./engine.ts";
import { renderedIptables } from "./explain_trace.ts";
import { type IpvsObjects, renderedIpvs, traceIpvs } from "./explain_trace_ipvs.ts";
import { applyNftTransaction, type NftTable, traceNftables } from "./explain_trace_nftables.ts";

/** One matched rule (or the load balancer's pick) as explain prints it. */
export interface PathStep {
  /** Equal keys: the same rule (steps of different outcomes are compared by it). */
  readonly key: string;
  readonly text: string;
  /** Where the rule is (`nat KUBE-SVC-X #2`, `services #3`, the IPVS virtual server). */
  readonly where: string;
  /** The rule's comment, when it has one. */
  readonly comment: string | null;
}

/** One outcome of the walk with the steps that matter to explain picked out. */
export interface PathOutcome {
  readonly verdict: TraceVerdict;
  readonly endpoint: string | null;
  readonly masqueraded: boolean;
  readonly probability: number;
  readonly steps: readonly PathStep[];
  /** Where the DNAT happened: the chain of the DNAT rule, or the IPVS real server. */
  readonly via: string | null;
  /** The first step that marked the packet for masquerading, null when none did. */
  readonly markedBy: PathStep | null;
  /** The step that rejected or dropped it (its last), null for the other verdicts. */
  readonly endedBy: PathStep | null;
}

/** The traced path of one packet in one mode. */
export interface ModePath {
  readonly outcomes: readonly PathOutcome[];
  /** What the tracer could not know and assumed. */
  readonly assumptions: readonly string[];
  /**
   * The objects the path touches (chains visited and jumped to, the sets and maps their rules look up), which
   * `explain --live` compares with the kernel's.
   */
  readonly objects: readonly string[];
  /** Whether the shares are the kernel's (false for IPVS schedulers other than rr, which decide otherwise). */
  readonly sharesExact: boolean;
  /** ipvs: the addresses bound on kube-ipvs0; empty in the other modes. */
  readonly dummyAddresses: readonly string[];
}

/** Traces `packet` through the objects of `family` the first sync `sync` writes in `mode`. */
export function tracePath(
  mode: string,
  sync: FirstSync,
  family: IPFamily,
  packet: TracePacket,
  ipvsScheduler: string,
): ModePath {
  const path = mode === "nftables"
    ? nftablesPath(
      applyNftTransaction(
        sync.commands.filter((c) => c.cmd === "nft" && c.family === family).map((c) => c.stdin).join("\n"),
      ),
      packet,
    )
    : mode === "ipvs"
    ? ipvsPath(renderedIpvs(sync, family), packet, ipvsScheduler)
    : iptablesPath(renderedIptables(sync, family), packet);
  // Shares equal up to rounding (1/3 as 0.5 of 2/3) sort by endpoint, so that equal ways list in one order.
  const outcomes = [...path.outcomes].sort((a, b) =>
    Math.abs(a.probability - b.probability) > 1e-9
      ? b.probability - a.probability
      : String(a.endpoint).localeCompare(String(b.endpoint), "en", { numeric: true })
  );
  return { ...path, outcomes };
}

function ipvsPath(objects: IpvsObjects, packet: TracePacket, scheduler: string): ModePath {
  return {
    ...iptablesWalk(traceIpvs(objects, packet), objects.iptables),
    sharesExact: (scheduler || "rr") === "rr",
    dummyAddresses: objects.dummyAddresses,
  };
}

function iptablesPath(tables: IptablesTables, packet: TracePacket): ModePath {
  return iptablesWalk(traceIptables(tables, packet), tables);
}

function iptablesStep(s: TraceStep): PathStep {
  const where = `${s.table} ${s.chain} #${s.index}`;
  return { key: where, text: formatStep(s), where, comment: stepComment(s) ?? null };
}

function iptablesWalk(t: Trace, tables: IptablesTables): ModePath {
  const objects = new Set<string>();
  const outcomes = t.outcomes.map((o: Outcome<TraceStep>): PathOutcome => {
    const steps: PathStep[] = o.steps.map(iptablesStep);
    for (const s of o.steps) {
      objects.add(s.chain);
      if (s.rule.target !== null && tables.chain(s.table, s.rule.target)) objects.add(s.rule.target);
      for (const r of tables.chain(s.table, s.chain)?.rules ?? []) {
        for (const m of r.text.matchAll(/--match-set (\S+)/g)) objects.add(m[1]);
      }
    }
    let via: string | null = null;
    if (o.balancer) {
      const text = o.verdict === "dnat"
        ? `${o.balancer.text}: IPVS picks a real server`
        : `${o.balancer.text}: no real server takes new connections, so IPVS answers ICMP port unreachable`;
      steps.splice(o.balancer.at, 0, {
        key: `ipvs ${o.balancer.text}`,
        text,
        where: o.balancer.text,
        comment: null,
      });
      if (o.verdict === "dnat") via = `real server ${o.endpoint}`;
    }
    const dnatStep = o.steps.find((s) => s.rule.target === "DNAT");
    if (via === null && dnatStep) via = dnatStep.chain;
    const marked = o.steps.find((s) => s.rule.target === "KUBE-MARK-MASQ");
    return pathOutcome(o, steps, via, marked ? iptablesStep(marked) : null);
  });
  return walked(outcomes, t.assumptions, objects);
}

/** A walk's outcomes as a mode's path (exact shares, no kube-ipvs0: the ipvs mode sets its own). */
function walked(outcomes: PathOutcome[], assumptions: readonly string[], objects: Set<string>): ModePath {
  return { outcomes, assumptions, objects: [...objects], sharesExact: true, dummyAddresses: [] };
}

/** One outcome in explain's shape: the tracer's ending, its steps, and the steps that matter picked out. */
function pathOutcome(
  o: Outcome<unknown>,
  steps: readonly PathStep[],
  via: string | null,
  markedBy: PathStep | null,
): PathOutcome {
  return {
    verdict: o.verdict,
    endpoint: o.endpoint,
    masqueraded: o.masqueraded,
    probability: o.probability,
    steps,
    via,
    markedBy,
    endedBy: o.verdict === "reject" || o.verdict === "drop" ? steps.at(-1) ?? null : null,
  };
}

function nftablesPath(table: NftTable, packet: TracePacket): ModePath {
  const t = traceNftables(table, packet);
  const objects = new Set<string>();
  const outcomes = t.outcomes.map((o): PathOutcome => {
    const steps = o.steps.map((s): PathStep => ({
      key: `${s.chain} #${s.index}`,
      text: `${s.chain} #${s.index}: ${s.rule}`,
      where: `${s.chain} #${s.index}`,
      comment: s.rule.match(/\bcomment "([^"]*)"/)?.[1] ?? null,
    }));
    for (const s of o.steps) {
      objects.add(s.chain);
      for (const m of s.rule.matchAll(/\b(?:jump|goto) (\S+)/g)) objects.add(m[1]);
      for (const r of table.chains.get(s.chain)?.rules ?? []) {
        for (const m of r.matchAll(/@([\w-]+)/g)) objects.add(m[1]);
      }
    }
    const dnat = o.steps.find((s) => /\bdnat\b/.test(s.rule));
    const marked = o.steps.findIndex((s) => /\bmark set mark or\b/.test(s.rule));
    return pathOutcome(o, steps, dnat ? dnat.chain : null, marked >= 0 ? steps[marked] : null);
  });
  return walked(outcomes, t.assumptions, objects);
}

/** The outcomes' steps split into what every outcome shares at the start and the end, and each one's own. */
export interface SplitPath {
  readonly prefix: readonly PathStep[];
  readonly branches: readonly { readonly outcome: PathOutcome; readonly steps: readonly PathStep[] }[];
  readonly suffix: readonly PathStep[];
}

/** Splits the outcomes' steps into the common start, each outcome's own middle, and the common end. */
export function splitPath(outcomes: readonly PathOutcome[]): SplitPath {
  if (outcomes.length === 0) return { prefix: [], branches: [], suffix: [] };
  if (outcomes.length === 1) return { prefix: outcomes[0].steps, branches: [], suffix: [] };
  const minLen = Math.min(...outcomes.map((o) => o.steps.length));
  let p = 0;
  while (p < minLen && outcomes.every((o) => o.steps[p].key === outcomes[0].steps[p].key)) p++;
  let q = 0;
  while (
    q < minLen - p &&
    outcomes.every((o) =>
      o.steps[o.steps.length - 1 - q].key === outcomes[0].steps[outcomes[0].steps.length - 1 - q].key
    )
  ) q++;
  return {
    prefix: outcomes[0].steps.slice(0, p),
    branches: outcomes.map((o) => ({ outcome: o, steps: o.steps.slice(p, o.steps.length - q) })),
    suffix: outcomes[0].steps.slice(outcomes[0].steps.length - q),
  };
}
