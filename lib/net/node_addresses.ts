/**
 * The node's own addresses (`ip -j addr show`) and `nodePortAddresses` (upstream
 * `pkg/proxy/util/nodeport_addresses.go`): which node IPs accept NodePort traffic, for every dataplane and the
 * health-check node ports.
 * @module
 */

import type { CommandRunner } from "../exec.ts";
import type { Logger } from "../log.ts";
import { cidrContains, type IPFamily, ipValue, isLoopback } from "./ip.ts";

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
 * `nodeIPs` (the first IP of the family), `localhost` `127.0.0.0/8` / `::1/128`, `all` the zero CIDR (v1.37).
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
    // v1.37's keywords (#138427, `expandNodePortAddressKeywords`): loopback and zero CIDRs of both families.
    if (e === "localhost") {
      cidrs.push(v6 ? "::1/128" : "127.0.0.0/8");
      continue;
    }
    if (e === "all") {
      cidrs.push(v6 ? "::/0" : "0.0.0.0/0");
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

/**
 * The node IPs that accept NodePort traffic (upstream's proxier `GetNodeIPs` at every full sync): none listed
 * when `nodePortAddresses` matches every address; else the local addresses (`given`, or read with `ip`) inside
 * the CIDRs. A failed read is logged as upstream logs it and gives none.
 */
export async function nodePortIPs(
  npa: NodePortAddresses,
  runner: CommandRunner,
  log: Logger,
  given?: readonly string[],
): Promise<string[]> {
  if (npa.matchAll) return [];
  let addrs = given;
  if (!addrs) {
    try {
      addrs = await readLocalAddresses(runner, npa.family);
    } catch (err) {
      log.error(
        "Failed to get node ip address matching nodeport cidrs, services with nodeport may not work as intended",
        err,
        { CIDRs: npa.cidrs },
      );
      addrs = [];
    }
  }
  return nodeIPsMatching(npa, addrs);
}

/**
 * The node IP of a family as upstream's detectNodeIPs picks it: a specific (non-wildcard) `bindAddress` of
 * the family wins over the Node object's IPs (`nodeIPs`, primary first). Null when neither has one. Every
 * mode uses it where upstream uses the proxier's nodeIP (e.g. the loadBalancerSourceRanges self-allow).
 */
export function familyNodeIP(
  family: IPFamily,
  bindAddress: string | undefined,
  nodeIPs: readonly string[],
): string | null {
  const b = bindAddress !== undefined ? ipValue(bindAddress) : null;
  if (b && b.family === family && b.value !== 0n) return bindAddress!;
  return nodeIPs.find((ip) => ipValue(ip)?.family === family) ?? null;
}

/**
 * Where the per-service health-check node ports listen, as upstream: the node addresses matching
 * nodePortAddresses in each served family (loopback excluded), or the wildcard when they match all. A
 * wildcard in both families is one dual-stack `0.0.0.0` listener.
 */
export async function healthCheckAddresses(
  runner: CommandRunner,
  families: readonly IPFamily[],
  nodePortAddresses: readonly string[],
  nodeIPs: readonly string[],
): Promise<string[]> {
  const out: string[] = [];
  for (const family of families) {
    const npa = newNodePortAddresses(family, nodePortAddresses, nodeIPs);
    if (npa.matchAll) {
      out.push(family === "IPv6" ? "::" : "0.0.0.0");
    } else {
      const addrs = await readLocalAddresses(runner, family).catch(() => []);
      out.push(...nodeIPsMatching(npa, addrs).filter((ip) => !isLoopback(ip)));
    }
  }
  return out.includes("0.0.0.0") && out.includes("::") ? ["0.0.0.0"] : out;
}
