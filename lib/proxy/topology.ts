/**
 * Endpoint selection, upstream's `CategorizeEndpoints` (`pkg/proxy/topology.go`): which endpoints serve
 * Cluster-policy traffic and which serve Local-policy traffic, with the serving-terminating fallback,
 * topology hints and trafficDistribution (PreferSameZone / PreferClose, PreferSameNode).
 *
 * Pure: no I/O except debug logs. Computed once per service port by the proxier and shared by every
 * dataplane.
 * @module
 */
import { LABEL_TOPOLOGY_ZONE } from "../kube/types.ts";
import { log } from "../log.ts";
import type { EndpointInfo, EndpointSelection, ServicePortInfo } from "./types.ts";

/** Options of {@linkcode categorizeEndpoints}. */
export interface CategorizeOptions {
  /**
   * Feature gate PreferSameTrafficDistribution (GA and on in v1.35): node hints (PreferSameNode) are
   * honoured only when true.
   */
  preferSameTrafficDistribution: boolean;
}

/** True when the port is reachable other than by ClusterIP: NodePort, externalIPs or LB VIPs of its family. */
export function externallyAccessible(svc: ServicePortInfo): boolean {
  return svc.nodePort !== 0 || svc.loadBalancerVIPs.length !== 0 || svc.externalIPs.length !== 0;
}

/**
 * True when some traffic to the port uses the Cluster policy: internal policy Cluster, or any external
 * access at all (eTP=Local still needs Cluster endpoints for the pod/node short-circuit).
 */
export function usesClusterEndpoints(svc: ServicePortInfo): boolean {
  return !svc.internalPolicyLocal || externallyAccessible(svc);
}

/** True when some traffic to the port uses the Local policy. */
export function usesLocalEndpoints(svc: ServicePortInfo): boolean {
  return svc.internalPolicyLocal || (svc.externalPolicyLocal && externallyAccessible(svc));
}

type TopologyMode = "" | "PreferSameZone" | "PreferSameNode";

const EMPTY: EndpointSelection = Object.freeze({
  clusterEndpoints: null,
  localEndpoints: null,
  allReachableEndpoints: Object.freeze([]) as readonly EndpointInfo[],
  hasAnyEndpoints: false,
});

/**
 * Splits a port's endpoints (sorted by `endpoint`) into Cluster and Local sets.
 *
 * - `clusterEndpoints`: usable endpoints for Cluster policy, topology applied; null when the port never
 *   uses the Cluster policy.
 * - `localEndpoints`: usable local endpoints; null when the port never uses the Local policy.
 * - `allReachableEndpoints`: the union, sorted.
 * - `hasAnyEndpoints`: some usable endpoint exists anywhere in the cluster (even when none is reachable
 *   from here): dataplanes DROP rather than REJECT in that case.
 *
 * "Usable" means Ready, falling back (separately for Cluster and Local) to Serving-and-Terminating when
 * no Ready endpoint exists. Note the distinction kept from upstream's tests: null means "this kind of
 * endpoint is not used", an empty array means "used, but none exist".
 *
 * @param endpoints All endpoints of the port in this family, sorted by `endpoint`.
 * @param svc The port.
 * @param nodeName This node's name.
 * @param nodeLabels This node's labels (only `topology.kubernetes.io/zone` is read).
 * @param opts Feature switches.
 * @returns The selection.
 * @example Usage
 * ```ts ignore
 * const sel = categorizeEndpoints(eps, svc, "node-a", { "topology.kubernetes.io/zone": "z1" },
 *   { preferSameTrafficDistribution: true });
 * ```
 */
