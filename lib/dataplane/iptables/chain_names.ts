/**
 * iptables chain names for service ports and endpoints, exactly as upstream kube-proxy computes them:
 * prefix + the first 16 characters of base32(sha256(servicePortName + protocol [+ endpoint])).
 *
 * Service-port names are cached (bounded); endpoint names are not: a rendered block keeps its endpoint chain
 * names and lends them to the port's next render (rules.ts), so a process-wide endpoint cache, which grew
 * with every endpoint ever seen (12.6 MiB at 10k Services × 10 endpoints), is not needed.
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

const MAX_CACHE = 500_000;
const portCache = new Map<string, ServicePortChains>();

/**
 * KUBE-SVC/SVL/EXT/FW names of a service port (`servicePortNameString`, lowercase protocol).
 * Upstream `portProtoHash(spn.String(), protocol)`.
 */
export function servicePortChains(spnString: string, protocol: string): ServicePortChains {
  const key = spnString + protocol;
  let c = portCache.get(key);
  if (c === undefined) {
    const h = hash16(key);
    c = { svc: SVC_PREFIX + h, svl: SVL_PREFIX + h, ext: EXT_PREFIX + h, fw: FW_PREFIX + h };
    if (portCache.size >= MAX_CACHE) portCache.clear();
    portCache.set(key, c);
  }
  return c;
}

/** KUBE-SEP name of one endpoint (`ip:port` / `[ip]:port`) of a service port. */
export function endpointChainName(spnString: string, protocol: string, endpoint: string): string {
  return SEP_PREFIX + hash16(spnString + protocol + endpoint);
}

/** True for the per-service chains kube-proxy owns (SVC, SVL, EXT, FW, SEP): upstream `isServiceChainName`. */
export function isServiceChainName(chain: string): boolean {
  return chain.startsWith(SVC_PREFIX) || chain.startsWith(SVL_PREFIX) || chain.startsWith(EXT_PREFIX) ||
    chain.startsWith(FW_PREFIX) || chain.startsWith(SEP_PREFIX);
}
