/**
 * Which packets come from pods on this node (upstream `pkg/proxy/util/localdetector.go`), decided once from
 * `detectLocalMode` and its settings for each IP family. The decision is shared by every mode; each mode
 * renders its own match from it (iptables `-s CIDR` / `-i IFACE`, nftables `ip saddr CIDR` / `iif`).
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import type { IPFamily } from "../proxy/types.ts";

/** The four `detectLocalMode` values. */
export type DetectLocalMode = "ClusterCIDR" | "NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix";

/** How local traffic is recognized; `none` when the family has no CIDR or interface to go by. */
export type LocalTraffic =
  | { readonly kind: "none" }
  | { readonly kind: "cidr"; readonly cidr: string }
  | { readonly kind: "interface"; readonly name: string }
  | { readonly kind: "interfacePrefix"; readonly prefix: string };

/** Local traffic cannot be told apart: no local/non-local rules are written. */
export const NO_LOCAL_TRAFFIC: LocalTraffic = { kind: "none" };

/** Inputs of {@linkcode localTrafficFor}. */
export interface LocalTrafficConfig {
  /** "" means ClusterCIDR, as upstream defaults it. */
  mode: DetectLocalMode | "";
  family: IPFamily;
  /** `clusterCIDR` entries (comma-split); the first of the family is used. */
  clusterCIDRs?: readonly string[];
  /** The Node's `spec.podCIDRs`; the first of the family is used. */
  podCIDRs?: readonly string[];
  bridgeInterface?: string;
  interfaceNamePrefix?: string;
}

/** Decides how local traffic of one family is recognized. */
export function localTrafficFor(cfg: LocalTrafficConfig): LocalTraffic {
  const wantV6 = cfg.family === "IPv6";
  const pick = (cidrs: readonly string[] | undefined) =>
    (cidrs ?? []).map((c) => c.trim()).find((c) => c !== "" && c.includes(":") === wantV6);
  const cidr = (c: string | undefined): LocalTraffic => c ? { kind: "cidr", cidr: c } : NO_LOCAL_TRAFFIC;
  switch (cfg.mode) {
    case "":
    case "ClusterCIDR":
      return cidr(pick(cfg.clusterCIDRs));
    case "NodeCIDR":
      return cidr(pick(cfg.podCIDRs));
    case "BridgeInterface":
      return cfg.bridgeInterface ? { kind: "interface", name: cfg.bridgeInterface } : NO_LOCAL_TRAFFIC;
    case "InterfaceNamePrefix":
      return cfg.interfaceNamePrefix
        ? { kind: "interfacePrefix", prefix: cfg.interfaceNamePrefix }
        : NO_LOCAL_TRAFFIC;
  }
}

/** {@linkcode localTrafficFor} as the agent's options configure it (`--detect-local-mode` and its inputs). */
export function configuredLocalTraffic(
  options: ProxyOptions,
  podCIDRs: readonly string[],
  family: IPFamily,
): LocalTraffic {
  return localTrafficFor({
    mode: options.detectLocalMode as DetectLocalMode,
    family,
    clusterCIDRs: options.clusterCIDRs,
    podCIDRs,
    bridgeInterface: options.config.detectLocal.bridgeInterface,
    interfaceNamePrefix: options.config.detectLocal.interfaceNamePrefix,
  });
}