export function categorizeEndpoints(
  endpoints: readonly EndpointInfo[],
  svc: ServicePortInfo,
  nodeName: string,
  nodeLabels: Readonly<Record<string, string>>,
  opts: CategorizeOptions,
): EndpointSelection {
  if (endpoints.length === 0) return EMPTY;

  let clusterEndpoints: EndpointInfo[] | null = null;
  let localEndpoints: EndpointInfo[] | null = null;
  let hasAnyEndpoints = false;
  let topologyMode: TopologyMode = "";
  let useServingTerminating = false;
  const usesCluster = usesClusterEndpoints(svc);
  const usesLocal = usesLocalEndpoints(svc);

  if (usesCluster) {
    const zone = nodeLabels[LABEL_TOPOLOGY_ZONE] ?? "";
    topologyMode = topologyModeFromHints(svc, endpoints, nodeName, zone, opts);
    clusterEndpoints = [];
    for (const ep of endpoints) {
      if (ep.ready && availableForTopology(ep, topologyMode, nodeName, zone)) clusterEndpoints.push(ep);
    }
    // No Ready endpoint for the chosen topology means no Ready endpoint anywhere (topology is ignored
    // when it would leave nothing), so fall back to serving-terminating endpoints.
    if (clusterEndpoints.length === 0) {
      for (const ep of endpoints) if (ep.serving && ep.terminating) clusterEndpoints.push(ep);
    }
    if (clusterEndpoints.length > 0) hasAnyEndpoints = true;
    // Every endpoint qualified (the usual case): share the port's list instead of holding a copy.
    if (clusterEndpoints.length === endpoints.length) clusterEndpoints = endpoints as EndpointInfo[];
  }

  if (!usesLocal) {
    return {
      clusterEndpoints,
      localEndpoints: null,
      allReachableEndpoints: clusterEndpoints ?? [],
      hasAnyEndpoints,
    };
  }

  let hasLocalReady = false;
  let hasLocalServingTerminating = false;
  for (const ep of endpoints) {
    if (ep.ready) {
      hasAnyEndpoints = true;
      if (ep.isLocal) hasLocalReady = true;
    } else if (ep.serving && ep.terminating) {
      hasAnyEndpoints = true;
      if (ep.isLocal) hasLocalServingTerminating = true;
    }
  }
  localEndpoints = [];
  if (hasLocalReady) {
    for (const ep of endpoints) if (ep.isLocal && ep.ready) localEndpoints.push(ep);
  } else if (hasLocalServingTerminating) {
    useServingTerminating = true;
    for (const ep of endpoints) if (ep.isLocal && ep.serving && ep.terminating) localEndpoints.push(ep);
  }

  if (!usesCluster) {
    return { clusterEndpoints: null, localEndpoints, allReachableEndpoints: localEndpoints, hasAnyEndpoints };
  }
  if (topologyMode === "" && !useServingTerminating) {
    // clusterEndpoints holds every Ready endpoint and localEndpoints only Ready ones: a superset.
    return { clusterEndpoints, localEndpoints, allReachableEndpoints: clusterEndpoints!, hasAnyEndpoints };
  }
  return {
    clusterEndpoints,
    localEndpoints,
    allReachableEndpoints: mergeSorted(clusterEndpoints!, localEndpoints),
    hasAnyEndpoints,
  };
}

/** Union of two lists sorted by `endpoint`, without duplicates, still sorted. */
function mergeSorted(a: readonly EndpointInfo[], b: readonly EndpointInfo[]): EndpointInfo[] {
  const out: EndpointInfo[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (j >= b.length) out.push(a[i++]);
    else if (i >= a.length) out.push(b[j++]);
    else if (a[i].endpoint === b[j].endpoint) {
      out.push(b[j++]);
      i++;
    } else if (a[i].endpoint < b[j].endpoint) out.push(a[i++]);
    else out.push(b[j++]);
  }
  return out;
}

/**
 * Upstream `topologyModeFromHints`: PreferSameNode when the gate is on, every Ready endpoint has node
 * hints and one names this node; else PreferSameZone when every Ready endpoint has zone hints and one
 * names this node's zone; else "" (no topology filtering).
 */
function topologyModeFromHints(
  svc: ServicePortInfo,
  endpoints: readonly EndpointInfo[],
  nodeName: string,
  zone: string,
  opts: CategorizeOptions,
): TopologyMode {
  let hasReady = false;
  let hasForNode = false;
  let allHaveNodeHints = true;
  let hasForZone = false;
  let allHaveZoneHints = true;
  for (const ep of endpoints) {
    if (!ep.ready) continue;
    hasReady = true;
    if (!ep.nodeHints || ep.nodeHints.size === 0) allHaveNodeHints = false;
    else if (ep.nodeHints.has(nodeName)) hasForNode = true;
    if (!ep.zoneHints || ep.zoneHints.size === 0) allHaveZoneHints = false;
    else if (ep.zoneHints.has(zone)) hasForZone = true;
  }
  if (!hasReady) return "";
  if (opts.preferSameTrafficDistribution) {
    if (allHaveNodeHints) {
      if (hasForNode) return "PreferSameNode";
      log.v(2).info("Ignoring same-node topology hints for service since no hints were provided for node", {
        service: svc.nameString,
        node: nodeName,
      });
    } else {
      log.v(7).info(
        "Ignoring same-node topology hints for service since one or more endpoints is missing a node hint",
        {
          service: svc.nameString,
        },
      );
    }
  }
  if (allHaveZoneHints) {
    if (hasForZone) return "PreferSameZone";
    if (zone === "") {
      log.v(2).info("Ignoring same-zone topology hints for service since node is missing label", {
        service: svc.nameString,
        label: LABEL_TOPOLOGY_ZONE,
      });
    } else {
      log.v(2).info("Ignoring same-zone topology hints for service since no hints were provided for zone", {
        service: svc.nameString,
        zone,
      });
    }
  } else {
    log.v(7).info(
      "Ignoring same-zone topology hints for service since one or more endpoints is missing a zone hint",
      {
        service: svc.nameString,
      },
    );
  }
  return "";
}

function availableForTopology(ep: EndpointInfo, mode: TopologyMode, nodeName: string, zone: string): boolean {
  switch (mode) {
    case "":
      return true;
    case "PreferSameNode":
      return ep.nodeHints?.has(nodeName) ?? false;
    case "PreferSameZone":
      return ep.zoneHints?.has(zone) ?? false;
  }
}
