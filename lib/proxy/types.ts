/**
 * The contract between the proxy core (model, endpoint selection, sync loop) and the dataplanes.
 *
 * The core turns Services and EndpointSlices into one {@linkcode ProxySnapshot} per IP family, with
 * endpoint selection already done; a {@linkcode Dataplane} only renders that snapshot into kernel state.
 * @module
 */
import type { IPFamily } from "../net/ip.ts";
import type { ServicePortPlan } from "./service_plan.ts";

/** An IP family (defined with the IP helpers; re-exported here as part of the contract). */
export type { IPFamily };

/** L4 protocols a Service port may use. */
export type Protocol = "TCP" | "UDP" | "SCTP";

/** Identifies one port of one Service: upstream's ServicePortName. */
export interface ServicePortName {
  namespace: string;
  name: string;
  /** The port's name; "" for an unnamed (single) port. */
  port: string;
  protocol: Protocol;
}

/** `ns/name` plus `:port` only when the port has a name, exactly as upstream's `ServicePortName.String()`. */
export function servicePortNameString(spn: ServicePortName): string {
  const nn = `${spn.namespace}/${spn.name}`;
  return spn.port === "" ? nn : `${nn}:${spn.port}`;
}

/** Everything the dataplanes need about one Service port in one IP family. Immutable once built. */
export interface ServicePortInfo {
  readonly name: ServicePortName;
  /** `servicePortNameString(name)`, computed once. */
  readonly nameString: string;
  /** `namespace/name` of the Service (the unit of change tracking and partial sync). */
  readonly serviceKey: string;
  readonly clusterIP: string;
  readonly port: number;
  readonly protocol: Protocol;
  /** 0 when the port has no NodePort. */
  readonly nodePort: number;
  /** externalIPs of this family. */
  readonly externalIPs: readonly string[];
  /** LoadBalancer ingress IPs of this family with ipMode VIP or unset. */
  readonly loadBalancerVIPs: readonly string[];
  /** loadBalancerSourceRanges of this family, trimmed, as CIDR strings. */
  readonly loadBalancerSourceRanges: readonly string[];
  /** ClientIP session affinity timeout in seconds; 0 when affinity is None. */
  readonly stickyMaxAgeSeconds: number;
  /** externalTrafficPolicy Local (only meaningful for externally reachable services). */
  readonly externalPolicyLocal: boolean;
  /** internalTrafficPolicy Local. */
  readonly internalPolicyLocal: boolean;
  /** spec.healthCheckNodePort, 0 when none. */
  readonly healthCheckNodePort: number;
}

/** One endpoint of one Service port, as read from an EndpointSlice. Immutable once built. */
export interface EndpointInfo {
  readonly ip: string;
  readonly port: number;
  /** `ip:port`, or `[ip]:port` for IPv6: upstream's `net.JoinHostPort`; also the sort key. */
  readonly endpoint: string;
  /** nodeName equals this node's name. */
  readonly isLocal: boolean;
  readonly ready: boolean;
  readonly serving: boolean;
  readonly terminating: boolean;
  /** Zone names from hints.forZones; null when the endpoint has no zone hints. */
  readonly zoneHints: ReadonlySet<string> | null;
  /** Node names from hints.forNodes; null when the endpoint has no node hints. */
  readonly nodeHints: ReadonlySet<string> | null;
  readonly nodeName: string;
  readonly zone: string;
}

/** The outcome of endpoint selection (upstream's CategorizeEndpoints) for one Service port. */
export interface EndpointSelection {
  /** Endpoints for Cluster-policy traffic; null when no traffic uses the Cluster policy. */
  readonly clusterEndpoints: readonly EndpointInfo[] | null;
  /** Endpoints for Local-policy traffic; null when no traffic uses the Local policy. */
  readonly localEndpoints: readonly EndpointInfo[] | null;
  /** Union of cluster and local endpoints, sorted by `endpoint`. */
  readonly allReachableEndpoints: readonly EndpointInfo[];
  /** True when the service port has any usable endpoint at all (for REJECT vs DROP decisions). */
  readonly hasAnyEndpoints: boolean;
}

