/**
 * Reading rule text the way the fake needs to: which chains, sets, maps and counters a rule refers to,
 * and how `nft list` prints the rule back. The printer rewrites only the constructs kube-proxy's rules
 * use (listed on {@linkcode canonicalRule}); anything else is printed as written. Like upstream's test
 * tracer, this is deliberately not a general nft parser.
 * @module
 */
import { type AddrFamily, formatInterval, mergeIntervals, parseInterval } from "./addr.ts";

/** What a rule refers to by name. */
export interface RuleRefs {
  /** Targets of `jump` / `goto` (including inside anonymous verdict maps). */
  readonly chains: readonly string[];
  /** `@name` lookups; `map` when used by `vmap @x` / `map @x`, `dynamic` for `update @x` / `add @x`. */
  readonly sets: readonly { readonly name: string; readonly map: boolean; readonly dynamic: boolean }[];
  /** `counter name X`. */
  readonly counters: readonly string[];
}

/** Splits rule text into words, quoted strings and the punctuation `{`, `}` and `,`. */
export function tokenize(text: string): string[] {
  const out: string[] = [];
  const n = text.length;
  let i = 0;
  while (i < n) {
    const c = text[i];
    if (c === " " || c === "\t") {
      i++;
    } else if (c === '"') {
      let j = text.indexOf('"', i + 1);
      if (j === -1) j = n - 1;
      out.push(text.slice(i, j + 1));
      i = j + 1;
    } else if (c === "{" || c === "}" || c === ",") {
      out.push(c);
      i++;
    } else {
      let j = i + 1;
      while (j < n) {
        const d = text[j];
        if (d === " " || d === "\t" || d === "{" || d === "}" || d === "," || d === '"') break;
        j++;
      }
      out.push(text.slice(i, j));
      i = j;
    }
  }
  return out;
}

function unquote(s: string): string {
  return s.length >= 2 && s[0] === '"' && s[s.length - 1] === '"' ? s.slice(1, -1) : s;
}

const PUNCT = new Set(["{", "}", ","]);
const DYNSET_VERBS = new Set(["update", "add", "delete"]);

/** The chains, sets, maps and counters a rule refers to. */
export function ruleReferences(text: string): RuleRefs {
  const t = tokenize(text);
  const chains: string[] = [];
  const sets: { name: string; map: boolean; dynamic: boolean }[] = [];
  const counters: string[] = [];
  for (let i = 0; i < t.length; i++) {
    const w = t[i];
    if ((w === "jump" || w === "goto") && i + 1 < t.length && !PUNCT.has(t[i + 1])) {
      chains.push(unquote(t[i + 1]));
    } else if (w.length > 1 && w[0] === "@") {
      const prev = i > 0 ? t[i - 1] : "";
      sets.push({
        name: w.slice(1),
        map: prev === "vmap" || prev === "map",
        dynamic: DYNSET_VERBS.has(prev),
      });
    } else if (w === "counter" && t[i + 1] === "name" && i + 2 < t.length) {
      counters.push(unquote(t[i + 2]));
    }
  }
  return { chains, sets, counters };
}

const PROTO_NAMES: Readonly<Record<string, string>> = {
  "1": "icmp",
  "6": "tcp",
  "17": "udp",
  "33": "dccp",
  "58": "ipv6-icmp",
  "132": "sctp",
  "136": "udplite",
};
const PROTO_NUMBERS: Readonly<Record<string, number>> = Object.fromEntries(
  Object.entries(PROTO_NAMES).map(([k, v]) => [v, Number(k)]),
);

const MARK_OPS: Readonly<Record<string, string>> = {
  or: "|",
  "|": "|",
  and: "&",
  "&": "&",
  xor: "^",
  "^": "^",
};
const SELECTOR_ENDS = new Set([
  "saddr",
  "daddr",
  "l4proto",
  "dport",
  "sport",
  "state",
  "iifname",
  "oifname",
  "protocol",
  "nexthdr",
]);

function isNumber(s: string): boolean {
  return /^(?:0x[0-9a-fA-F]+|\d+)$/.test(s);
}

function hex8(s: string): string {
  return "0x" + (Number(s) >>> 0).toString(16).padStart(8, "0");
}

