/**
 * The packet tracer of the nftables mode: the agent's `nft -f` transaction applied to a small table model
 * (chains with their hooks and rules, sets and maps with their elements), and one new connection's first
 * packet walked through the base chains in hook and priority order as the kernel runs them (prerouting, then
 * input or forward; output for the node's own packet, then input when it is for the node; postrouting),
 * evaluating each rule's expressions: lookups in sets, maps and verdict maps (concatenations included),
 * `numgen` splits with their shares, marks, `fib ... type local`, conntrack state, DNAT and masquerade. The
 * outcome is derived from the table alone: it is what explain prints (`explain_path.ts`), and the tests hold it
 * to the Services' semantics, so a rule or element the mode gets wrong fails there.
 *
 * Like upstream's test tracer, it is deliberately not a general nft interpreter: it reads the expressions
 * kube-proxy's tables use, and says so in `assumptions` when it meets anything else.
 * @module
 */
import { type NftListing, splitElements } from "../dataplane/nftables/listing.ts";
import { tokenize } from "../dataplane/nftables/rule_text.ts";
import { cidrContains, isLoopback, joinHostPort, parseIP } from "../net/ip.ts";
import type { Outcome, Traced, TracePacket, TraceVerdict } from "../dataplane/iptables/trace.ts";
import { formatOutcomes } from "./explain_trace.ts";

/** A base chain's hook. */
export interface NftHook {
  readonly type: string;
  readonly hook: string;
  readonly priority: number;
}

/** One chain of the model. */
export interface NftChain {
  hook: NftHook | null;
  rules: string[];
}

/** One table of the model. */
export interface NftTable {
  readonly chains: Map<string, NftChain>;
  /** Set or map name → its elements as written (`10.96.0.1 . tcp . 80 : goto x`), comments removed. */
  readonly sets: Map<string, string[]>;
}

/** An element without its `comment "..."` and `timeout`/`expires` options. */
function elementText(e: string): string {
  return e.replace(/\s+comment\s+"[^"]*"/, "").replace(/\s+(timeout|expires)\s+\S+/g, "").trim();
}

/**
 * Applies an `nft -f` transaction of the forms the agent writes (add/flush/delete of chains, sets, maps and
 * counters; add rule; add/delete element) to `table` (a new one when not given).
 */
export function applyNftTransaction(
  text: string,
  table: NftTable = { chains: new Map(), sets: new Map() },
): NftTable {
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    const m = line.match(
      /^(add|flush|delete|insert) (table|chain|rule|set|map|element|counter) (?:ip6?|inet) \S+(?: (\S+))?(.*)$/,
    );
    if (!m) continue;
    const [, verb, kind, name = "", rest] = m;
    if (kind === "chain") {
      if (verb === "delete") table.chains.delete(name);
      else if (verb === "flush") {
        const c = table.chains.get(name);
        if (c) c.rules = [];
      } else {
        const c = table.chains.get(name) ?? { hook: null, rules: [] };
        const h = rest.match(/type (\S+) hook (\S+)(?: device \S+)? priority (-?\d+)/);
        if (h) c.hook = { type: h[1], hook: h[2], priority: Number(h[3]) };
        table.chains.set(name, c);
      }
    } else if (kind === "rule" && (verb === "add" || verb === "insert")) {
      const c = table.chains.get(name);
      if (c) verb === "add" ? c.rules.push(rest.trim()) : c.rules.unshift(rest.trim());
    } else if (kind === "set" || kind === "map") {
      if (verb === "delete") table.sets.delete(name);
      else if (verb === "flush") table.sets.set(name, []);
      else if (!table.sets.has(name)) table.sets.set(name, []);
    } else if (kind === "element") {
      const inner = rest.slice(rest.indexOf("{") + 1, rest.lastIndexOf("}"));
      const els = splitElements(inner).map(elementText);
      const set = table.sets.get(name) ?? [];
      if (verb === "add") { for (const e of els) if (!set.includes(e)) set.push(e); }
      if (verb === "delete") {
        for (const e of els) {
          const i = set.findIndex((x) => x === e || x.split(" : ")[0] === e);
          if (i >= 0) set.splice(i, 1);
        }
      }
      table.sets.set(name, set);
    }
  }
  return table;
}

