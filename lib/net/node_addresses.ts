/**
 * `nodePortAddresses` for the iptables dataplane (upstream `pkg/proxy/util/nodeport_addresses.go`): which node
 * IPs accept NodePort traffic, plus the small IP/CIDR helpers the renderer needs.
 * @module
 */

import type { CommandRunner } from "../exec.ts";
import type { IPFamily } from "../proxy/types.ts";

/** Parses an IPv4 or IPv6 address into a bigint (128-bit for v6); null when invalid. */
export function parseIP(ip: string): { v6: boolean; value: bigint } | null {
  if (ip.includes(":")) {
    let s = ip;
    const pct = s.indexOf("%");
    if (pct >= 0) s = s.slice(0, pct);
    // Embedded IPv4 tail (::ffff:1.2.3.4).
    const lastColon = s.lastIndexOf(":");
    const tail = s.slice(lastColon + 1);
    if (tail.includes(".")) {
      const v4 = parseIP(tail);
      if (!v4 || v4.v6) return null;
      s = s.slice(0, lastColon + 1) + ((v4.value >> 16n) & 0xffffn).toString(16) + ":" +
        (v4.value & 0xffffn).toString(16);
    }
    const halves = s.split("::");
    if (halves.length > 2) return null;
    const head = halves[0] === "" ? [] : halves[0].split(":");
    const rest = halves.length === 2 ? (halves[1] === "" ? [] : halves[1].split(":")) : [];
    const fill = halves.length === 2 ? 8 - head.length - rest.length : 0;
    if (fill < 0 || (halves.length === 1 && head.length !== 8)) return null;
    const groups = [...head, ...Array(fill).fill("0"), ...rest];
    let value = 0n;
    for (const g of groups) {
      if (!/^[0-9a-fA-F]{1,4}$/.test(g)) return null;
      value = (value << 16n) | BigInt(parseInt(g, 16));
    }
    return { v6: true, value };
  }
  const parts = ip.split(".");
  if (parts.length !== 4) return null;
  let value = 0n;
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p) || Number(p) > 255) return null;
    value = (value << 8n) | BigInt(Number(p));
  }
  return { v6: false, value };
}

/** True when `ip` lies inside `cidr` (same family only). */
export function cidrContains(cidr: string, ip: string): boolean {
  const slash = cidr.indexOf("/");
  const base = parseIP(slash >= 0 ? cidr.slice(0, slash) : cidr);
  const addr = parseIP(ip);
  if (!base || !addr || base.v6 !== addr.v6) return false;
  const bits = base.v6 ? 128 : 32;
  const len = slash >= 0 ? Number(cidr.slice(slash + 1)) : bits;
  if (!Number.isInteger(len) || len < 0 || len > bits) return false;
  const shift = BigInt(bits - len);
  return (base.value >> shift) === (addr.value >> shift);
}

/** True for 127.0.0.0/8 and ::1. */
export function isLoopback(ip: string): boolean {
  const a = parseIP(ip);
  if (!a) return false;
  return a.v6 ? a.value === 1n : (a.value >> 24n) === 127n;
}

/** The parsed `nodePortAddresses` of one family. */
export interface NodePortAddresses {
  readonly family: IPFamily;
  /** CIDRs of this family (after `primary` was rewritten). */
  readonly cidrs: readonly string[];
  /** No usable CIDR of this family, or a zero CIDR: NodePorts are accepted on every local address. */
  readonly matchAll: boolean;
  /** Some CIDR includes 127.0.0.1 (localhost NodePorts possible). */
  readonly containsIPv4Loopback: boolean;
}

/**
 * Parses `nodePortAddresses` for one family as upstream's `NewNodePortAddresses`: entries of the other family
 * are dropped; none left (or a zero CIDR) means match-all. `primary` becomes `<nodeIP>/32` or `/128` using
 * `nodeIPs` (the first IP of the family).
 */
export function newNodePortAddresses(
  family: IPFamily,
  entries: readonly string[],
  nodeIPs: readonly string[] = [],
): NodePortAddresses {
  const v6 = family === "IPv6";
  const cidrs: string[] = [];
  for (const raw of entries) {
    const e = raw.trim();
    if (e === "") continue;
    if (e === "primary") {
      const ip = nodeIPs.find((x) => x.includes(":") === v6 && !isLoopback(x));
      if (ip) cidrs.push(`${ip}/${v6 ? 128 : 32}`);
      continue;
    }
    if (e.includes(":") === v6) cidrs.push(e);
  }
  if (cidrs.length === 0) cidrs.push(v6 ? "::/0" : "0.0.0.0/0");
  let containsIPv4Loopback = false;
  let matchAll = false;
  const kept: string[] = [];
  for (const c of cidrs) {
    if (!v6 && cidrContains(c, "127.0.0.1")) containsIPv4Loopback = true;
    const len = c.slice(c.indexOf("/") + 1);
    if (len === "0") {
      matchAll = true;
      kept.length = 0;
      kept.push(c);
      break;
    }
    kept.push(c);
  }
  return { family, cidrs: kept, matchAll, containsIPv4Loopback };
}

/** Addresses of the family from `ip -j addr show` output. */
export function parseIpAddrJson(json: string, family: IPFamily): string[] {
  const want = family === "IPv6" ? "inet6" : "inet";
  const out: string[] = [];
  let links: unknown;
  try {
    links = JSON.parse(json);
  } catch {
    return out;
  }
  if (!Array.isArray(links)) return out;
  for (const link of links) {
    const infos = (link as { addr_info?: { family?: string; local?: string }[] }).addr_info ?? [];
    for (const a of infos) {
      if (a.family === want && typeof a.local === "string") out.push(a.local);
    }
  }
  return out;
}

/**
 * The local addresses of a family, from `ip -j addr show` (upstream reads the interfaces the same way).
 * @throws {CommandError} When `ip` fails.
 */
export async function readLocalAddresses(runner: CommandRunner, family: IPFamily): Promise<string[]> {
  const r = await runner.run({ cmd: "ip", args: ["-j", family === "IPv6" ? "-6" : "-4", "addr", "show"] });
  return parseIpAddrJson(r.stdout, family);
}

/** Node addresses inside the CIDRs, in interface order, deduplicated (upstream `GetNodeIPs`). */
export function nodeIPsMatching(npa: NodePortAddresses, addrs: readonly string[]): string[] {
  const out: string[] = [];
  for (const ip of addrs) {
    if (out.includes(ip)) continue;
    if (npa.cidrs.some((c) => cidrContains(c, ip))) out.push(ip);
  }
  return out;
}