function addrFamilyOf(text: string): AddrFamily | undefined {
  if (/^[0-9.]+(?:\/\d+)?(?:-[0-9.]+)?$/.test(text)) return 4;
  if (/^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*(?:\/\d+)?(?:-[0-9a-fA-F:.]+)?$/.test(text)) return 6;
  return undefined;
}

/** Canonical text of one address, prefix or range literal; undefined when `text` is none. */
function canonicalAddrLiteral(text: string): string | undefined {
  const fam = addrFamilyOf(text);
  if (fam === undefined) return undefined;
  const iv = parseInterval(text, fam);
  return iv ? formatInterval(iv) : undefined;
}

/** `10.180.0.1:80` / `[fd00::1]:80` / a plain address, canonical; undefined when not one of those. */
function canonicalEndpoint(text: string): string | undefined {
  const v6 = /^\[([^\]]+)\](:\d+)?$/.exec(text);
  if (v6) {
    const a = canonicalAddrLiteral(v6[1]);
    return a === undefined ? undefined : `[${a}]${v6[2] ?? ""}`;
  }
  const v4 = /^([0-9.]+):(\d+)$/.exec(text);
  if (v4) {
    const a = canonicalAddrLiteral(v4[1]);
    return a === undefined ? undefined : `${a}:${v4[2]}`;
  }
  return canonicalAddrLiteral(text);
}

function compareKeys(a: string, b: string): number {
  const fa = addrFamilyOf(a), fb = addrFamilyOf(b);
  if (fa !== undefined && fa === fb) {
    const ia = parseInterval(a, fa), ib = parseInterval(b, fb);
    if (ia && ib) return ia.start < ib.start ? -1 : ia.start > ib.start ? 1 : 0;
  }
  const na = isNumber(a) ? Number(a) : PROTO_NUMBERS[a];
  const nb = isNumber(b) ? Number(b) : PROTO_NUMBERS[b];
  if (na !== undefined && nb !== undefined) return na - nb;
  return 0;
}

/** Prints an anonymous set's elements as nft lists them (sorted; address intervals merged). */
function anonymousSet(elements: string[][]): string[] {
  const flat = elements.map((e) => e.join(" "));
  const fam = flat.length > 0 ? addrFamilyOf(flat[0]) : undefined;
  if (fam !== undefined && flat.every((e) => addrFamilyOf(e) === fam)) {
    const ivs = flat.map((e) => parseInterval(e, fam));
    if (ivs.every((iv) => iv !== undefined)) {
      // nft makes an interval set (and merges it) only when some element is a prefix or a range.
      const interval = flat.some((e) => e.includes("/") || e.includes("-"));
      const list = interval ? mergeIntervals(ivs) : [...ivs].sort((a, b) => (a.start < b.start ? -1 : 1));
      const printed = list.map(formatInterval);
      if (elements.length === 1) return printed;
      return ["{", ...printed.flatMap((p, i) => (i === 0 ? [p] : [",", p])), "}"];
    }
  }
  if (elements.length === 1) return elements[0].map((w) => canonicalEndpoint(w) ?? w);
  const sorted = [...elements].sort((a, b) => compareKeys(a.join(" "), b.join(" ")));
  return ["{", ...sorted.flatMap((e, i) => (i === 0 ? e : [",", ...e])), "}"];
}

/** Splits the tokens of `{ … }` starting at `open` into elements; returns them and the index after `}`. */
function readBraces(t: string[], open: number): { elements: string[][]; next: number } {
  const elements: string[][] = [];
  let cur: string[] = [];
  let depth = 0;
  let i = open;
  for (; i < t.length; i++) {
    const w = t[i];
    if (w === "{") {
      depth++;
      if (depth === 1) continue;
    } else if (w === "}") {
      depth--;
      if (depth === 0) break;
    } else if (w === "," && depth === 1) {
      elements.push(cur);
      cur = [];
      continue;
    }
    cur.push(w);
  }
  if (cur.length) elements.push(cur);
  return { elements, next: i + 1 };
}