/** A table as `nft list table` showed it (see `listing.ts`) in the tracer's model. */
export function tableFromListing(l: NftListing): NftTable {
  const table: NftTable = { chains: new Map(), sets: new Map() };
  for (const [name, rules] of l.chains) {
    table.chains.set(name, { hook: l.hooks.get(name) ?? null, rules: [...rules] });
  }
  for (const [name, els] of l.sets) table.sets.set(name, els.map(elementText));
  return table;
}

/** One rule the packet matched. */
export interface NftTraceStep {
  readonly chain: string;
  /** 1-based position in the chain. */
  readonly index: number;
  readonly rule: string;
  readonly probability: number;
}

/** One outcome of the walk. */
export type NftTraceOutcome = Outcome<NftTraceStep>;

/** Every outcome (probabilities add up to 1) and what the tracer had to assume. */
export type NftTrace = Traced<NftTraceStep>;

interface State {
  prob: number;
  mark: bigint;
  dnat: string | null;
  dst: string;
  dport: number;
  masq: boolean;
  steps: NftTraceStep[];
}

type End = "continue" | "accept" | "drop" | "reject" | "return";
type Verdict = { kind: "accept" | "drop" | "reject" | "return" | "continue" } | {
  kind: "jump" | "goto";
  chain: string;
};

const MAX_DEPTH = 64;

/** A rule's evaluation: the branches it splits into, each with a share and how it ends. */
interface RuleBranch {
  share: number;
  state: State;
  verdict: Verdict | null;
}

class NftTracer {
  readonly assumptions = new Set<string>();
  constructor(readonly table: NftTable, readonly p: TracePacket) {}

  /** Whether `ip` is the node's own (loopback included). */
  local(ip: string): boolean {
    return isLoopback(ip) || this.p.localAddresses.includes(ip);
  }

  /** The value of one selector (`ip daddr`, `th dport`, ...) for the state, or undefined when unknown. */
  private selector(t: string[], i: number, s: State): { value: string; next: number } | undefined {
    const two = `${t[i]} ${t[i + 1]}`;
    switch (two) {
      case "ip saddr":
      case "ip6 saddr":
        return { value: this.p.src, next: i + 2 };
      case "ip daddr":
      case "ip6 daddr":
        return { value: s.dst, next: i + 2 };
      case "meta l4proto":
        return { value: this.p.protocol, next: i + 2 };
      case "th dport":
      case "tcp dport":
      case "udp dport":
      case "sctp dport":
        return { value: String(s.dport), next: i + 2 };
      case "meta mark":
        return { value: String(s.mark), next: i + 2 };
      case "ct state":
        return { value: s.dnat !== null ? "new" : "new", next: i + 2 };
      case "ct status":
        return { value: s.dnat !== null ? "dnat" : "", next: i + 2 };
      case "meta iifname":
        return { value: this.p.from === "node" ? "lo" : this.p.inInterface, next: i + 2 };
    }
    if (t[i] === "mark") return { value: String(s.mark), next: i + 1 };
    if (t[i] === "iifname") return { value: this.p.from === "node" ? "lo" : this.p.inInterface, next: i + 1 };
    if (t[i] === "fib" && (t[i + 1] === "saddr" || t[i + 1] === "daddr") && t[i + 2] === "type") {
      const ip = t[i + 1] === "saddr" ? this.p.src : s.dst;
      return { value: this.local(ip) ? "local" : "unicast", next: i + 3 };
    }
    return undefined;
  }

