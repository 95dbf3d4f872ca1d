/**
 * A packet tracer over {@linkcode IptablesTables}: walks one new connection's first packet through the nat and
 * filter tables as the kernel would (nat PREROUTING or OUTPUT, then filter INPUT, FORWARD or OUTPUT, and INPUT
 * too for the node's own packet to a local address, then nat POSTROUTING), evaluating each rule's matches, and returns every outcome with its probability (a
 * `-m statistic --mode random` rule splits the walk in two). The outcome is derived from the rules alone, so
 * it explains rules read from the kernel (`iptables-save`) as well as rules the agent would write.
 *
 * What it cannot know is said in `assumptions` rather than guessed silently: routing (`-o` never matches), an
 * affinity entry (`-m recent --rcheck` does not match a first packet), modules it does not evaluate.
 *
 * Hooks ({@linkcode TraceHooks}) let the ipvs mode's tracer answer `-m set` from its ipsets and put IPVS's
 * choice of real server between filter INPUT and nat POSTROUTING (`lib/cli/explain_trace_ipvs.ts`).
 * Over 400 lines: the walk, the matches it evaluates and the hook order are one piece, read together.
 * @module
 */
import { cidrContains, type IPFamily, isLoopback } from "../../net/ip.ts";
import { type IptablesTables, type IptRule, ruleComment, targetOption } from "./model.ts";

/** The packet: the first packet of a new connection. */
export interface TracePacket {
  readonly family: IPFamily;
  readonly src: string;
  readonly dst: string;
  readonly protocol: "tcp" | "udp" | "sctp";
  readonly dport: number;
  /** Where it enters: a process on the node (`node`) or through an interface. */
  readonly from: "pod" | "node" | "outside";
  /** The interface it arrives on ("" when not known). */
  readonly inInterface: string;
  /** The node's own addresses (`-m addrtype --*-type LOCAL`; loopback counts too). */
  readonly localAddresses: readonly string[];
}

/**
 * What the tracer asks outside the iptables tables, for modes whose rules lean on other kernel objects (the
 * ipvs mode: ipsets and IPVS). Without hooks, `-m set` rules do not match and no load balancer runs.
 */
export interface TraceHooks {
  /**
   * Whether the packet is in the ipset `name` by `dirs` (`-m set --match-set NAME dst,dst`), given the
   * current destination; undefined when the set is not known (the rule is then taken as not matching).
   */
  inSet?(name: string, dirs: readonly string[], pkt: SetLookup): boolean | undefined;
  /**
   * A load balancer that takes connections to local addresses after nat and filter INPUT (IPVS on LOCAL_IN;
   * on LOCAL_OUT, before filter OUTPUT, for the node's own packet): the destinations it picks with their
   * shares, `"reject"` when it has the address and port but no destination, or null when it does not take the
   * packet.
   */
  balance?(dst: string, dport: number): Balanced[] | "reject" | null;
  /** The load balancer's own line for what took (or refused) the packet (`-A -t 10.96.0.1:443 -s rr`). */
  describe?(dst: string, dport: number): string;
}

/** The packet's fields as an ipset lookup sees them. */
export interface SetLookup {
  readonly src: string;
  readonly dst: string;
  readonly protocol: string;
  readonly dport: number;
}

/** One destination of a load balancer, with its share of new connections. */
export interface Balanced {
  /** `ip:port` (`[ip]:port`) as a DNAT would name it. */
  readonly endpoint: string;
  readonly dst: string;
  readonly dport: number;
  readonly share: number;
  /** The virtual server that took it (`-m ipvs --vaddr/--vproto/--vport`). */
  readonly vaddr: string;
  readonly vport: number;
}

/** One rule the packet matched. */
export interface TraceStep {
  readonly table: string;
  readonly chain: string;
  /** 1-based position in the chain, as `iptables -L --line-numbers` counts. */
  readonly index: number;
  readonly rule: IptRule;
  /** The share of connections that reach this rule and match it (below 1 after a statistic split). */
  readonly probability: number;
}

