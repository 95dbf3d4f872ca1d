/**
 * The per-service-port decisions every dataplane takes the same way, made once in the model from a port's
 * info and endpoint selection (upstream repeats them at the top of each proxier's per-service loop:
 * `pkg/proxy/iptables/proxier.go` and `pkg/proxy/nftables/proxier.go` agree on every one).
 *
 * Vocabulary, as upstream's: the *cluster* policy chain holds the endpoints for traffic under the Cluster
 * policy, the *local* policy chain those for the Local policy; *internal* traffic is ClusterIP traffic,
 * *external* traffic is NodePort, externalIP and LoadBalancer traffic.
 * @module
 */
import { categorizeEndpoints, type CategorizeOptions } from "./topology.ts";
import type { EndpointInfo, EndpointSelection, ServicePortInfo, ServicePortState } from "./types.ts";

/** What happens to a packet that finds no endpoint to go to. */
export type NoEndpointVerdict = "reject" | "drop";

/** The decisions for one service port in one IP family. */
export interface ServicePortPlan {
  /** The port has a NodePort, externalIPs or LoadBalancer VIPs of this family. */
  readonly externallyAccessible: boolean;
  /** externalTrafficPolicy Local applies (the Service is Local and this port is externally accessible). */
  readonly externalPolicyLocal: boolean;
  /** The service port has usable endpoints on some node (not only this one). */
  readonly hasEndpoints: boolean;
  /** The cluster policy chain exists (there are Cluster-policy endpoints). */
  readonly usesClusterPolicyChain: boolean;
  /** The local policy chain exists (there are Local-policy endpoints). */
  readonly usesLocalPolicyChain: boolean;
  /** Internal traffic goes to the local policy chain (internalTrafficPolicy Local), else to the cluster one. */
  readonly internalUsesLocalChain: boolean;
  /** External traffic ends in the local policy chain (eTP Local), else in the cluster one. */
  readonly externalUsesLocalChain: boolean;
  /** ClusterIP traffic has somewhere to go. */
  readonly hasInternalEndpoints: boolean;
  /** External traffic from outside the node has somewhere to go. */
  readonly hasExternalEndpoints: boolean;
  /**
   * The external traffic chain exists: the port is externally accessible and has endpoints somewhere. It is
   * needed even without external endpoints, for the short-circuit rules of traffic from pods and the node.
   */
  readonly usesExternalChain: boolean;
  /** The port has LoadBalancer VIPs and loadBalancerSourceRanges (nftables writes its firewall then). */
  readonly firewalled: boolean;
  /** The iptables firewall chain exists: firewalled, and endpoints (iptables rejects before it otherwise). */
  readonly usesFirewallChain: boolean;
  /** The verdict for ClusterIP traffic without endpoints; null when it has endpoints. */
  readonly internalVerdict: NoEndpointVerdict | null;
  /** The verdict for external traffic without endpoints; null when it has endpoints. */
  readonly externalVerdict: NoEndpointVerdict | null;
}

/** Makes the decisions for one port from its info and endpoint selection. */
export function planServicePort(info: ServicePortInfo, sel: EndpointSelection): ServicePortPlan {
  const externallyAccessible = info.nodePort !== 0 || info.externalIPs.length > 0 ||
    info.loadBalancerVIPs.length > 0;
  const externalPolicyLocal = info.externalPolicyLocal && externallyAccessible;
  const hasEndpoints = sel.hasAnyEndpoints;
  const hasLocal = (sel.localEndpoints?.length ?? 0) > 0;
  const hasInternalEndpoints = hasEndpoints && !(info.internalPolicyLocal && !hasLocal);
  const hasExternalEndpoints = hasEndpoints && !(externalPolicyLocal && !hasLocal);
  // With no endpoints at all, traffic is rejected; with endpoints only elsewhere under a Local policy, dropped.
  const firewalled = info.loadBalancerVIPs.length > 0 && info.loadBalancerSourceRanges.length > 0;
  const verdict = (has: boolean): NoEndpointVerdict | null => has ? null : hasEndpoints ? "drop" : "reject";
  return intern({
    externallyAccessible,
    externalPolicyLocal,
    hasEndpoints,
    usesClusterPolicyChain: (sel.clusterEndpoints?.length ?? 0) > 0,
    usesLocalPolicyChain: hasLocal,
    internalUsesLocalChain: info.internalPolicyLocal,
    externalUsesLocalChain: externalPolicyLocal,
    hasInternalEndpoints,
    hasExternalEndpoints,
    usesExternalChain: hasEndpoints && externallyAccessible,
    firewalled,
    usesFirewallChain: hasEndpoints && firewalled,
    internalVerdict: verdict(hasInternalEndpoints),
    externalVerdict: verdict(hasExternalEndpoints),
  });
}

const plans = new Map<string, ServicePortPlan>();

/** One shared (frozen) object per distinct plan: plans hold only flags, and most ports have the same few. */
function intern(p: ServicePortPlan): ServicePortPlan {
  const key = Object.values(p).join(",");
  let hit = plans.get(key);
  if (hit === undefined) plans.set(key, hit = Object.freeze(p));
  return hit;
}

/**
 * A port's state as the proxier builds it for a snapshot: its endpoints, the endpoint selection for this node
 * (upstream's CategorizeEndpoints) and the plan. Test fixtures build states through this too.
 */
export function servicePortState(
  info: ServicePortInfo,
  endpoints: readonly EndpointInfo[],
  nodeName: string,
  nodeLabels: Readonly<Record<string, string>>,
  opts: CategorizeOptions,
): ServicePortState {
  const selection = categorizeEndpoints(endpoints, info, nodeName, nodeLabels, opts);
  return { info, endpoints, selection, plan: planServicePort(info, selection) };
}