  /** Whether one value of a key part equals (or lies in) the element's part. */
  private partMatches(value: string, elem: string): boolean {
    if (elem.includes("/")) return parseIP(value) !== null && cidrContains(elem, value);
    if (elem.includes("-") && /^\d+-\d+$/.test(elem)) {
      const [lo, hi] = elem.split("-").map(Number);
      return Number(value) >= lo && Number(value) <= hi;
    }
    const a = parseIP(value), b = parseIP(elem);
    if (a && b) return a.ip === b.ip;
    return value === elem;
  }

  private keyMatches(values: string[], elemKey: string): boolean {
    const parts = elemKey.split(" . ").map((x) => x.trim());
    return parts.length === values.length && parts.every((e, i) => this.partMatches(values[i], e));
  }

  /** The elements of `@name` or of an inline `{ ... }` starting at t[i]; the index after it. */
  private elements(t: string[], i: number): { els: string[]; next: number } | undefined {
    if (t[i]?.startsWith("@")) {
      const name = t[i].slice(1);
      const els = this.table.sets.get(name);
      if (els === undefined) {
        this.assumptions.add(`set ${name} is not in the table: taken as empty`);
        return { els: [], next: i + 1 };
      }
      return { els, next: i + 1 };
    }
    if (t[i] === "{") {
      let j = i + 1, depth = 1, cur: string[] = [];
      const els: string[] = [];
      for (; j < t.length && depth > 0; j++) {
        if (t[j] === "{") depth++;
        if (t[j] === "}") depth--;
        if (depth === 0 || (t[j] === "," && depth === 1)) {
          if (cur.length) els.push(elementText(cur.join(" ")));
          cur = [];
        } else cur.push(t[j]);
      }
      return { els, next: j };
    }
    return undefined;
  }

  /** Parses a verdict at t[i] (`goto x`, `jump x`, `drop`, ...). */
  private verdict(t: string[], i: number): { v: Verdict; next: number } | undefined {
    switch (t[i]) {
      case "jump":
      case "goto":
        return { v: { kind: t[i] as "jump" | "goto", chain: t[i + 1] }, next: i + 2 };
      case "accept":
      case "drop":
      case "return":
      case "continue":
        return { v: { kind: t[i] as "accept" }, next: i + 1 };
      case "reject": {
        let j = i + 1;
        if (t[j] === "with") j += 3;
        return { v: { kind: "reject" }, next: j };
      }
    }
    return undefined;
  }

  private verdictText(text: string): Verdict | null {
    const r = this.verdict(tokenize(text.trim()), 0);
    return r?.v ?? null;
  }

