/**
 * Small IP and CIDR helpers with Go's `netutils.ParseIPSloppy` / `ParseCIDRSloppy` leniency (IPv4 octets
 * may carry leading zeros) and Go's canonical printing (IPv6 compressed and lower case, CIDRs masked).
 * @module
 */
/** An IP family, spelled as upstream's metrics label and the API's `ipFamilies`. */
export type IPFamily = "IPv4" | "IPv6";

/** A parsed IP: canonical text and family. */
export interface ParsedIP {
  readonly ip: string;
  readonly family: IPFamily;
}

/** A parsed CIDR: canonical masked text (`10.0.0.0/8`), family and prefix length. */
export interface ParsedCIDR {
  readonly cidr: string;
  readonly family: IPFamily;
  readonly prefix: number;
}

/**
 * Dotted-quad text (1-3 decimal digits per octet, leading zeros allowed, each at most 255) as an unsigned 32-bit
 * number, or -1 when it is not. A scan of character codes that allocates nothing: it runs for every endpoint
 * address of every EndpointSlice.
 */
export function scanIPv4(s: string): number {
  let value = 0;
  let octets = 0;
  let n = 0;
  let digits = 0;
  for (let i = 0; i <= s.length; i++) {
    const c = i < s.length ? s.charCodeAt(i) : 46; // a final "." closes the last octet
    if (c === 46) {
      if (digits === 0 || n > 255 || octets === 4) return -1;
      value = value * 256 + n;
      octets++;
      n = 0;
      digits = 0;
    } else if (c >= 48 && c <= 57) {
      if (++digits > 3) return -1;
      n = n * 10 + (c - 48);
    } else return -1;
  }
  return octets === 4 ? value : -1;
}

function parseIPv4Octets(s: string): number[] | null {
  const v = scanIPv4(s);
  return v < 0 ? null : [v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255];
}

/** True when valid dotted-quad text is already canonical (no octet with a leading zero): it can be kept as is. */
export function isCanonicalIPv4(s: string): boolean {
  for (let i = 0; i < s.length - 1; i++) {
    if (s.charCodeAt(i) === 48 && (i === 0 || s.charCodeAt(i - 1) === 46) && s.charCodeAt(i + 1) !== 46) {
      return false;
    }
  }
  return true;
}

/** An IPv4 address as an unsigned 32-bit number; null when `s` is not dotted-quad text. */
export function ipv4Number(s: string): number | null {
  const v = scanIPv4(s);
  return v < 0 ? null : v;
}

