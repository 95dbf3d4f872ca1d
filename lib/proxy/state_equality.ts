/**
 * Equality of two {@linkcode ServicePortState}s as far as any dataplane renders them: the core builds new
 * state objects for a Service whenever it or its endpoints change, and a dataplane that finds an equal one
 * keeps its cached rendering.
 * @module
 */
import type { ServicePortState } from "./types.ts";

function sameEndpoints(
  a: ServicePortState["endpoints"] | null,
  b: ServicePortState["endpoints"] | null,
): boolean {
  if (a === b) return true;
  if (a === null || b === null || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i], y = b[i];
    if (
      x !== y &&
      (x.endpoint !== y.endpoint || x.isLocal !== y.isLocal || x.ready !== y.ready ||
        x.serving !== y.serving ||
        x.terminating !== y.terminating)
    ) return false;
  }
  return true;
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  if (a === b) return true;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** True when two states render identically (used when the core hands new objects for unchanged ports). */
export function sameRenderedState(a: ServicePortState, b: ServicePortState): boolean {
  if (a === b) return true;
  const x = a.info, y = b.info;
  if (
    x !== y &&
    (x.nameString !== y.nameString || x.clusterIP !== y.clusterIP || x.port !== y.port ||
      x.protocol !== y.protocol || x.nodePort !== y.nodePort || !sameList(x.externalIPs, y.externalIPs) ||
      !sameList(x.loadBalancerVIPs, y.loadBalancerVIPs) ||
      !sameList(x.loadBalancerSourceRanges, y.loadBalancerSourceRanges) ||
      x.stickyMaxAgeSeconds !== y.stickyMaxAgeSeconds || x.externalPolicyLocal !== y.externalPolicyLocal ||
      x.internalPolicyLocal !== y.internalPolicyLocal || x.healthCheckNodePort !== y.healthCheckNodePort)
  ) return false;
  const s = a.selection, t = b.selection;
  return s.hasAnyEndpoints === t.hasAnyEndpoints && sameEndpoints(s.clusterEndpoints, t.clusterEndpoints) &&
    sameEndpoints(s.localEndpoints, t.localEndpoints) &&
    sameEndpoints(s.allReachableEndpoints, t.allReachableEndpoints);
}
