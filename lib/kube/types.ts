/**
 * Wire types of the Kubernetes objects kube-proxy reads and writes, as JSON arrives from the API server.
 *
 * These are deliberately our own minimal views rather than client-node's generated classes: watch events
 * carry raw JSON (timestamps are strings, optional fields absent), and every field here is optional where
 * the API allows it to be missing, so code must handle malformed objects instead of trusting a type.
 * @module
 */

export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface ListMeta {
  resourceVersion?: string;
  continue?: string;
  remainingItemCount?: number;
}

/** Any object with metadata. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata?: ObjectMeta;
}

export interface ServicePort {
  name?: string;
  protocol?: string;
  port?: number;
  targetPort?: number | string;
  nodePort?: number;
  appProtocol?: string;
}

export interface SessionAffinityConfig {
  clientIP?: { timeoutSeconds?: number };
}

export interface ServiceSpec {
  type?: string; // ClusterIP | NodePort | LoadBalancer | ExternalName
  clusterIP?: string;
  clusterIPs?: string[];
  ipFamilies?: string[];
  ipFamilyPolicy?: string;
  ports?: ServicePort[];
  selector?: Record<string, string>;
  externalIPs?: string[];
  externalName?: string;
  loadBalancerIP?: string;
  loadBalancerSourceRanges?: string[];
  sessionAffinity?: string; // None | ClientIP
  sessionAffinityConfig?: SessionAffinityConfig;
  externalTrafficPolicy?: string; // Cluster | Local
  internalTrafficPolicy?: string; // Cluster | Local
  healthCheckNodePort?: number;
  trafficDistribution?: string;
  allocateLoadBalancerNodePorts?: boolean;
}

export interface LoadBalancerIngress {
  ip?: string;
  hostname?: string;
  ipMode?: string; // VIP | Proxy
}

export interface ServiceStatus {
  loadBalancer?: { ingress?: LoadBalancerIngress[] };
}

export interface Service extends KubeObject {
  spec?: ServiceSpec;
  status?: ServiceStatus;
}

export interface EndpointConditions {
  ready?: boolean | null;
  serving?: boolean | null;
  terminating?: boolean | null;
}

export interface EndpointHints {
  forZones?: { name: string }[];
  forNodes?: { name: string }[];
}

export interface Endpoint {
  addresses?: string[];
  conditions?: EndpointConditions;
  hostname?: string;
  nodeName?: string;
  zone?: string;
  hints?: EndpointHints;
  targetRef?: { kind?: string; namespace?: string; name?: string; uid?: string };
}

export interface EndpointPort {
  name?: string | null;
  protocol?: string | null;
  port?: number | null;
  appProtocol?: string;
}

export interface EndpointSlice extends KubeObject {
  addressType?: string; // IPv4 | IPv6 | FQDN
  endpoints?: Endpoint[] | null;
  ports?: EndpointPort[] | null;
}

export interface NodeAddress {
  type?: string; // InternalIP | ExternalIP | Hostname ...
  address?: string;
}

export interface Taint {
  key?: string;
  value?: string;
  effect?: string;
}

export interface Node extends KubeObject {
  spec?: { podCIDR?: string; podCIDRs?: string[]; taints?: Taint[]; unschedulable?: boolean };
  status?: { addresses?: NodeAddress[] };
}

/** networking.k8s.io/v1 ServiceCIDR: a range ClusterIPs are allocated from. */
export interface ServiceCIDR extends KubeObject {
  spec?: { cidrs?: string[] };
}

/** A list response (ServiceList, EndpointSliceList, NodeList). */
export interface KubeList<T> {
  apiVersion?: string;
  kind?: string;
  metadata?: ListMeta;
  items?: T[];
}

/** One line of a watch stream. */
export interface WatchEvent<T = KubeObject> {
  type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR";
  object: T;
}

/** The API's error body (kind Status). */
export interface Status extends KubeObject {
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
}

/** An events.k8s.io/v1 Event. */
export interface KubeEvent extends KubeObject {
  eventTime?: string;
  reportingController?: string;
  reportingInstance?: string;
  action?: string;
  reason?: string;
  regarding?: { kind?: string; apiVersion?: string; name?: string; namespace?: string; uid?: string };
  note?: string;
  type?: string; // Normal | Warning
  series?: { count: number; lastObservedTime: string };
}

/** Label on EndpointSlices naming their Service. */
export const LABEL_SERVICE_NAME = "kubernetes.io/service-name";
/** Opt-out label: objects carrying it (any value) are ignored by the default kube-proxy. */
export const LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name";
/** Label set by the EndpointSlice controller on headless services' slices. */
export const LABEL_HEADLESS = "service.kubernetes.io/headless";
/** Node label giving the topology zone. */
export const LABEL_TOPOLOGY_ZONE = "topology.kubernetes.io/zone";
/** Annotation with the time of the change that triggered an EndpointSlice update. */
export const ANNOTATION_LAST_CHANGE_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time";