/**
 * Prints a rule as `nft list` shows it. Rewrites, each seen on nft 1.0.6 with kernel 6.18:
 * - `mark` → `meta mark`; in mark expressions `or`/`and`/`xor` → `|`/`&`/`^` and numbers → `0x%08x`;
 * - `==` after a selector is dropped (`ip daddr == X` → `ip daddr X`);
 * - address literals are canonical (`1.2.3.4/32` → `1.2.3.4`, host bits masked, IPv6 compressed);
 * - an anonymous set of one element loses its braces; otherwise elements are sorted and address
 *   intervals merged (`{ 10.0.0.0/24, 10.0.1.0/24 }` → `{ 10.0.0.0/23 }`);
 * - anonymous verdict maps are sorted by key and print `, ` without the space before the comma;
 * - `meta l4proto 6` → `meta l4proto tcp`; `iifname eth0` → `iifname "eth0"`;
 * - `counter` → `counter packets 0 bytes 0`; `counter name x` → `counter name "x"`;
 * - `dnat ip addr . port to numgen … map { … }` → `dnat ip to numgen … map { … }` (ip6 alike).
 */
export function canonicalRule(text: string): string {
  const t = tokenize(text);
  const out: string[] = [];
  let inMark = false;
  for (let i = 0; i < t.length; i++) {
    let w = t[i];
    const prev = out.length ? out[out.length - 1] : "";
    if (w === "mark" && prev !== "meta" && prev !== "ct") {
      out.push("meta", "mark");
      inMark = true;
      continue;
    }
    if (w === "mark" && prev === "meta") {
      out.push("mark");
      inMark = true;
      continue;
    }
    if (inMark) {
      if (w === "set" || w === "meta" || w === "==" || w === "!=") {
        if (w === "==" && !isNumber(out[out.length - 1] ?? "") && prev === "mark") continue;
        out.push(w);
        continue;
      }
      if (MARK_OPS[w]) {
        out.push(MARK_OPS[w]);
        continue;
      }
      if (isNumber(w)) {
        out.push(hex8(w));
        continue;
      }
      inMark = false;
    }
    if (w === "==" && SELECTOR_ENDS.has(prev)) continue;
    if (
      prev === "dnat" && (w === "ip" || w === "ip6") && t[i + 1] === "addr" && t[i + 2] === "." &&
      t[i + 3] === "port" && t[i + 4] === "to"
    ) {
      out.push(w, "to");
      i += 4;
      continue;
    }
    if (w === "{") {
      const { elements, next } = readBraces(t, i);
      if (prev === "vmap" || prev === "map") {
        const sorted = elements.every((e) => e.length > 0 && isNumber(e[0]))
          ? [...elements].sort((a, b) => Number(a[0]) - Number(b[0]))
          : elements;
        const canon = sorted.map((e) => e.map((x) => canonicalEndpoint(x) ?? x));
        out.push("{", ...canon.flatMap((e, k) => (k === 0 ? e : [",", ...e])), "}");
      } else if (prev.startsWith("@")) {
        out.push("{", ...elements.flatMap((e, k) => (k === 0 ? e : [",", ...e])), "}");
      } else {
        out.push(...anonymousSet(elements));
      }
      i = next - 1;
      continue;
    }
    if (prev === "l4proto" && PROTO_NAMES[w]) w = PROTO_NAMES[w];
    if (
      (prev === "iifname" || prev === "oifname" ||
        (prev === "!=" && /^[io]ifname$/.test(out[out.length - 2]))) &&
      w[0] !== '"' && w !== "!="
    ) {
      w = `"${w}"`;
    }
    if (w === "counter") {
      if (t[i + 1] === "name" && i + 2 < t.length) {
        out.push("counter", "name", `"${unquote(t[i + 2])}"`);
        i += 2;
      } else if (t[i + 1] === "packets") {
        out.push(w);
      } else {
        out.push("counter", "packets", "0", "bytes", "0");
      }
      continue;
    }
    out.push(canonicalEndpoint(w) ?? w);
  }
  let s = "";
  for (let k = 0; k < out.length; k++) {
    const w = out[k];
    if (k === 0) s = w;
    else if (w === ",") s += ",";
    else s += " " + w;
  }
  return s;
}
