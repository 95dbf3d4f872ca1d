/**
 * What `nft list` (nft 1.0.6) prints, reproduced for the fake: set datatypes and element values, how a
 * set's elements wrap over lines, durations (`1d2h3m4s`) and base-chain priorities (`dstnat - 10`). Each
 * rule comes from nft's source (`src/rule.c`, `src/expression.c`, `src/datatype.c` at v1.0.6) and was
 * checked against the kernel here.
 * @module
 */
import { type AddrFamily, formatInterval, parseInterval } from "./addr.ts";
import type { ChainHook, Family } from "./objects.ts";

/** The datatypes of a set or map: one per key part (and value part). */
export interface SetDatatypes {
  readonly key: readonly string[];
  /** Value datatypes of a map; undefined for a set. */
  readonly value?: readonly string[];
}

const TYPEOF_DATATYPES: Readonly<Record<string, string>> = {
  "ip saddr": "ipv4_addr",
  "ip daddr": "ipv4_addr",
  "ip6 saddr": "ipv6_addr",
  "ip6 daddr": "ipv6_addr",
  "meta l4proto": "inet_proto",
  "ip protocol": "inet_proto",
  "ip6 nexthdr": "inet_proto",
  "th dport": "inet_service",
  "th sport": "inet_service",
  "tcp dport": "inet_service",
  "tcp sport": "inet_service",
  "udp dport": "inet_service",
  "udp sport": "inet_service",
  "sctp dport": "inet_service",
  "sctp sport": "inet_service",
  "meta mark": "mark",
  "ct mark": "mark",
  "iifname": "ifname",
  "oifname": "ifname",
  "meta iifname": "ifname",
  "meta oifname": "ifname",
  "ct state": "ct_state",
  "verdict": "verdict",
};

/**
 * Datatypes of a set/map declaration: `type` lists datatypes (`ipv4_addr . inet_service : verdict`),
 * `typeof` lists expressions (`ip saddr . th dport`), mapped to their datatypes (unknown ones stay as
 * written and are not checked).
 */
export function setDatatypes(spec: string, isTypeof: boolean): SetDatatypes {
  const [keyText, valueText] = spec.split(" : ");
  const conv = (part: string) => {
    const p = part.trim().replace(/\s+/g, " ");
    return isTypeof ? (TYPEOF_DATATYPES[p] ?? p) : p;
  };
  const key = keyText.split(" . ").map(conv);
  const value = valueText === undefined ? undefined : valueText.split(" . ").map(conv);
  return value ? { key, value } : { key };
}

const PROTOCOLS: Readonly<Record<string, number>> = {
  icmp: 1,
  igmp: 2,
  tcp: 6,
  udp: 17,
  dccp: 33,
  "ipv6-icmp": 58,
  icmpv6: 58,
  sctp: 132,
  udplite: 136,
};
const PROTOCOL_NAMES: Readonly<Record<number, string>> = {
  1: "icmp",
  2: "igmp",
  6: "tcp",
  17: "udp",
  33: "dccp",
  58: "ipv6-icmp",
  132: "sctp",
  136: "udplite",
};

const VERDICTS = new Set(["accept", "drop", "return", "continue"]);

function addrFamilyOfType(datatype: string): AddrFamily | undefined {
  return datatype === "ipv4_addr" ? 4 : datatype === "ipv6_addr" ? 6 : undefined;
}

/**
 * The canonical text of one element part of `datatype`, as nft lists it.
 * @param interval whether the set has the interval flag (prefixes and ranges allowed)
 * @returns `{ text }`, or `{ error }` saying why the value is not of that datatype
 */
export function canonicalValue(
  datatype: string,
  text: string,
  interval: boolean,
): { text: string; error?: undefined } | { text?: undefined; error: string } {
  const fam = addrFamilyOfType(datatype);
  if (fam !== undefined) {
    if (!interval && (text.includes("/") || text.includes("-"))) {
      return { error: `${datatype} value "${text}" is a prefix or range but the set has no interval flag` };
    }
    const iv = parseInterval(text, fam);
    if (!iv) return { error: `invalid ${datatype} value "${text}"` };
    return { text: formatInterval(iv) };
  }
  switch (datatype) {
    case "inet_proto": {
      const n = /^\d+$/.test(text) ? Number(text) : PROTOCOLS[text];
      if (n === undefined || n > 255) return { error: `invalid inet_proto value "${text}"` };
      return { text: PROTOCOL_NAMES[n] ?? String(n) };
    }
    case "inet_service": {
      if (!/^\d+$/.test(text) || Number(text) > 65535) {
        return { error: `invalid inet_service value "${text}"` };
      }
      return { text: String(Number(text)) };
    }
    case "mark": {
      if (!/^(?:0x[0-9a-fA-F]+|\d+)$/.test(text)) return { error: `invalid mark value "${text}"` };
      return { text: "0x" + (Number(text) >>> 0).toString(16).padStart(8, "0") };
    }
    case "ifname":
      return { text: text.startsWith('"') ? text : `"${text}"` };
    case "verdict": {
      if (VERDICTS.has(text)) return { text };
      const m = /^(jump|goto)\s+(\S+)$/.exec(text);
      if (!m) return { error: `invalid verdict "${text}"` };
      return { text: `${m[1]} ${m[2]}` };
    }
    default:
      return { text };
  }
}

