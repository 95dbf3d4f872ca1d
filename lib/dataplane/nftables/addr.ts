/**
 * Address arithmetic for the nftables fake: parse IPv4/IPv6 text into numbers, print them the way `nft`
 * prints them (IPv6 through glibc's `inet_ntop` rules), and turn prefixes and ranges into intervals and
 * back (`10.0.0.0-10.255.255.255` prints as `10.0.0.0/8`, `1.2.3.4/32` as `1.2.3.4`).
 * @module
 */

/** Address family of an nft address datatype. */
export type AddrFamily = 4 | 6;

/** A closed interval of addresses `[start, end]` of one family. */
export interface AddrInterval {
  readonly family: AddrFamily;
  readonly start: bigint;
  readonly end: bigint;
}

const IPV4_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/**
 * Parses a dotted-quad IPv4 address (no leading zeros, as `inet_pton`).
 * @returns the address as a number, or undefined when the text is not an IPv4 address
 */
export function parseIPv4(text: string): bigint | undefined {
  const m = IPV4_RE.exec(text);
  if (!m) return undefined;
  let out = 0n;
  for (let i = 1; i <= 4; i++) {
    const part = m[i];
    if (part.length > 1 && part[0] === "0") return undefined;
    const n = Number(part);
    if (n > 255) return undefined;
    out = (out << 8n) | BigInt(n);
  }
  return out;
}

/**
 * Parses IPv6 text (with `::` compression and an optional embedded IPv4 tail).
 * @returns the address as a 128-bit number, or undefined when the text is not an IPv6 address
 */
export function parseIPv6(text: string): bigint | undefined {
  if (text.length < 2 || text.length > 45 || !text.includes(":")) return undefined;
  let body = text;
  const tail: number[] = [];
  const lastColon = body.lastIndexOf(":");
  const last = body.slice(lastColon + 1);
  if (last.includes(".")) {
    const v4 = parseIPv4(last);
    if (v4 === undefined) return undefined;
    tail.push(Number(v4 >> 16n), Number(v4 & 0xffffn));
    body = body.slice(0, lastColon + 1);
    if (!body.endsWith("::")) body = body.slice(0, -1);
  }
  const halves = body.split("::");
  if (halves.length > 2) return undefined;
  const groups = (h: string): number[] | undefined => {
    if (h === "") return [];
    const out: number[] = [];
    for (const g of h.split(":")) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return undefined;
      out.push(parseInt(g, 16));
    }
    return out;
  };
  const head = groups(halves[0]);
  if (!head) return undefined;
  let words: number[];
  if (halves.length === 1) {
    words = [...head, ...tail];
    if (words.length !== 8) return undefined;
  } else {
    const rest = groups(halves[1]);
    if (!rest) return undefined;
    const missing = 8 - head.length - rest.length - tail.length;
    if (missing < 1) return undefined;
    words = [...head, ...new Array(missing).fill(0), ...rest, ...tail];
  }
  let out = 0n;
  for (const w of words) out = (out << 16n) | BigInt(w);
  return out;
}

