/**
 * What the explainers of the three modes share: the packet's context, the shape of an explanation, finding the
 * service port a packet is for, and notes about endpoint selection.
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import type { LocalTraffic } from "../dataplane/local_traffic.ts";
import { cidrContains, type IPFamily, isLoopback } from "../net/ip.ts";
import type { EndpointInfo, Protocol, ProxySnapshot, ServicePortState } from "../proxy/types.ts";

/** Where a packet enters the node. */
export type PacketOrigin = "pod" | "node" | "outside";

/** How the packet reaches a service port. */
export type AccessKind = "clusterIP" | "externalIP" | "loadBalancer" | "nodePort";

/** One step of the path, with the rule objects (chains, maps, sets, virtual servers) it names. */
export interface Step {
  readonly text: string;
  readonly names: readonly string[];
}

/** An endpoint the packet can reach. */
export interface EndpointChoice {
  readonly endpoint: string;
  readonly ip: string;
  /** The endpoint's node (`""` when the slice does not say). */
  readonly nodeName: string;
  readonly local: boolean;
  /** Chance for a new connection, or null when the scheduler decides otherwise than uniformly. */
  readonly probability: number | null;
  /** The chain or real server it goes through. */
  readonly via: string;
  /** The packet's source is this endpoint: it is masqueraded when it lands here (hairpin). */
  readonly hairpin: boolean;
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
  readonly steps: readonly Step[];
  readonly verdict: { readonly kind: VerdictKind; readonly reason: string };
  readonly endpoints: readonly EndpointChoice[];
  /** Null when the packet is not DNATed. */
  readonly masquerade: { readonly masqueraded: boolean; readonly reason: string } | null;
  readonly affinity: string | null;
  readonly notes: readonly string[];
  /** Names cited in the steps that the rendered rules do not contain (a bug when not empty). */
  readonly unknownNames: readonly string[];
}

/** What every mode's explainer gets. */
export interface ExplainContext {
  readonly opts: ProxyOptions;
  readonly snapshot: ProxySnapshot;
  readonly family: IPFamily;
  readonly src: string;
  readonly dst: string;
  readonly port: number;
  readonly protocol: Protocol;
  readonly proto: string;
  readonly from: PacketOrigin;
  readonly inInterface: string;
  /** The node's addresses of this family (primary first), without loopback. */
  readonly nodeIPs: readonly string[];
  /** How local traffic is told apart in this family. */
  readonly localTraffic: LocalTraffic;
  /** The packet counts as local (pod) traffic; null when the family has no local-traffic detection. */
  readonly isLocalTraffic: boolean | null;
  /** Why {@linkcode isLocalTraffic} is what it is, in words. */
  readonly localWhy: string;
}

/** What a mode's explainer returns (explainPacket adds the packet and origin). */
export type ModeExplanation = Omit<Explanation, "mode" | "family" | "packet" | "origin" | "unknownNames">;

/** Is `ip` an address of this node (a node IP or loopback)? */
export function isNodeAddress(ctx: ExplainContext, ip: string): boolean {
  return isLoopback(ip) || ctx.nodeIPs.includes(ip);
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
 * The service port a packet is for, in the order the rules look: every port's ClusterIP, externalIPs and
 * LoadBalancer IPs (in the rules' order), then NodePorts on the addresses `acceptsNodePort` allows.
 */
export function findServicePort(
  ctx: ExplainContext,
  acceptsNodePort: (dst: string) => boolean,
): { st: ServicePortState; access: AccessKind } | null {
  for (const st of ctx.snapshot.servicePorts.values()) {
    const i = st.info;
    if (i.protocol !== ctx.protocol || i.port !== ctx.port) continue;
    if (i.clusterIP === ctx.dst) return { st, access: "clusterIP" };
    if (i.externalIPs.includes(ctx.dst)) return { st, access: "externalIP" };
    if (i.loadBalancerVIPs.includes(ctx.dst)) return { st, access: "loadBalancer" };
  }
  if (!acceptsNodePort(ctx.dst)) return null;
  for (const st of ctx.snapshot.servicePorts.values()) {
    if (st.info.protocol === ctx.protocol && st.info.nodePort === ctx.port) return { st, access: "nodePort" };
  }
  return null;
}

/** The share of each of `n` endpoints. */
export function uniform(n: number): number {
  return n > 0 ? 1 / n : 0;
}

/** The source is in a loadBalancerSourceRanges entry (or is a VIP the node may reach itself through). */
export function sourceAllowed(st: ServicePortState, src: string, nodeIP: string | null): string | null {
  const info = st.info;
  const range = info.loadBalancerSourceRanges.find((c) => cidrContains(c, src));
  if (range) return `it is in ${range}`;
  const selfAllow = nodeIP !== null && info.loadBalancerSourceRanges.some((c) => cidrContains(c, nodeIP));
  if (selfAllow && info.loadBalancerVIPs.includes(src)) {
    return `it is a LoadBalancer IP of the Service and the node IP ${nodeIP} is in the source ranges`;
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