/** What the kernel does with the packet. */
export type TraceVerdict = "dnat" | "reject" | "drop" | "untouched";

/** One outcome of a walk whose matched steps are of type `S` (every mode's tracer ends in these). */
export interface Outcome<S> {
  readonly verdict: TraceVerdict;
  /** `ip:port` (`[ip]:port`) of a DNAT. */
  readonly endpoint: string | null;
  readonly masqueraded: boolean;
  readonly probability: number;
  /** The rules it matched, in order. */
  readonly steps: readonly S[];
  /**
   * The load balancer (IPVS) that took or refused the packet, after `steps[at - 1]`: its line for the virtual
   * server; absent when none did.
   */
  readonly balancer?: { readonly at: number; readonly text: string };
}

/** Every outcome (probabilities add up to 1) and what the tracer had to assume. */
export interface Traced<S> {
  readonly outcomes: readonly Outcome<S>[];
  readonly assumptions: readonly string[];
}

/** One outcome of the iptables walk. */
export type TraceOutcome = Outcome<TraceStep>;

/** The iptables walk's outcomes. */
export type Trace = Traced<TraceStep>;

interface State {
  /** The share of connections on this branch. */
  prob: number;
  mark: bigint;
  dnat: string | null;
  dst: string;
  dport: number;
  masq: boolean;
  /** The virtual server the load balancer hook picked, if any. */
  vs: { addr: string; port: number } | null;
  steps: TraceStep[];
  balancer?: { at: number; text: string };
}

/** How a walk through a chain ended: fell off or RETURNed (`continue`), or a terminal target. */
type End = "continue" | "accept" | "drop" | "reject";

interface Branch {
  readonly state: State;
  readonly end: End;
}

const MAX_DEPTH = 64;

class Tracer {
  readonly assumptions = new Set<string>();
  constructor(readonly tables: IptablesTables, readonly p: TracePacket, readonly hooks: TraceHooks = {}) {}