/** Prints an IPv4 address held as a number. */
export function formatIPv4(value: bigint): string {
  const n = Number(value);
  return `${(n >>> 24) & 255}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}

/**
 * Prints an IPv6 address as glibc's `inet_ntop` does (which is what `nft list` shows): lower case, the
 * first longest run of two or more zero groups compressed, and `::a.b.c.d` / `::ffff:a.b.c.d` for
 * IPv4-compatible and IPv4-mapped addresses.
 */
export function formatIPv6(value: bigint): string {
  const words: number[] = [];
  for (let i = 7; i >= 0; i--) words.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  let bestBase = -1, bestLen = 0, curBase = -1, curLen = 0;
  for (let i = 0; i < 8; i++) {
    if (words[i] === 0) {
      if (curBase === -1) {
        curBase = i;
        curLen = 1;
      } else curLen++;
      if (curLen > bestLen) {
        bestBase = curBase;
        bestLen = curLen;
      }
    } else curBase = -1;
  }
  if (bestLen < 2) bestBase = -1;
  let out = "";
  for (let i = 0; i < 8; i++) {
    if (bestBase !== -1 && i >= bestBase && i < bestBase + bestLen) {
      if (i === bestBase) out += ":";
      continue;
    }
    if (i !== 0) out += ":";
    if (i === 6 && bestBase === 0 && (bestLen === 6 || (bestLen === 5 && words[5] === 0xffff))) {
      out += formatIPv4(value & 0xffffffffn);
      return out;
    }
    out += words[i].toString(16);
  }
  if (bestBase !== -1 && bestBase + bestLen === 8) out += ":";
  return out;
}

/** Bit width of a family. */
export function familyBits(family: AddrFamily): number {
  return family === 4 ? 32 : 128;
}

/** Parses an address of the given family; undefined when it is not one. */
export function parseAddr(text: string, family: AddrFamily): bigint | undefined {
  return family === 4 ? parseIPv4(text) : parseIPv6(text);
}

/** Prints an address of the given family. */
export function formatAddr(value: bigint, family: AddrFamily): string {
  return family === 4 ? formatIPv4(value) : formatIPv6(value);
}

/** Canonical text of an address (`fd00:0::1` → `fd00::1`); undefined when it is not one of `family`. */
export function canonicalAddr(text: string, family: AddrFamily): string | undefined {
  const v = parseAddr(text, family);
  return v === undefined ? undefined : formatAddr(v, family);
}

/**
 * Parses `a.b.c.d`, `a.b.c.d/len` (host bits are masked off, as nft does) or `start-end` into an interval.
 * @returns the interval, or undefined when the text is none of these forms or the range is reversed
 */
export function parseInterval(text: string, family: AddrFamily): AddrInterval | undefined {
  const bits = familyBits(family);
  const slash = text.indexOf("/");
  if (slash !== -1) {
    const base = parseAddr(text.slice(0, slash), family);
    const lenText = text.slice(slash + 1);
    if (base === undefined || !/^\d{1,3}$/.test(lenText)) return undefined;
    const len = Number(lenText);
    if (len > bits) return undefined;
    const hostMask = (1n << BigInt(bits - len)) - 1n;
    const start = base & ~hostMask & ((1n << BigInt(bits)) - 1n);
    return { family, start, end: start | hostMask };
  }
  const dash = text.indexOf("-");
  if (dash !== -1) {
    const start = parseAddr(text.slice(0, dash), family);
    const end = parseAddr(text.slice(dash + 1), family);
    if (start === undefined || end === undefined || end < start) return undefined;
    return { family, start, end };
  }
  const one = parseAddr(text, family);
  return one === undefined ? undefined : { family, start: one, end: one };
}

/**
 * Prints an interval as `nft list` does: one address, a prefix when the interval is exactly one, or
 * `start-end`.
 */
export function formatInterval(iv: AddrInterval): string {
  if (iv.start === iv.end) return formatAddr(iv.start, iv.family);
  const size = iv.end - iv.start + 1n;
  if ((size & (size - 1n)) === 0n && (iv.start & (size - 1n)) === 0n) {
    const hostBits = size.toString(2).length - 1;
    return `${formatAddr(iv.start, iv.family)}/${familyBits(iv.family) - hostBits}`;
  }
  return `${formatAddr(iv.start, iv.family)}-${formatAddr(iv.end, iv.family)}`;
}

/** Merges overlapping and adjacent intervals (nft's auto-merge), sorted by start. */
export function mergeIntervals(list: readonly AddrInterval[]): AddrInterval[] {
  const sorted = [...list].sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0));
  const out: AddrInterval[] = [];
  for (const iv of sorted) {
    const prev = out[out.length - 1];
    if (prev && iv.start <= prev.end + 1n) {
      if (iv.end > prev.end) out[out.length - 1] = { family: prev.family, start: prev.start, end: iv.end };
    } else out.push(iv);
  }
  return out;
}

/** True when two intervals share at least one address. */
export function intervalsOverlap(a: AddrInterval, b: AddrInterval): boolean {
  return a.start <= b.end && b.start <= a.end;
}
