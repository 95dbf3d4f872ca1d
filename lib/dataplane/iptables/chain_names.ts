/**
 * iptables chain names for service ports and endpoints, exactly as upstream kube-proxy computes them:
 * prefix + the first 16 characters of base32(sha256(servicePortName + protocol [+ endpoint])).
 *
 * Nothing is cached process-wide: a rendered block keeps its port's hash and its endpoints' hashes compactly
 * ({@linkcode PortChains}) and lends them to the port's next render (rules.ts), so only new endpoints are hashed.
 * @module
 */

import { base32Sha256 } from "../name_hash.ts";

/** Prefix of the Cluster-policy chain of a service port. */
export const SVC_PREFIX = "KUBE-SVC-";
/** Prefix of the Local-policy chain of a service port. */
export const SVL_PREFIX = "KUBE-SVL-";
/** Prefix of the external-destination chain of a service port. */
export const EXT_PREFIX = "KUBE-EXT-";
/** Prefix of the loadBalancerSourceRanges firewall chain of a service port. */
export const FW_PREFIX = "KUBE-FW-";
/** Prefix of an endpoint chain. */
export const SEP_PREFIX = "KUBE-SEP-";

/** First 16 characters of base32(sha256(`input`)): upstream's iptables chain hash. */
export function hash16(input: string): string {
  return base32Sha256(input, 16);
}

/** The four chain names that share one service-port hash. */
export interface ServicePortChains {
  readonly svc: string;
  readonly svl: string;
  readonly ext: string;
  readonly fw: string;
}

/** Upstream `portProtoHash(spn.String(), protocol)`: the hash shared by a port's SVC/SVL/EXT/FW chains. */
export function servicePortHash(spnString: string, protocol: string): string {
  return hash16(spnString + protocol);
}

/** The KUBE-SVC/SVL/EXT/FW names for a service-port hash. */
export function chainsOfHash(h: string): ServicePortChains {
  return { svc: SVC_PREFIX + h, svl: SVL_PREFIX + h, ext: EXT_PREFIX + h, fw: FW_PREFIX + h };
}

/**
 * KUBE-SVC/SVL/EXT/FW names of a service port (`servicePortNameString`, lowercase protocol).
 * Upstream `portProtoHash(spn.String(), protocol)`.
 */
export function servicePortChains(spnString: string, protocol: string): ServicePortChains {
  return chainsOfHash(servicePortHash(spnString, protocol));
}

/** The hash of one endpoint's KUBE-SEP chain (`ip:port` / `[ip]:port`) of a service port. */
export function endpointHash(spnString: string, protocol: string, endpoint: string): string {
  return hash16(spnString + protocol + endpoint);
}

/** KUBE-SEP name of one endpoint (`ip:port` / `[ip]:port`) of a service port. */
export function endpointChainName(spnString: string, protocol: string, endpoint: string): string {
  return SEP_PREFIX + endpointHash(spnString, protocol, endpoint);
}

/** Which of a port's own chains exist (bits of {@linkcode PortChains.kinds}), in declaration order. */
export const CHAIN_EXT = 1, CHAIN_FW = 2, CHAIN_SVC = 4, CHAIN_SVL = 8;

/**
 * The names of a service port's own nat chains, compactly: the port's hash, which of EXT/FW/SVC/SVL exist,
 * and the SEP chains' hashes (16 characters each, concatenated, one per reachable endpoint in endpoint order).
 * About 16 bytes per endpoint instead of a string per chain name; the names are made when needed.
 */
export interface PortChains {
  readonly hash: string;
  readonly kinds: number;
  readonly seps: string;
}

/** Number of SEP chains in a {@linkcode PortChains}. */
export function sepCount(pc: PortChains): number {
  return pc.seps.length >> 4;
}

/** The i-th SEP chain name of a {@linkcode PortChains}. */
export function sepName(pc: PortChains, i: number): string {
  return SEP_PREFIX + pc.seps.substring(i << 4, (i + 1) << 4);
}

/** Every chain name of a port, in declaration order (EXT, FW, SVC, SVL, then the SEP chains). */
export function chainNames(pc: PortChains): string[] {
  const out: string[] = [];
  if (pc.kinds & CHAIN_EXT) out.push(EXT_PREFIX + pc.hash);
  if (pc.kinds & CHAIN_FW) out.push(FW_PREFIX + pc.hash);
  if (pc.kinds & CHAIN_SVC) out.push(SVC_PREFIX + pc.hash);
  if (pc.kinds & CHAIN_SVL) out.push(SVL_PREFIX + pc.hash);
  for (let i = 0, n = sepCount(pc); i < n; i++) out.push(sepName(pc, i));
  return out;
}

/** Appends the names of `old`'s chains that `now` does not have to `out`. */
export function removedChainNames(old: PortChains, now: PortChains, out: string[]): void {
  if (old.hash === now.hash) {
    const gone = old.kinds & ~now.kinds;
    if (gone & CHAIN_EXT) out.push(EXT_PREFIX + old.hash);
    if (gone & CHAIN_FW) out.push(FW_PREFIX + old.hash);
    if (gone & CHAIN_SVC) out.push(SVC_PREFIX + old.hash);
    if (gone & CHAIN_SVL) out.push(SVL_PREFIX + old.hash);
  } else {
    for (const c of chainNames(old)) if (!c.startsWith(SEP_PREFIX)) out.push(c);
  }
  const n = sepCount(now);
  const keep = new Set<string>();
  for (let i = 0; i < n; i++) keep.add(now.seps.substring(i << 4, (i + 1) << 4));
  for (let i = 0, m = sepCount(old); i < m; i++) {
    const h = old.seps.substring(i << 4, (i + 1) << 4);
    if (!keep.has(h)) out.push(SEP_PREFIX + h);
  }
}

/** True for the per-service chains kube-proxy owns (SVC, SVL, EXT, FW, SEP): upstream `isServiceChainName`. */
export function isServiceChainName(chain: string): boolean {
  return chain.startsWith(SVC_PREFIX) || chain.startsWith(SVL_PREFIX) || chain.startsWith(EXT_PREFIX) ||
    chain.startsWith(FW_PREFIX) || chain.startsWith(SEP_PREFIX);
}