  /** Whether every match but `statistic` matches; the statistic's probability (1 without one). */
  private matches(r: IptRule, s: State): number {
    let share = 1;
    for (const m of r.matches) {
      for (const o of m.options) {
        const v = o.values[0] ?? "";
        let hit: boolean;
        switch (`${m.module}/${o.name}`) {
          case "/source":
            hit = cidrMatch(v, this.p.src);
            break;
          case "/destination":
            hit = cidrMatch(v, s.dst);
            break;
          case "/protocol":
            hit = v.toLowerCase() === this.p.protocol || v === "all";
            break;
          case "/in-interface":
            hit = this.p.from !== "node" && ifaceMatch(v, this.p.inInterface);
            if (this.p.from !== "node" && this.p.inInterface === "") {
              this.assumptions.add(`the packet's interface is not known: "-i ${v}" taken as not matching`);
            }
            break;
          case "/out-interface":
            hit = false;
            this.assumptions.add(`routing is not traced: "-o ${v}" taken as not matching`);
            break;
          case "tcp/dport":
          case "udp/dport":
          case "sctp/dport":
            hit = m.module === this.p.protocol && portMatch(v, s.dport);
            break;
          case "comment/comment":
          case "nfacct/nfacct-name":
            hit = true;
            break;
          case "conntrack/ctstate": {
            const states = s.dnat !== null ? ["NEW", "DNAT"] : ["NEW"];
            hit = v.split(",").some((x) => states.includes(x));
            break;
          }
          case "addrtype/dst-type":
          case "addrtype/src-type":
            if (v !== "LOCAL") {
              this.assumptions.add(`addrtype ${v} is not evaluated: taken as not matching`);
              hit = o.negated;
              break;
            }
            hit = isLocalOf(this.p, o.name === "dst-type" ? s.dst : this.p.src);
            break;
          case "mark/mark": {
            const [value, mask = "0xffffffff"] = v.split("/");
            hit = (s.mark & BigInt(mask)) === BigInt(value);
            break;
          }
          case "statistic/mode":
            hit = !o.negated;
            break;
          case "statistic/probability":
            share = Number(v);
            hit = !o.negated;
            break;
          case "recent/rcheck":
          case "recent/update":
            this.assumptions.add(
              "no session affinity entry yet (a first packet): -m recent --rcheck does not match",
            );
            hit = o.negated;
            break;
          case "set/match-set": {
            const r = this.hooks.inSet?.(v, (o.values[1] ?? "").split(","), {
              src: this.p.src,
              dst: s.dst,
              protocol: this.p.protocol,
              dport: s.dport,
            });
            if (r === undefined) {
              this.assumptions.add(`ipset ${v} is not known: rules matching it taken as not matching`);
              hit = o.negated;
            } else hit = r;
            break;
          }
          case "physdev/physdev-is-in":
            this.assumptions.add("no bridge: --physdev-is-in taken as false");
            hit = false;
            break;
          case "ipvs/vaddr":
            hit = s.vs !== null && cidrMatch(v, s.vs.addr);
            break;
          case "ipvs/vport":
            hit = s.vs !== null && portMatch(v, s.vs.port);
            break;
          case "ipvs/vproto":
            hit = s.vs !== null && v.toLowerCase() === this.p.protocol;
            break;
          case "recent/set":
          case "recent/name":
          case "recent/seconds":
          case "recent/reap":
          case "recent/mask":
          case "recent/rsource":
            hit = !o.negated;
            break;
          default:
            this.assumptions.add(
              `-m ${m.module} --${o.name} is not evaluated: rules with it taken as not matching`,
            );
            return 0;
        }
        if (hit === o.negated) return 0;
      }
    }
    return share;
  }

  /** Walks `chain` of `table` from rule 0; returns how each branch ended. */
  walk(table: string, chain: string, s: State, depth: number): Branch[] {
    const c = this.tables.chain(table, chain);
    if (!c || depth > MAX_DEPTH) return [{ state: s, end: "continue" }];
    const out: Branch[] = [];
    let live: State[] = [s];
    for (let i = 0; i < c.rules.length && live.length > 0; i++) {
      const r = c.rules[i];
      const next: State[] = [];
      for (const st of live) {
        const share = this.matches(r, st);
        if (share < 1) next.push({ ...st, prob: st.prob * (1 - share) });
        if (share === 0) continue;
        const hit: State = {
          ...st,
          prob: st.prob * share,
          steps: [...st.steps, { table, chain, index: i + 1, rule: r, probability: st.prob * share }],
        };
        for (const b of this.apply(table, r, hit, depth)) {
          // A jump into a chain where nothing matched says nothing: the step is left out of the path.
          const quiet = b.end === "continue" && b.state.steps === hit.steps && r.target !== null &&
            this.tables.chain(table, r.target) !== undefined;
          if (quiet) b.state.steps = st.steps;
          if (b.end === "continue" && !b.returned) next.push(b.state);
          else out.push({ state: b.state, end: b.end === "continue" ? "continue" : b.end });
        }
      }
      live = next;
    }
    for (const st of live) out.push({ state: st, end: "continue" });
    return out;
  }