/** The interval of an address key part (for overlap checks and sorting); undefined for other types. */
export function valueInterval(datatype: string, text: string): ReturnType<typeof parseInterval> {
  const fam = addrFamilyOfType(datatype);
  return fam === undefined ? undefined : parseInterval(text, fam);
}

const FIVE_PER_LINE = new Set([
  "nf_proto",
  "integer",
  "arp_op",
  "inet_proto",
  "inet_service",
  "tcp_flag",
  "dccp_pkttype",
  "mark",
  "iface_index",
  "classid",
  "uid",
  "gid",
  "ct_dir",
]);
const TWO_PER_LINE = new Set(["ipv4_addr", "ct_state", "ct_status", "pkt_type"]);

/**
 * How many elements nft prints per line in `elements = { … }` (its `calculate_delim`): 5 for integer-like
 * keys, 2 for IPv4 addresses, 1 for everything else (IPv6 addresses, concatenations).
 */
export function elementsPerLine(key: readonly string[]): number {
  if (key.length !== 1) return 1;
  if (FIVE_PER_LINE.has(key[0])) return 5;
  if (TWO_PER_LINE.has(key[0])) return 2;
  return 1;
}

/** The `elements = { … }` text for already printed elements, wrapped as nft wraps them. */
export function formatElementList(items: readonly string[], perLine: number): string {
  let out = "{ ";
  let count = 0;
  for (let i = 0; i < items.length; i++) {
    if (i > 0) {
      if (count < perLine) out += ", ";
      else {
        out += ",\n\t\t\t     ";
        count = 0;
      }
    }
    out += items[i];
    count++;
  }
  return out + " }";
}

/** A duration as nft prints it (`time_print`): `1d2h3m4s`, `59m59s996ms`; zero prints as "". */
export function formatDuration(ms: number): string {
  let rest = Math.floor(ms);
  const days = Math.floor(rest / 86_400_000);
  rest %= 86_400_000;
  const hours = Math.floor(rest / 3_600_000);
  rest %= 3_600_000;
  const minutes = Math.floor(rest / 60_000);
  rest %= 60_000;
  const seconds = Math.floor(rest / 1000);
  rest %= 1000;
  let out = "";
  if (days) out += `${days}d`;
  if (hours) out += `${hours}h`;
  if (minutes) out += `${minutes}m`;
  if (seconds) out += `${seconds}s`;
  if (rest) out += `${rest}ms`;
  return out;
}

const STD_PRIOS: readonly [number, string][] = [
  [-300, "raw"],
  [-150, "mangle"],
  [-100, "dstnat"],
  [0, "filter"],
  [50, "security"],
  [100, "srcnat"],
];
const BRIDGE_PRIOS: readonly [number, string][] = [[-300, "dstnat"], [-200, "filter"], [100, "out"], [
  300,
  "srcnat",
]];

function prioCompatible(family: Family, hook: ChainHook, name: string): boolean {
  if (family === "bridge") {
    switch (name) {
      case "dstnat":
        return hook === "prerouting";
      case "filter":
        return true;
      case "out":
        return hook === "output";
      case "srcnat":
        return hook === "postrouting";
    }
    return false;
  }
  const inetLike = family === "inet" || family === "ip" || family === "ip6";
  switch (name) {
    case "filter":
      return inetLike || family === "arp" || family === "netdev";
    case "raw":
    case "mangle":
    case "security":
      return inetLike;
    case "dstnat":
      return inetLike && hook === "prerouting";
    case "srcnat":
      return inetLike && hook === "postrouting";
  }
  return false;
}

/**
 * A base chain's priority as nft prints it (`prio2str`): the first standard priority within 10 of the
 * value, if it is valid for the family and hook, plus the offset (`dstnat - 10`, `filter`); otherwise the
 * number (`-110` in the output hook, where `dstnat` is not valid).
 */
export function formatPriority(family: Family, hook: ChainHook, value: number): string {
  for (const [std, name] of family === "bridge" ? BRIDGE_PRIOS : STD_PRIOS) {
    if (Math.abs(value - std) <= 10) {
      if (!prioCompatible(family, hook, name)) break;
      const off = value - std;
      return off > 0 ? `${name} + ${off}` : off < 0 ? `${name} - ${-off}` : name;
    }
  }
  return String(value);
}
