/**
 * Object generators for the scale harness: N Services (ClusterIP / NodePort / LoadBalancer mix) with one
 * EndpointSlice of M endpoints each, and the churn step (one endpoint replaced by a fresh IP, stamped with
 * the `endpoints.kubernetes.io/last-change-trigger-time` annotation).
 * @module
 */
import type { KubeObject } from "../lib/kube/types.ts";

/** Namespace of every generated object. */
export const SCALE_NAMESPACE = "scale";
/** Target port of every endpoint (appears as `--to-destination IP:8080` in the payload). */
export const TARGET_PORT = 8080;
const TRIGGER = "endpoints.kubernetes.io/last-change-trigger-time";

/** `base.(hi).(mid).(lo)` from a counter: a /8-style address space starting at `a.b.0.0`. */
function ipFrom(a: number, b: number, n: number): string {
  return `${a}.${b + (n >> 16)}.${(n >> 8) & 255}.${n & 255}`;
}

/** Service type of index i: 80 % ClusterIP, 10 % NodePort, 10 % LoadBalancer. */
export function serviceType(i: number): "ClusterIP" | "NodePort" | "LoadBalancer" {
  const m = i % 10;
  return m === 8 ? "NodePort" : m === 9 ? "LoadBalancer" : "ClusterIP";
}

/**
 * A node port no other NodePort or LoadBalancer Service of the set has (up to 2768 of them, 27 680 Services),
 * as the API server's allocator guarantees; {@linkcode makeService}'s own numbering gives each NodePort/LB
 * pair one port, which the ipvs mode would program as one virtual server.
 */
export function uniqueNodePort(i: number): number {
  return 30000 + (2 * Math.floor(i / 10) + (i % 10 === 9 ? 1 : 0)) % 2768;
}

/**
 * A Service of the generated set. NodePorts wrap around the 30000-32767 range beyond 2768 of them;
 * `uniqueNodePorts` numbers them with {@linkcode uniqueNodePort} instead.
 */
export function makeService(i: number, opts: { uniqueNodePorts?: boolean } = {}): KubeObject {
  const type = serviceType(i);
  const spec: Record<string, unknown> = {
    type,
    clusterIP: ipFrom(10, 96, i + 1),
    clusterIPs: [ipFrom(10, 96, i + 1)],
    ipFamilies: ["IPv4"],
    ipFamilyPolicy: "SingleStack",
    selector: { app: `svc-${i}` },
    ports: [{ name: "", port: 80, protocol: "TCP", targetPort: TARGET_PORT }],
  };
  if (type !== "ClusterIP") {
    (spec.ports as Record<string, unknown>[])[0].nodePort = opts.uniqueNodePorts
      ? uniqueNodePort(i)
      : 30000 + (Math.floor(i / 5) % 2768);
    spec.externalTrafficPolicy = "Cluster";
  }
  const svc: Record<string, unknown> = {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: `svc-${i}`, namespace: SCALE_NAMESPACE },
    spec,
  };
  if (type === "LoadBalancer") {
    svc.status = { loadBalancer: { ingress: [{ ip: ipFrom(198, 18, i + 1) }] } };
  }
  return svc as KubeObject;
}

/** Endpoint IP allocator (10.128.0.0/9, never reused within a run). */
export class IpPool {
  #next = 1;
  /** A fresh endpoint IP. */
  take(): string {
    return ipFrom(10, 128, this.#next++);
  }
}

/**
 * The EndpointSlice of Service i with the given endpoint IPs; `triggerMs` becomes the annotation (null: none,
 * used for the initial objects so that the agent's programming-latency histogram only holds churn).
 */
export function makeSlice(i: number, ips: readonly string[], triggerMs: number | null): KubeObject {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      name: `svc-${i}-abcde`,
      namespace: SCALE_NAMESPACE,
      labels: { "kubernetes.io/service-name": `svc-${i}`, "endpointslice.kubernetes.io/managed-by": "scale" },
      annotations: triggerMs === null ? {} : { [TRIGGER]: new Date(triggerMs).toISOString() },
    },
    addressType: "IPv4",
    endpoints: ips.map((ip, k) => ({
      addresses: [ip],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: `node-${(i + k) % 50}`,
    })),
    ports: [{ name: "", port: TARGET_PORT, protocol: "TCP" }],
  } as unknown as KubeObject;
}

/** The Node the agent runs as. */
export function makeNode(name: string, ip: string): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: { name, labels: { "kubernetes.io/hostname": name } },
    spec: {},
    status: { addresses: [{ type: "InternalIP", address: ip }, { type: "Hostname", address: name }] },
  } as unknown as KubeObject;
}

/** The cluster IP of Service i (as {@linkcode makeService} sets it). */
export function clusterIPOf(i: number): string {
  return ipFrom(10, 96, i + 1);
}

/** A small deterministic PRNG (mulberry32): both agents of a side-by-side run get the same churn. */
export function seededRandom(seed: number): () => number {
  let s = seed | 0;
  return () => {
    s = (s + 0x6d2b79f5) | 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
