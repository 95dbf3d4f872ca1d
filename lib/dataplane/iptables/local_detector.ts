/**
 * Local-traffic detection for iptables rules (upstream `pkg/proxy/util/localdetector.go`): tells whether a
 * packet comes from a pod on this node (ifLocal) or not (ifNotLocal), as iptables match arguments.
 * @module
 */

import type { IPFamily } from "../../proxy/types.ts";

/** Match arguments for "from a local pod" and "not from a local pod". */
export interface LocalTrafficDetector {
  /** False for the no-op detector: no local/non-local rules are written at all. */
  readonly isImplemented: boolean;
  /** e.g. `-s 10.0.0.0/8`; "" when not implemented. */
  readonly ifLocal: string;
  /** e.g. `! -s 10.0.0.0/8`; "" when not implemented. */
  readonly ifNotLocal: string;
}

/** The detector used when no CIDR/interface is known for the family: matches nothing. */
export const noOpLocalDetector: LocalTrafficDetector = { isImplemented: false, ifLocal: "", ifNotLocal: "" };

/** ClusterCIDR / NodeCIDR modes: traffic from the CIDR is local. */
export function detectLocalByCIDR(cidr: string): LocalTrafficDetector {
  return { isImplemented: true, ifLocal: `-s ${cidr}`, ifNotLocal: `! -s ${cidr}` };
}

/** BridgeInterface mode: traffic entering through the bridge is local. */
export function detectLocalByBridgeInterface(iface: string): LocalTrafficDetector {
  return { isImplemented: true, ifLocal: `-i ${iface}`, ifNotLocal: `! -i ${iface}` };
}

/** InterfaceNamePrefix mode: traffic entering through an interface named `prefix*` is local. */
export function detectLocalByInterfaceNamePrefix(prefix: string): LocalTrafficDetector {
  return { isImplemented: true, ifLocal: `-i ${prefix}+`, ifNotLocal: `! -i ${prefix}+` };
}

/** The four `detectLocalMode` values. */
export type DetectLocalMode = "ClusterCIDR" | "NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix";

/** Inputs of {@linkcode newLocalDetector}. */
export interface LocalDetectorConfig {
  mode: DetectLocalMode | "";
  family: IPFamily;
  /** `clusterCIDR` entries (comma-split); the first of the family is used. */
  clusterCIDRs?: readonly string[];
  /** The Node's `spec.podCIDRs`; the first of the family is used. */
  podCIDRs?: readonly string[];
  bridgeInterface?: string;
  interfaceNamePrefix?: string;
}

function isV6(cidr: string): boolean {
  return cidr.includes(":");
}

/** Builds the detector for a mode and family ("" means ClusterCIDR); no-op when the family has no CIDR. */
export function newLocalDetector(cfg: LocalDetectorConfig): LocalTrafficDetector {
  const wantV6 = cfg.family === "IPv6";
  const pick = (cidrs: readonly string[] | undefined) =>
    (cidrs ?? []).map((c) => c.trim()).find((c) => c !== "" && isV6(c) === wantV6);
  switch (cfg.mode) {
    case "":
    case "ClusterCIDR": {
      const c = pick(cfg.clusterCIDRs);
      return c ? detectLocalByCIDR(c) : noOpLocalDetector;
    }
    case "NodeCIDR": {
      const c = pick(cfg.podCIDRs);
      return c ? detectLocalByCIDR(c) : noOpLocalDetector;
    }
    case "BridgeInterface":
      return cfg.bridgeInterface ? detectLocalByBridgeInterface(cfg.bridgeInterface) : noOpLocalDetector;
    case "InterfaceNamePrefix":
      return cfg.interfaceNamePrefix
        ? detectLocalByInterfaceNamePrefix(cfg.interfaceNamePrefix)
        : noOpLocalDetector;
  }
}