  /** Evaluates one rule; the branches it splits into (none when it does not match). */
  private evaluate(rule: string, s0: State): RuleBranch[] {
    const t = tokenize(rule);
    let branches: RuleBranch[] = [{ share: 1, state: { ...s0 }, verdict: null }];
    let i = 0;
    const unknown = (what: string) => {
      this.assumptions.add(`${what} is not evaluated: rules with it taken as not matching`);
      return [];
    };
    while (i < t.length && branches.length > 0) {
      const w = t[i];
      if (w === "comment") {
        i += 2;
        continue;
      }
      if (w === "counter") {
        i += t[i + 1] === "name" ? 3 : 1;
        continue;
      }
      const v = this.verdict(t, i);
      if (v) {
        for (const b of branches) b.verdict = v.v;
        i = v.next;
        continue;
      }
      if (w === "masquerade") {
        for (const b of branches) {
          b.state.masq = true;
          b.verdict = { kind: "accept" };
        }
        i++;
        while (t[i] === "fully-random" || t[i] === "random" || t[i] === "persistent") i++;
        continue;
      }
      if (w === "update" || w === "add") {
        // `update @set { ip saddr }`: records affinity; no effect on this first packet.
        const e = this.elements(t, i + 1);
        const after = e ? this.elements(t, e.next) : undefined;
        i = after?.next ?? t.length;
        continue;
      }
      if (
        (w === "mark" && t[i + 1] === "set") || (w === "meta" && t[i + 1] === "mark" && t[i + 2] === "set")
      ) {
        const j = w === "meta" ? i + 3 : i + 2;
        // mark set mark or|xor|and X, or mark set X
        const base = t[j] === "mark" || (t[j] === "meta" && t[j + 1] === "mark");
        const k = base ? (t[j] === "meta" ? j + 2 : j + 1) : j;
        const op = base ? t[k] : "set";
        const val = BigInt(base ? t[k + 1] : t[k]);
        for (const b of branches) {
          const m = b.state.mark;
          b.state.mark = op === "or" || op === "|"
            ? m | val
            : op === "xor" || op === "^"
            ? m ^ val
            : op === "and" || op === "&"
            ? m & val
            : val;
        }
        i = base ? k + 2 : k + 1;
        continue;
      }
      if (w === "dnat") {
        let j = i + 1;
        const written = (t[j] === "ip" || t[j] === "ip6") && t[j + 1] === "addr" && t[j + 2] === "." &&
          t[j + 3] === "port";
        // As written: `dnat ip addr . port to numgen ...`; as nft lists it: `dnat ip to numgen ...`.
        const listed = (t[j] === "ip" || t[j] === "ip6") && t[j + 1] === "to" && t[j + 2] === "numgen";
        if (written || listed) {
          j += written ? 4 : 1;
          if (t[j] !== "to" || t[j + 1] !== "numgen" || t[j + 2] !== "random" || t[j + 3] !== "mod") {
            return unknown(`dnat ${t.slice(i + 1, j + 2).join(" ")}`);
          }
          const mod = Number(t[j + 4]);
          if (t[j + 5] !== "map") return unknown("dnat ... map");
          const e = this.elements(t, j + 6);
          if (!e) return unknown("dnat ... map");
          const next: RuleBranch[] = [];
          for (const b of branches) {
            for (let n = 0; n < mod; n++) {
              const el = e.els.find((x) => x.split(" : ")[0].trim() === String(n));
              if (!el) continue;
              const [ip, port] = el.split(" : ")[1].split(" . ").map((x) => x.trim());
              next.push({
                share: b.share / mod,
                state: { ...b.state, dnat: joinHostPort(ip, Number(port)), dst: ip, dport: Number(port) },
                verdict: { kind: "accept" },
              });
            }
          }
          branches = next;
          i = e.next;
          continue;
        }
        if (t[j] === "ip" || t[j] === "ip6") j++;
        if (t[j] !== "to") return unknown(`dnat ${t[j]}`);
        const to = t[j + 1];
        const m = to.match(/^\[([^\]]+)\]:(\d+)$/) ?? to.match(/^([^:]+):(\d+)$/);
        const ip = m ? m[1] : to.replace(/^\[|\]$/g, "");
        for (const b of branches) {
          const port = m ? Number(m[2]) : b.state.dport;
          b.state = { ...b.state, dnat: joinHostPort(ip, port), dst: ip, dport: port };
          b.verdict = { kind: "accept" };
        }
        i = j + 2;
        continue;
      }
      if (w === "numgen" && t[i + 1] === "random" && t[i + 2] === "mod") {
        const mod = Number(t[i + 3]);
        if (t[i + 4] !== "vmap") return unknown("numgen without vmap");
        const e = this.elements(t, i + 5);
        if (!e) return unknown("numgen vmap");
        const next: RuleBranch[] = [];
        for (const b of branches) {
          for (let n = 0; n < mod; n++) {
            const el = e.els.find((x) => x.split(" : ")[0].trim() === String(n));
            const v = el ? this.verdictText(el.slice(el.indexOf(" : ") + 3)) : null;
            if (v) next.push({ share: b.share / mod, state: { ...b.state }, verdict: v });
          }
        }
        branches = next;
        i = e.next;
        continue;
      }
      // An expression: selectors joined by `.`, then a comparison, a set lookup or a verdict map.
      const values: string[] = [];
      let j = i;
      let sel = this.selector(t, j, branches[0].state);
      if (!sel) return unknown(`"${t.slice(i, i + 2).join(" ")}"`);
      const selStart = j;
      // Per-branch values (a DNAT earlier in the rule changes daddr/dport per branch).
      const read = (s: State) => {
        const out: string[] = [];
        let k = selStart;
        for (;;) {
          const r = this.selector(t, k, s)!;
          out.push(r.value);
          k = r.next;
          if (t[k] !== ".") return { out, next: k };
          k++;
        }
      };
      for (;;) {
        values.push(sel.value);
        j = sel.next;
        if (t[j] !== ".") break;
        j++;
        sel = this.selector(t, j, branches[0].state);
        if (!sel) return unknown(`"${t.slice(j, j + 2).join(" ")}"`);
      }
      let negated = false;
      if (t[j] === "!=") {
        negated = true;
        j++;
      } else if (t[j] === "==") j++;
      if ((t[j] === "and" || t[j] === "&") && values.length === 1) {
        // mark and MASK != 0 (listed: meta mark & MASK != 0x00000000)
        const mask = BigInt(t[j + 1]);
        const op = t[j + 2];
        const want = BigInt(t[j + 3]);
        branches = branches.filter((b) => {
          const hit = (b.state.mark & mask) === want;
          return op === "!=" ? !hit : hit;
        });
        i = j + 4;
        continue;
      }
      if (t[j] === "vmap") {
        const e = this.elements(t, j + 1);
        if (!e) return unknown("vmap");
        const next: RuleBranch[] = [];
        for (const b of branches) {
          const vals = read(b.state).out;
          const el = e.els.find((x) => this.keyMatches(vals, x.slice(0, x.indexOf(" : "))));
          if (!el) continue; // no element: the rule does not match
          const v = this.verdictText(el.slice(el.indexOf(" : ") + 3));
          if (v) next.push({ ...b, verdict: v });
        }
        branches = next;
        i = e.next;
        continue;
      }
      const e = this.elements(t, j);
      if (e) {
        branches = branches.filter((b) => {
          const vals = read(b.state).out;
          const hit = e.els.some((x) => this.keyMatches(vals, x));
          return hit !== negated;
        });
        i = e.next;
        continue;
      }
      // A single value (possibly a wildcard interface name or a CIDR), or a comma-less list like `new`.
      const want = t[j]?.replace(/^"|"$/g, "");
      if (want === undefined) return unknown("an expression without a value");
      branches = branches.filter((b) => {
        const v = read(b.state).out[0];
        let hit: boolean;
        if (t[selStart] === "ct" && t[selStart + 1] === "state") hit = want.split(",").includes(v);
        else if (want.endsWith("*")) hit = v.startsWith(want.slice(0, -1));
        else hit = this.partMatches(v, want);
        return hit !== negated;
      });
      i = j + 1;
    }
    return branches;
  }

  /** Walks `chain` from its first rule; how each branch ended. */
  walk(chain: string, s: State, depth: number): { state: State; end: End }[] {
    const c = this.table.chains.get(chain);
    if (!c || depth > MAX_DEPTH) return [{ state: s, end: "continue" }];
    const out: { state: State; end: End }[] = [];
    let live: State[] = [s];
    for (let i = 0; i < c.rules.length && live.length > 0; i++) {
      const rule = c.rules[i];
      const next: State[] = [];
      for (const st of live) {
        const bs = this.evaluate(rule, st);
        const matched = bs.reduce((a, b) => a + b.share, 0);
        if (matched < 1 - 1e-12) next.push({ ...st, prob: st.prob * (1 - matched) });
        for (const b of bs) {
          const prob = st.prob * b.share;
          const hit: State = {
            ...b.state,
            prob,
            steps: [...st.steps, { chain, index: i + 1, rule, probability: prob }],
          };
          const v = b.verdict;
          if (v === null || v.kind === "continue") next.push(hit);
          else if (v.kind === "jump" || v.kind === "goto") {
            for (const r of this.walk(v.chain, hit, depth + 1)) {
              if (r.end === "continue" || r.end === "return") {
                if (v.kind === "goto") out.push({ state: r.state, end: "return" });
                else next.push(r.state);
              } else out.push(r);
            }
          } else out.push({ state: hit, end: v.kind });
        }
      }
      live = next;
    }
    for (const st of live) out.push({ state: st, end: "continue" });
    return out;
  }

  /** The base chains on `hook` in priority order. */
  hookChains(hook: string): string[] {
    return [...this.table.chains.entries()]
      .filter(([, c]) => c.hook?.hook === hook)
      .sort((a, b) => a[1].hook!.priority - b[1].hook!.priority)
      .map(([n]) => n);
  }

  /** Walks the base chains of `hook` in turn; drops and rejects end, accepts go on to the next chain. */
  pass(hook: string, states: State[], done: (verdict: TraceVerdict, s: State) => void): State[] {
    let live = states;
    for (const chain of this.hookChains(hook)) {
      const next: State[] = [];
      for (const st of live) {
        for (const r of this.walk(chain, st, 0)) {
          if (r.end === "drop" || r.end === "reject") done(r.end, r.state);
          else next.push(r.state);
        }
      }
      live = next;
    }
    return live;
  }
}

