/**
 * Local-traffic detection rendered for iptables rules (iptables and ipvs modes): whether a packet comes from a pod on this node
 * (ifLocal) or not (ifNotLocal), as iptables match arguments. The decision itself is
 * `lib/dataplane/local_traffic.ts`, shared by every mode.
 * @module
 */

import { type LocalTraffic, type LocalTrafficConfig, localTrafficFor } from "./local_traffic.ts";

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

/** The iptables match arguments for a mode-independent local-traffic decision. */
export function iptablesLocalMatch(lt: LocalTraffic): LocalTrafficDetector {
  switch (lt.kind) {
    case "none":
      return noOpLocalDetector;
    case "cidr":
      return detectLocalByCIDR(lt.cidr);
    case "interface":
      return detectLocalByBridgeInterface(lt.name);
    case "interfacePrefix":
      return detectLocalByInterfaceNamePrefix(lt.prefix);
  }
}

/** Decides and renders in one step (tests). */
export function newLocalDetector(cfg: LocalTrafficConfig): LocalTrafficDetector {
  return iptablesLocalMatch(localTrafficFor(cfg));
}
