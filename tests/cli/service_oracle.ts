/**
 * What a packet to a Service should meet, by the Service's semantics rather than by any mode's rules: the
 * oracle the property test holds `explain` (the packet tracer over the rules a first sync writes) against.
 * It reads the model's endpoint selection and plan (which endpoints serve Cluster and Local traffic, whether
 * there are any) and decides, as the Kubernetes documentation and upstream's proxiers do, where the packet
 * goes in each mode, with the modes' known differences spelled out:
 * - ipvs falls back to every endpoint when a Local policy finds none on this node (kubernetes#97081), and
 *   answers a virtual server without real servers with a reject;
 * - iptables rejects a firewalled LoadBalancer IP without endpoints before its source-range firewall
 *   (which it writes only with endpoints); nftables and ipvs check the source ranges first;
 * - iptables and nftables short-circuit a pod's or the node's packet to an eTP Local address to every
 *   endpoint (the node's masqueraded); ipvs does not.
 * Only the flags the property test runs with are covered: the corpus's cluster CIDR as local-traffic
 * detection, no masqueradeAll, NodePorts on every node address.
 * @module
 */
import { cidrContains } from "../../lib/net/ip.ts";
import type { EndpointInfo, ServicePortState } from "../../lib/proxy/types.ts";

/** How the packet reaches the Service port. */
export type Access = "clusterIP" | "nodePort" | "loadBalancer" | "externalIP";

/** The oracle's answer: the verdict, and for DNAT each endpoint with whether it arrives masqueraded. */
export type Expected =
  | { readonly kind: "reject" | "drop" | "untouched" }
  | { readonly kind: "dnat"; readonly endpoints: readonly { ip: string; masqueraded: boolean }[] };

/** The pod network of the corpus (`--cluster-cidr`): local traffic. */
const POD_CIDR = "10.244.0.0/16";

/** Where `mode` should take a packet from `src` (entering `from`) to port `st` by `access`. */
export function expectedOutcome(
  mode: "iptables" | "nftables" | "ipvs",
  st: ServicePortState,
  access: Access,
  src: string,
  from: "pod" | "node" | "outside",
): Expected {
  const { info, plan, selection } = st;
  const cluster = selection.clusterEndpoints ?? [];
  const local = selection.localEndpoints ?? [];
  const podSource = cidrContains(POD_CIDR, src);
  const dnat = (eps: readonly EndpointInfo[], masq: boolean): Expected => ({
    kind: "dnat",
    endpoints: eps.map((e) => ({ ip: e.ip, masqueraded: masq || e.ip === src })),
  });

  if (access === "clusterIP") {
    let eps = info.internalPolicyLocal ? local : cluster;
    if (mode === "ipvs" && eps.length === 0) eps = cluster;
    if (eps.length === 0) {
      // With no endpoints at all, rejected; with endpoints only on other nodes under iTP Local, dropped.
      return { kind: mode === "ipvs" || !plan.hasEndpoints ? "reject" : "drop" };
    }
    return dnat(eps, !podSource);
  }

  const ranges = access === "loadBalancer" ? info.loadBalancerSourceRanges : [];
  const refused = ranges.length > 0 && !ranges.some((c) => cidrContains(c, src));
  if (refused && !(mode === "iptables" && !plan.hasEndpoints)) return { kind: "drop" };
  if (!plan.hasEndpoints) return { kind: "reject" };
  if (!plan.externalPolicyLocal) return dnat(cluster, true);
  if (mode === "ipvs") return dnat(local.length > 0 ? local : cluster, false);
  if (from === "pod" && podSource) return dnat(cluster, false);
  if (from === "node") return dnat(cluster, true);
  if (local.length === 0) return { kind: "drop" };
  return dnat(local, false);
}
