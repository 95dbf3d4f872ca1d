/**
 * The shape of an explanation, finding the Service port a packet is for, and notes about endpoint selection
 * (the model's facts explain adds to the tracer's path).
 * @module
 */
import { type IPFamily, isLoopback } from "../net/ip.ts";
import type { EndpointInfo, Protocol, ProxySnapshot, ServicePortState } from "../proxy/types.ts";
import type { SplitPath } from "./explain_path.ts";

/** Where a packet enters the node. */
export type PacketOrigin = "pod" | "node" | "outside";

/** How the packet reaches a service port. */
export type AccessKind = "clusterIP" | "externalIP" | "loadBalancer" | "nodePort";

/** An endpoint the packet can reach. */
export interface EndpointChoice {
  readonly endpoint: string;
  readonly ip: string;
  /** The endpoint's node (`""` when the slice does not say or the endpoint is not in the model). */
  readonly nodeName: string;
  readonly local: boolean;
  /** Chance for a new connection, or null when the scheduler decides otherwise than uniformly. */
  readonly probability: number | null;
  /** The chain or real server it goes through. */
  readonly via: string;
  /** The packet's source is this endpoint (hairpin). */
  readonly hairpin: boolean;
  /** The tracer's answer for this endpoint: the packet leaves masqueraded. */
  readonly masqueraded: boolean;
}

/** The outcome. */
export type VerdictKind = "dnat" | "reject" | "drop" | "untouched";

/** Everything explain says about one packet. */
export interface Explanation {
  readonly mode: string;
  readonly family: IPFamily;
  readonly packet: string;
  /** Where it enters and how that was decided. */
  readonly origin: string;
  /** The service port it is for (`demo/web:http`), null when none. */
  readonly service: string | null;
  readonly access: AccessKind | null;
  /** `ClusterIP 10.96.0.10:80/TCP`. */
  readonly address: string | null;
  /** The rules the packet matches, as the tracer walked them. */
  readonly path: SplitPath;
  readonly verdict: { readonly kind: VerdictKind; readonly reason: string };
  readonly endpoints: readonly EndpointChoice[];
  /** Null when the packet is not DNATed. */
  readonly masquerade: { readonly masqueraded: boolean; readonly reason: string } | null;
  readonly affinity: string | null;
  readonly notes: readonly string[];
  /** What the tracer could not know and assumed. */
  readonly assumptions: readonly string[];
  /** The chains, sets and maps the path touches (compared with the kernel's by `explain --live`). */
  readonly objects: readonly string[];
}

/** The `host:port` text of an address. */
export function hostPort(ip: string, port: number): string {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** `demo/web:http` and its address description for a match. */
export function describeMatch(st: ServicePortState, access: AccessKind, dst: string, port: number): string {
  const label = access === "clusterIP"
    ? "ClusterIP"
    : access === "externalIP"
    ? "externalIP"
    : access === "loadBalancer"
    ? "LoadBalancer IP"
    : "NodePort";
  return `${label} ${hostPort(dst, port)}/${st.info.protocol}`;
}

/**
 * The service port a packet is for, by the Services' addresses alone (which Service owns the address; whether a
 * rule takes the packet is the tracer's answer): every port's ClusterIP, externalIPs and LoadBalancer IPs,
 * then a NodePort on one of the node's addresses or loopback.
 */
export function findServicePort(
  snapshot: ProxySnapshot,
  packet: { readonly destination: string; readonly port: number; readonly protocol: Protocol },
  nodeIPs: readonly string[],
): { st: ServicePortState; access: AccessKind } | null {
  const dst = packet.destination;
  for (const st of snapshot.servicePorts.values()) {
    const i = st.info;
    if (i.protocol !== packet.protocol || i.port !== packet.port) continue;
    if (i.clusterIP === dst) return { st, access: "clusterIP" };
    if (i.externalIPs.includes(dst)) return { st, access: "externalIP" };
    if (i.loadBalancerVIPs.includes(dst)) return { st, access: "loadBalancer" };
  }
  if (!isLoopback(dst) && !nodeIPs.includes(dst)) return null;
  for (const st of snapshot.servicePorts.values()) {
    if (st.info.protocol === packet.protocol && st.info.nodePort === packet.port) {
      return { st, access: "nodePort" };
    }
  }
  return null;
}

/** Notes on how the endpoints `eps` were selected (terminating fallback, topology, endpoints left out). */
export function selectionNotes(st: ServicePortState, eps: readonly EndpointInfo[]): string[] {
  const notes: string[] = [];
  if (eps.length > 0 && eps.every((e) => !e.ready)) {
    notes.push("every endpoint used is terminating (still serving): they are used because none is ready");
  }
  const ready = st.endpoints.filter((e) => e.ready);
  const unused = st.endpoints.filter((e) => !eps.includes(e));
  const notReady = unused.filter((e) => !e.ready && !(e.serving && e.terminating));
  if (notReady.length > 0) {
    notes.push(`not used (not ready, not serving): ${notReady.map((e) => e.endpoint).join(", ")}`);
  }
  if (
    eps.length > 0 && eps.every((e) => e.ready) && eps.length < ready.length && eps.some((e) => !e.isLocal)
  ) {
    notes.push(
      `topology-aware routing: ${eps.length} of ${ready.length} ready endpoints are used (the hints name this ` +
        "node or its zone)",
    );
  }
  return notes;
}