/** One service port with its endpoints, the selection made for it, and the decisions every dataplane shares. */
export interface ServicePortState {
  readonly info: ServicePortInfo;
  /** All endpoints of this port and family, sorted by `endpoint`. */
  readonly endpoints: readonly EndpointInfo[];
  readonly selection: EndpointSelection;
  /** `planServicePort(info, selection)`. */
  readonly plan: ServicePortPlan;
}

/** Node facts a dataplane needs. */
export interface NodeState {
  readonly name: string;
  /** Node IPs of this family, primary first. */
  readonly ips: readonly string[];
  readonly labels: Readonly<Record<string, string>>;
}

/** Everything one sync of one IP family renders. */
export interface ProxySnapshot {
  readonly family: IPFamily;
  /**
   * Keyed by `ServicePortInfo.nameString`. The proxier brings this Map up to date in place for the next sync:
   * read it during the sync it is handed to, and copy what must outlive that sync (the states themselves are
   * never changed).
   */
  readonly servicePorts: ReadonlyMap<string, ServicePortState>;
  /**
   * `namespace/name` of the Services whose spec or endpoints changed since the last successful sync.
   * null asks for a full sync (first sync, after a failure, node topology change, periodic).
   */
  readonly changedServices: ReadonlySet<string> | null;
  readonly node: NodeState;
  /** Total number of endpoints over all service ports (large-cluster mode threshold). */
  readonly totalEndpoints: number;
  /** The cluster's ServiceCIDRs of this family (ClusterIPs outside them are unallocated); sorted. */
  readonly serviceCIDRs: readonly string[];
}

/** What a dataplane reports after applying a snapshot. */
export interface SyncResult {
  /** True when the dataplane wrote everything (full sync), false for a partial one. */
  readonly full: boolean;
  /** Bytes handed to the kernel tool(s). */
  readonly payloadBytes: number;
  /** Milliseconds spent generating the payload. */
  readonly generateMs: number;
  /** Milliseconds spent in the kernel tool(s). */
  readonly applyMs: number;
}

/** A kernel programming backend for one IP family. */
export interface Dataplane {
  readonly family: IPFamily;
  /** Applies the snapshot. Rejects on failure; the next call must then do a full sync. */
  sync(snapshot: ProxySnapshot): Promise<SyncResult>;
  /**
   * Renders the full sync of the snapshot and hands it to the kernel tool in its check mode (iptables:
   * `iptables-restore --test`; nftables: `nft -c -f -`), committing nothing and changing none of the
   * dataplane's bookkeeping (what was written, deferred deletions, sync metrics). Rejects as `sync` would when
   * the tool refuses the payload. Optional (absent in ipvs mode: ipvsadm and ipset have no check mode); used
   * by the proxier to isolate refused service ports without touching the kernel's rules.
   */
  check?(snapshot: ProxySnapshot): Promise<void>;
  /**
   * Checks for signs that the kernel state was flushed behind our back (iptables canary chains).
   * Resolves true when a full resync is needed. Optional.
   */
  needsFullSync?(): Promise<boolean>;
  /**
   * Whether the hourly full resync is skipped now (upstream v1.37's iptables large-cluster mode, #138571:
   * more than 1000 endpoints at the last sync). Optional; false when absent.
   */
  skipsPeriodicFullSync?(): boolean;
  /** Stops the dataplane's own timers (the rules stay in the kernel). Optional. */
  stop?(): void;
}

/** The updates the proxier reports (also implemented by test doubles). */
export interface ProxyHealthUpdater {
  /** A change for `family` was queued and is not applied yet. */
  queuedUpdate(family: IPFamily): void;
  /** `family` was synced successfully. */
  updated(family: IPFamily): void;
  /** Proxy health ignoring node eligibility. */
  isHealthy(): boolean;
}

/** What the proxier pushes after each sync (implemented by test doubles too). */
export interface ServiceHealthUpdater {
  /** The wanted health-check node port per Service `ns/name`. */
  syncServices(ports: ReadonlyMap<string, number>): void;
  /** The number of local ready endpoints (distinct IPs) per Service `ns/name`. */
  syncEndpoints(counts: ReadonlyMap<string, number>): void;
}