/** Traces `p` through `table` (see the module doc). Outcomes with the same ending are merged. */
export function traceNftables(table: NftTable, p: TracePacket): NftTrace {
  const t = new NftTracer(table, p);
  const merged = new Map<string, NftTraceOutcome & { probability: number }>();
  const done = (verdict: TraceVerdict, s: State) => {
    const endpoint = verdict === "dnat" ? s.dnat : null;
    const masq = verdict === "dnat" && s.masq;
    const key = `${verdict}|${endpoint}|${masq}`;
    const o = merged.get(key);
    if (o) merged.set(key, { ...o, probability: o.probability + s.prob });
    else merged.set(key, { verdict, endpoint, masqueraded: masq, probability: s.prob, steps: s.steps });
  };
  const start: State = { prob: 1, mark: 0n, dnat: null, dst: p.dst, dport: p.dport, masq: false, steps: [] };
  const first = t.pass(p.from === "node" ? "output" : "prerouting", [start], done);
  const routed: State[] = [];
  for (const st of first) {
    if (p.from === "node") routed.push(...(t.local(st.dst) ? t.pass("input", [st], done) : [st]));
    else routed.push(...t.pass(t.local(st.dst) ? "input" : "forward", [st], done));
  }
  for (const st of t.pass("postrouting", routed, done)) done(st.dnat !== null ? "dnat" : "untouched", st);
  const outcomes = [...merged.values()].sort((a, b) =>
    b.probability - a.probability || String(a.endpoint).localeCompare(String(b.endpoint))
  );
  return { outcomes, assumptions: [...t.assumptions] };
}

/** One trace as text: each outcome with its share and the rules it matched. */
export function formatNftTrace(t: NftTrace, indent = "  "): string[] {
  return formatOutcomes(t, (st) => `${st.chain} #${st.index}: ${st.rule}`, indent);
}

/** Whether two traces end the same (verdicts, endpoints, masquerading and shares). */
export function sameNftOutcome(a: NftTrace, b: NftTrace): boolean {
  const key = (t: NftTrace) =>
    t.outcomes.map((o) => `${o.verdict} ${o.endpoint} ${o.masqueraded} ${o.probability.toFixed(4)}`).sort()
      .join(";");
  return key(a) === key(b);
}