  /** A matched rule's target; `returned` ends the current chain (RETURN, or a goto that came back). */
  private apply(table: string, r: IptRule, s: State, depth: number): (Branch & { returned?: boolean })[] {
    const t = r.target;
    if (t === null) return [{ state: s, end: "continue" }];
    if (this.tables.chain(table, t)) {
      return this.walk(table, t, s, depth + 1).map((b) => ({
        ...b,
        returned: r.goto && b.end === "continue",
      }));
    }
    switch (t) {
      case "RETURN":
        return [{ state: s, end: "continue", returned: true }];
      case "ACCEPT":
        return [{ state: s, end: "accept" }];
      case "DROP":
        return [{ state: s, end: "drop" }];
      case "REJECT":
        return [{ state: s, end: "reject" }];
      case "DNAT": {
        const to = targetOption(r, "to-destination") ?? "";
        const m = to.match(/^\[([^\]]+)\]:(\d+)$/) ?? to.match(/^([^:]+):(\d+)$/) ??
          [to, to, String(s.dport)];
        return [{ state: { ...s, dnat: to, dst: m[1], dport: Number(m[2]) }, end: "accept" }];
      }
      case "MARK": {
        return [{ state: { ...s, mark: applyMark(r, s.mark) }, end: "continue" }];
      }
      case "MASQUERADE":
      case "SNAT":
        return [{ state: { ...s, masq: true }, end: "accept" }];
      default:
        this.assumptions.add(`target ${t} is not evaluated: the walk goes on past it`);
        return [{ state: s, end: "continue" }];
    }
  }
}

function applyMark(r: IptRule, mark: bigint): bigint {
  const or = targetOption(r, "or-mark");
  if (or !== undefined) return mark | BigInt(or);
  const xor = targetOption(r, "xor-mark");
  if (xor !== undefined) return mark ^ BigInt(xor);
  const x = targetOption(r, "set-xmark") ?? targetOption(r, "set-mark");
  if (x !== undefined) {
    const [v, m = "0xffffffff"] = x.split("/");
    return (mark & ~BigInt(m)) ^ BigInt(v);
  }
  return mark;
}

function cidrMatch(cidr: string, ip: string): boolean {
  return cidr.includes("/")
    ? cidrContains(cidr, ip)
    : cidrContains(`${cidr}/${cidr.includes(":") ? 128 : 32}`, ip);
}

function ifaceMatch(pattern: string, iface: string): boolean {
  return pattern.endsWith("+") ? iface.startsWith(pattern.slice(0, -1)) : iface === pattern;
}

function portMatch(spec: string, port: number): boolean {
  const [lo, hi = lo] = spec.split(":").map(Number);
  return port >= lo && port <= hi;
}

/**
 * Traces `p` through `tables`: nat, then filter, then nat POSTROUTING for what was not dropped. Outcomes with
 * the same verdict, endpoint and masquerade are merged (their probabilities added, the first one's steps kept).
 */