/** The dotted-quad text of an unsigned 32-bit number. */
export function formatIPv4(v: number): string {
  return `${v >>> 24}.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
}

/** Parses IPv6 text into 8 hextets; null when invalid. Accepts an embedded IPv4 tail. */
function parseIPv6Hextets(s: string): number[] | null {
  if (s.length < 2 || s.length > 45 || s.includes("%")) return null;
  let text = s;
  let tail: number[] = [];
  const lastColon = text.lastIndexOf(":");
  if (text.slice(lastColon + 1).includes(".")) {
    const v4 = parseIPv4Octets(text.slice(lastColon + 1));
    if (!v4) return null;
    tail = [(v4[0] << 8) | v4[1], (v4[2] << 8) | v4[3]];
    text = text.slice(0, lastColon + 1);
    if (!text.endsWith("::")) text = text.slice(0, -1);
  }
  const halves = text.split("::");
  if (halves.length > 2) return null;
  const parseGroups = (h: string): number[] | null => {
    if (h === "") return [];
    const out: number[] = [];
    for (const g of h.split(":")) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
      out.push(parseInt(g, 16));
    }
    return out;
  };
  const head = parseGroups(halves[0]);
  if (!head) return null;
  if (halves.length === 1) {
    const all = [...head, ...tail];
    return all.length === 8 ? all : null;
  }
  const rest = parseGroups(halves[1]);
  if (!rest) return null;
  const known = head.length + rest.length + tail.length;
  if (known > 7) return null;
  return [...head, ...new Array(8 - known).fill(0), ...rest, ...tail];
}

function formatIPv6(h: number[]): string {
  // RFC 5952 / Go: compress the longest run (length >= 2) of zero groups, first one on ties.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (h[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && h[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = h.map((x) => x.toString(16));
  if (bestStart < 0) return hex.join(":");
  return `${hex.slice(0, bestStart).join(":")}::${hex.slice(bestStart + bestLen).join(":")}`;
}

/** Parses an IP address; null when it is not one. IPv4-mapped IPv6 counts as IPv4, as in Go. */
export function parseIP(s: string): ParsedIP | null {
  if (typeof s !== "string") return null;
  if (!s.includes(":")) {
    const v = scanIPv4(s);
    if (v < 0) return null;
    return { ip: isCanonicalIPv4(s) ? s : formatIPv4(v), family: "IPv4" };
  }
  const h = parseIPv6Hextets(s);
  if (!h) return null;
  if (h.slice(0, 5).every((x) => x === 0) && h[5] === 0xffff) {
    return { ip: `${h[6] >> 8}.${h[6] & 255}.${h[7] >> 8}.${h[7] & 255}`, family: "IPv4" };
  }
  return { ip: formatIPv6(h), family: "IPv6" };
}

/** Parses a CIDR and masks the address (Go's `ipnet.String()`); null when invalid. */
export function parseCIDR(s: string): ParsedCIDR | null {
  if (typeof s !== "string") return null;
  const slash = s.indexOf("/");
  if (slash < 0) return null;
  const addr = s.slice(0, slash);
  const bits = s.slice(slash + 1);
  if (!/^[0-9]{1,3}$/.test(bits)) return null;
  const prefix = Number(bits);
  if (!addr.includes(":")) {
    const o = parseIPv4Octets(addr);
    if (!o || prefix > 32) return null;
    const masked = o.map((x, i) => {
      const keep = Math.max(0, Math.min(8, prefix - i * 8));
      return x & ((0xff << (8 - keep)) & 0xff);
    });
    return { cidr: `${masked.join(".")}/${prefix}`, family: "IPv4", prefix };
  }
  const h = parseIPv6Hextets(addr);
  if (!h || prefix > 128) return null;
  const masked = h.map((x, i) => {
    const keep = Math.max(0, Math.min(16, prefix - i * 16));
    return x & ((0xffff << (16 - keep)) & 0xffff);
  });
  return { cidr: `${formatIPv6(masked)}/${prefix}`, family: "IPv6", prefix };
}

/** The family of an IP string without validating it fully (as Go's `IsIPv6String` on valid input). */
export function familyOf(ip: string): IPFamily {
  return ip.includes(":") ? "IPv6" : "IPv4";
}

/** `net.JoinHostPort(ip, port)`: brackets around IPv6. */
export function joinHostPort(ip: string, port: number): string {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** True if `s` is an IPv4 address (leading zeros accepted, as Go's netutils.ParseIPSloppy). */
export function isIPv4(s: string): boolean {
  return parseIP(s)?.family === "IPv4";
}

/** True if `s` is an IPv6 address (no zone; an IPv4-mapped address is IPv4, as Go's `IsIPv6String`). */
export function isIPv6(s: string): boolean {
  return parseIP(s)?.family === "IPv6";
}

/** True if `s` is an IPv4 or IPv6 address. */
export function isIP(s: string): boolean {
  return parseIP(s) !== null;
}

/**
 * An address as a number, 32-bit for IPv4 and 128-bit for IPv6, for range checks. A `%zone` suffix is
 * ignored; an IPv4-mapped IPv6 address counts as IPv4. Null when `s` is not an address.
 */
export function ipValue(s: string): { family: IPFamily; value: bigint } | null {
  const pct = s.indexOf("%");
  const p = parseIP(pct >= 0 ? s.slice(0, pct) : s);
  if (!p) return null;
  let value = 0n;
  if (p.family === "IPv4") {
    for (const o of parseIPv4Octets(p.ip)!) value = (value << 8n) | BigInt(o);
  } else {
    for (const h of parseIPv6Hextets(p.ip)!) value = (value << 16n) | BigInt(h);
  }
  return { family: p.family, value };
}

/** True when `ip` lies inside `cidr` (same family only; an address without `/n` is a single-address CIDR). */
export function cidrContains(cidr: string, ip: string): boolean {
  const slash = cidr.indexOf("/");
  const base = ipValue(slash >= 0 ? cidr.slice(0, slash) : cidr);
  const addr = ipValue(ip);
  if (!base || !addr || base.family !== addr.family) return false;
  const bits = base.family === "IPv6" ? 128 : 32;
  const len = slash >= 0 ? Number(cidr.slice(slash + 1)) : bits;
  if (!Number.isInteger(len) || len < 0 || len > bits) return false;
  const shift = BigInt(bits - len);
  return (base.value >> shift) === (addr.value >> shift);
}

/** True for 127.0.0.0/8 and ::1. */
export function isLoopback(ip: string): boolean {
  const a = ipValue(ip);
  if (!a) return false;
  return a.family === "IPv6" ? a.value === 1n : (a.value >> 24n) === 127n;
}

/** Go's `net.SplitHostPort`, with Go's messages (`address x: missing port in address`). */
export function splitHostPort(hostport: string): [string, string] {
  const fail = (why: string): never => {
    throw new Error(`address ${hostport}: ${why}`);
  };
  let j = 0, k = 0;
  const i = hostport.lastIndexOf(":");
  if (i < 0) fail("missing port in address");
  let host: string;
  if (hostport[0] === "[") {
    const end = hostport.indexOf("]");
    if (end < 0) fail("missing ']' in address");
    if (end + 1 === hostport.length) fail("missing port in address");
    if (end + 1 !== i) {
      fail(hostport[end + 1] === ":" ? "too many colons in address" : "missing port in address");
    }
    host = hostport.slice(1, end);
    [j, k] = [1, end + 1];
  } else {
    host = hostport.slice(0, i);
    if (host.includes(":")) fail("too many colons in address");
  }
  if (hostport.slice(j).includes("[")) fail("unexpected '[' in address");
  if (hostport.slice(k).includes("]")) fail("unexpected ']' in address");
  return [host, hostport.slice(i + 1)];
}