export function traceIptables(tables: IptablesTables, p: TracePacket, hooks: TraceHooks = {}): Trace {
  const t = new Tracer(tables, p, hooks);
  const start: State = {
    prob: 1,
    mark: 0n,
    dnat: null,
    dst: p.dst,
    dport: p.dport,
    masq: false,
    vs: null,
    steps: [],
  };
  const merged: Merged = new Map();
  const natIn = p.from === "node" ? "OUTPUT" : "PREROUTING";
  /** Walks filter `chains` in turn; drops and rejects become outcomes, the rest goes on. */
  const filter = (states: State[], chains: readonly string[]): State[] => {
    let passed = states;
    for (const chain of chains) {
      const next: State[] = [];
      for (const st of passed) {
        for (const f of t.walk("filter", chain, st, 0)) {
          if (f.end === "drop" || f.end === "reject") add(merged, f.end, f.state);
          else next.push(f.state);
        }
      }
      passed = next;
    }
    return passed;
  };
  /** The load balancer hook on states bound for a local address: what it took, and what it left alone. */
  const balance = (states: State[]): { taken: State[]; left: State[] } => {
    const taken: State[] = [], left: State[] = [];
    for (const st of states) {
      const r = hooks.balance && st.dnat === null && isLocalOf(p, st.dst)
        ? hooks.balance(st.dst, st.dport)
        : null;
      if (r === null) {
        left.push(st);
        continue;
      }
      const balancer = {
        at: st.steps.length,
        text: hooks.describe?.(st.dst, st.dport) ?? `load balancer for ${st.dst}:${st.dport}`,
      };
      if (r === "reject" || r.length === 0) add(merged, "reject", { ...st, balancer });
      else {
        for (const b of r) {
          taken.push({
            ...st,
            balancer,
            prob: st.prob * b.share,
            dnat: b.endpoint,
            dst: b.dst,
            dport: b.dport,
            vs: { addr: b.vaddr, port: b.vport },
          });
        }
      }
    }
    return { taken, left };
  };
  const postrouting = (states: State[]) => {
    for (const st of states) {
      const verdict: TraceVerdict = st.dnat !== null ? "dnat" : "untouched";
      for (const post of t.walk("nat", "POSTROUTING", st, 0)) add(merged, verdict, post.state);
    }
  };
  for (const nat of t.walk("nat", natIn, start, 0)) {
    const s0 = nat.state;
    if (nat.end === "drop" || nat.end === "reject") {
      add(merged, nat.end, s0);
      continue;
    }
    if (p.from === "node") {
      // IPVS takes the node's own packet on LOCAL_OUT, after nat OUTPUT and before filter OUTPUT.
      const { taken, left } = balance([s0]);
      for (const st of taken) {
        postrouting(filter([st], isLocalOf(p, st.dst) ? ["OUTPUT", "INPUT"] : ["OUTPUT"]));
      }
      // The node's own packet to a local address leaves through filter OUTPUT and comes back in through INPUT.
      for (const st of left) {
        postrouting(filter([st], isLocalOf(p, st.dst) ? ["OUTPUT", "INPUT"] : ["OUTPUT"]));
      }
      continue;
    }
    if (!isLocalOf(p, s0.dst)) {
      postrouting(filter([s0], ["FORWARD"]));
      continue;
    }
    // IPVS takes a packet for a local address on LOCAL_IN after filter INPUT, and sends it out through filter
    // OUTPUT and nat POSTROUTING.
    const { taken, left } = balance(filter([s0], ["INPUT"]));
    postrouting(filter(taken, ["OUTPUT"]));
    postrouting(left);
  }
  const outcomes = [...merged.values()].map((o) => ({
    verdict: o.verdict,
    endpoint: o.endpoint,
    masqueraded: o.masq,
    probability: o.prob,
    steps: o.steps,
    ...(o.balancer ? { balancer: o.balancer } : {}),
  }));
  outcomes.sort((a, b) =>
    b.probability - a.probability || String(a.endpoint).localeCompare(String(b.endpoint))
  );
  return { outcomes, assumptions: [...t.assumptions] };
}

function isLocalOf(p: TracePacket, ip: string): boolean {
  return isLoopback(ip) || p.localAddresses.includes(ip);
}

type Merged = Map<
  string,
  {
    verdict: TraceVerdict;
    endpoint: string | null;
    masq: boolean;
    prob: number;
    steps: TraceStep[];
    balancer?: { at: number; text: string };
  }
>;

function add(
  merged: Merged,
  verdict: TraceVerdict,
  s: State,
): void {
  const prob = s.prob;
  const endpoint = verdict === "dnat" ? s.dnat : null;
  const masq = verdict === "dnat" && s.masq;
  const key = `${verdict}|${endpoint}|${masq}`;
  const o = merged.get(key);
  if (o) o.prob += prob;
  else merged.set(key, { verdict, endpoint, masq, prob, steps: s.steps, balancer: s.balancer });
}

/** A matched rule as one line: `nat KUBE-SVC-X #2: <rule as written>`. */
export function formatStep(s: TraceStep): string {
  return `${s.table} ${s.chain} #${s.index}: ${s.rule.text}`;
}

/** The comment of a step's rule, for text that names Services. */
export function stepComment(s: TraceStep): string | undefined {
  return ruleComment(s.rule);
}
