/**
 * The harness of the rule parity tests (upstream_parity_test.ts on the host, ipvs_parity_vmtest.ts in the
 * IPVS VM): the corpus of Service shapes, the cluster state written through a real kube-apiserver, the
 * rounds of changes, upstream kube-proxy and the agent started side by side in two identical sandboxes, and
 * the comparison of their dumps once both have synced (testkit/rule_parity.ts normalizes and diffs).
 * @module
 */

import assert from "node:assert/strict";
import { k8sBinary, type KubeApiServer } from "../../testkit/kube_apiserver.ts";
import {
  compareRules,
  type KnownDifference,
  type Normalizer,
  type NsExec,
  type ParityResult,
  type RuleDump,
  type RuleDumper,
} from "../../testkit/rule_parity.ts";
import { listNetns, Sandbox, type SandboxProcess } from "../../testkit/sandbox.ts";
import type { EndpointSlice, KubeObject, Service } from "../../lib/kube/types.ts";
import { sleep, startSandboxAgent } from "./helpers.ts";

/** The node both proxies run as. */
export const NODE = "node1";
/** The node of the corpus's remote endpoints. */
export const OTHER_NODE = "node2";
/** The namespace of the corpus. */
export const NS = "parity";
/** Both proxies' `--cluster-cidr`. */
export const CLUSTER_CIDR = "10.244.0.0/16,fd00:10:244::/56";
/** The node's addresses (identical in both sandboxes). */
export const NODE_IP = "192.168.77.1";
/** The node's IPv6 address. */
export const NODE_IP6 = "fd00:77::1";
/** Upstream kube-proxy's API user (a static token bound to system:node-proxier). */
export const UPSTREAM_USER = "parity-upstream";
/** The agent's API user. */
export const OUR_USER = "parity-ours";
/** An iptables backend. */
export type Backend = "nft" | "legacy";
/** What a node namespace's own address on the control-plane link reads as in the dumps. */
export const CONTROL_PLANE_LINK_ADDRESS = "CONTROL-PLANE-LINK-ADDRESS";
/**
 * How long a difference between two synced, stable dumps may last before it counts: a bound on waiting for the
 * slower proxy to catch up (beside stress-ng --cpu 2 one Service's topology-hint rules differed for over 5 s in the first state), not a
 * check of speed. A difference that persists is still reported.
 */
const SETTLE_MS = 20_000;

/** A local (node1) and a remote (node2) pod address per family. */
const LOCAL4 = ["10.244.0.11", "10.244.0.12", "10.244.0.13"];
const REMOTE4 = ["10.244.1.11", "10.244.1.12", "10.244.1.13"];
const LOCAL6 = ["fd00:10:244::11", "fd00:10:244::12"];
const REMOTE6 = ["fd00:10:244:1::11", "fd00:10:244:1::12"];

/** A Service or EndpointSlice port as the corpus writes it. */
export interface PortLite {
  name: string;
  port: number;
  protocol?: "TCP" | "UDP" | "SCTP";
  targetPort?: number;
}

/** An endpoint as the corpus writes it. */
export interface EndpointLite {
  ip: string;
  node?: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  zone?: string;
  hintZones?: string[];
  hintNodes?: string[];
}

/** One case of the corpus: a Service, its EndpointSlices, and its load balancer status. */
export interface Case {
  name: string;
  /** Default {@linkcode NS}. */
  namespace?: string;
  spec: Record<string, unknown>;
  labels?: Record<string, string>;
  /** Slices: endpoints and address type; ports default to the Service's with targetPort. */
  slices?: { addressType?: "IPv4" | "IPv6"; endpoints: EndpointLite[]; ports?: PortLite[] }[];
  lbIngress?: { ip: string; ipMode?: "VIP" | "Proxy" }[];
  /** Whether kube-proxy programs it (its port keys appear in the nat table); default true. */
  programmed?: boolean;
}

const p80: PortLite[] = [{ name: "http", port: 80, targetPort: 8080 }];
/** A namespace, a Service name and a port name as long as the API allows (63, 63, 15 characters). */
const LIMITS_NS = "parity-at-the-api-name-limits-" + "n".repeat(33);
const LIMITS_NAME = "service-at-the-api-name-limits-" + "s".repeat(32);
const LIMITS_PORT = "port-name-limit";
const local = (ip: string, extra: Partial<EndpointLite> = {}) => ({ ip, node: NODE, ...extra });
const remote = (ip: string, extra: Partial<EndpointLite> = {}) => ({ ip, node: OTHER_NODE, ...extra });

/** The corpus: every Service shape kube-proxy renders, and a few it must ignore. */
export function corpus(): Case[] {
  return [
    { name: "cip", spec: { ports: p80 }, slices: [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] }] },
    {
      name: "many",
      spec: { ports: p80 },
      slices: [{ endpoints: [...LOCAL4.map((ip) => local(ip)), ...REMOTE4.map((ip) => remote(ip))] }],
    },
    {
      name: "np",
      spec: { type: "NodePort", ports: p80 },
      slices: [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] }],
    },
    {
      name: "np-local",
      spec: { type: "NodePort", externalTrafficPolicy: "Local", ports: p80 },
      slices: [{ endpoints: [local(LOCAL4[1]), remote(REMOTE4[1])] }],
    },
    {
      name: "np-local-none",
      spec: { type: "NodePort", externalTrafficPolicy: "Local", ports: p80 },
      slices: [{ endpoints: [remote(REMOTE4[1])] }],
    },
    {
      name: "lb",
      spec: { type: "LoadBalancer", ports: p80, loadBalancerSourceRanges: ["192.168.77.0/24", "10.0.0.0/8"] },
      slices: [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[2])] }],
      lbIngress: [{ ip: "203.0.113.10" }, { ip: "203.0.113.11" }],
    },
    {
      name: "lb-local",
      spec: {
        type: "LoadBalancer",
        externalTrafficPolicy: "Local",
        ports: p80,
        loadBalancerSourceRanges: ["192.168.77.0/24"],
      },
      slices: [{ endpoints: [local(LOCAL4[2]), remote(REMOTE4[0])] }],
      lbIngress: [{ ip: "203.0.113.20" }],
    },
    {
      name: "lb-noalloc",
      spec: { type: "LoadBalancer", allocateLoadBalancerNodePorts: false, ports: p80 },
      slices: [{ endpoints: [remote(REMOTE4[0])] }],
      lbIngress: [{ ip: "203.0.113.30" }],
    },
    {
      name: "lb-proxy-mode",
      spec: { type: "LoadBalancer", ports: p80 },
      slices: [{ endpoints: [remote(REMOTE4[1])] }],
      lbIngress: [{ ip: "203.0.113.40", ipMode: "Proxy" }],
    },
    {
      name: "lb-noep",
      spec: { type: "LoadBalancer", ports: p80, loadBalancerSourceRanges: ["192.168.77.0/24"] },
      slices: [{ endpoints: [] }],
      lbIngress: [{ ip: "203.0.113.50" }],
    },
    {
      name: "lb-mixed",
      spec: {
        type: "LoadBalancer",
        ports: [
          { name: "dns-tcp", port: 53, protocol: "TCP", targetPort: 5353 },
          { name: "dns-udp", port: 53, protocol: "UDP", targetPort: 5353 },
        ],
      },
      slices: [{
        endpoints: [local(LOCAL4[0])],
        ports: [
          { name: "dns-tcp", port: 5353, protocol: "TCP" },
          { name: "dns-udp", port: 5353, protocol: "UDP" },
        ],
      }],
      lbIngress: [{ ip: "203.0.113.60" }],
    },
    {
      name: "ext",
      spec: { ports: p80, externalIPs: ["198.51.100.5", "198.51.100.6"] },
      slices: [{ endpoints: [local(LOCAL4[1]), remote(REMOTE4[1])] }],
    },
    {
      name: "ext-local",
      spec: { type: "NodePort", externalTrafficPolicy: "Local", ports: p80, externalIPs: ["198.51.100.7"] },
      slices: [{ endpoints: [local(LOCAL4[1]), remote(REMOTE4[1])] }],
    },
    {
      name: "itp-local",
      spec: { ports: p80, internalTrafficPolicy: "Local" },
      slices: [{ endpoints: [local(LOCAL4[2]), remote(REMOTE4[2])] }],
    },
    {
      name: "itp-local-none",
      spec: { ports: p80, internalTrafficPolicy: "Local" },
      slices: [{ endpoints: [remote(REMOTE4[2])] }],
    },
    {
      name: "affinity",
      spec: {
        type: "NodePort",
        ports: p80,
        sessionAffinity: "ClientIP",
        sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } },
      },
      slices: [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] }],
    },
    {
      name: "affinity-local",
      spec: {
        type: "LoadBalancer",
        externalTrafficPolicy: "Local",
        ports: p80,
        sessionAffinity: "ClientIP",
      },
      slices: [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] }],
      lbIngress: [{ ip: "203.0.113.70" }],
    },
    { name: "noep", spec: { ports: p80 }, slices: [{ endpoints: [] }] },
    // Its "ns/name:port" (143 bytes) is longer than an nftables comment may be (128).
    {
      name: LIMITS_NAME,
      namespace: LIMITS_NS,
      spec: { type: "NodePort", ports: [{ name: LIMITS_PORT, port: 80, targetPort: 8080 }] },
      slices: [{ endpoints: [] }],
    },
    { name: "single", spec: { ports: p80 }, slices: [{ endpoints: [remote(REMOTE4[2])] }] },
    { name: "noslice", spec: { ports: p80 } },
    { name: "noep-np", spec: { type: "NodePort", ports: p80 }, slices: [{ endpoints: [] }] },
    {
      name: "notready",
      spec: { ports: p80 },
      slices: [{ endpoints: [local(LOCAL4[0], { ready: false, serving: false }), remote(REMOTE4[0])] }],
    },
    {
      name: "terminating",
      spec: { ports: p80 },
      slices: [{
        endpoints: [
          local(LOCAL4[0], { ready: false, serving: true, terminating: true }),
          remote(REMOTE4[0], { ready: false, serving: true, terminating: true }),
          remote(REMOTE4[1], { ready: false, serving: false, terminating: true }),
        ],
      }],
    },
    {
      name: "terminating-local",
      spec: { type: "NodePort", externalTrafficPolicy: "Local", ports: p80 },
      slices: [{
        endpoints: [
          local(LOCAL4[1], { ready: false, serving: true, terminating: true }),
          remote(REMOTE4[1]),
        ],
      }],
    },
    {
      name: "topo-zone",
      spec: { ports: p80, trafficDistribution: "PreferClose" },
      slices: [{
        endpoints: [
          local(LOCAL4[0], { zone: "zone-a", hintZones: ["zone-a"] }),
          remote(REMOTE4[0], { zone: "zone-b", hintZones: ["zone-b"] }),
          remote(REMOTE4[1], { zone: "zone-a", hintZones: ["zone-a"] }),
        ],
      }],
    },
    {
      name: "topo-zone-partial",
      spec: { ports: p80, trafficDistribution: "PreferClose" },
      slices: [{
        endpoints: [
          local(LOCAL4[0], { zone: "zone-a", hintZones: ["zone-a"] }),
          remote(REMOTE4[0], { zone: "zone-b" }),
        ],
      }],
    },
    {
      name: "topo-node",
      spec: { ports: p80, trafficDistribution: "PreferSameNode" },
      slices: [{
        endpoints: [
          local(LOCAL4[2], { zone: "zone-a", hintZones: ["zone-a"], hintNodes: [NODE] }),
          remote(REMOTE4[2], { zone: "zone-b", hintZones: ["zone-b"], hintNodes: [OTHER_NODE] }),
        ],
      }],
    },
    {
      name: "multi",
      spec: {
        type: "NodePort",
        ports: [
          { name: "http", port: 80, targetPort: 8080 },
          { name: "https", port: 443, targetPort: 8443 },
          { name: "dns", port: 53, protocol: "UDP", targetPort: 5353 },
        ],
      },
      slices: [{
        endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])],
        ports: [
          { name: "http", port: 8080 },
          { name: "https", port: 8443 },
          { name: "dns", port: 5353, protocol: "UDP" },
        ],
      }],
    },
    {
      name: "udp",
      spec: { type: "NodePort", ports: [{ name: "dns", port: 53, protocol: "UDP", targetPort: 5353 }] },
      slices: [{ endpoints: [local(LOCAL4[0])], ports: [{ name: "dns", port: 5353, protocol: "UDP" }] }],
    },
    {
      name: "sctp",
      spec: { type: "NodePort", ports: [{ name: "s", port: 3868, protocol: "SCTP", targetPort: 3868 }] },
      slices: [{
        endpoints: [local(LOCAL4[1]), remote(REMOTE4[1])],
        ports: [{ name: "s", port: 3868, protocol: "SCTP" }],
      }],
    },
    {
      name: "two-slices",
      spec: { ports: p80 },
      slices: [
        { endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] },
        { endpoints: [remote(REMOTE4[1]), local(LOCAL4[0])] },
      ],
    },
    {
      name: "dual",
      spec: {
        type: "NodePort",
        ports: p80,
        ipFamilyPolicy: "RequireDualStack",
        ipFamilies: ["IPv4", "IPv6"],
      },
      slices: [
        { addressType: "IPv4", endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] },
        { addressType: "IPv6", endpoints: [local(LOCAL6[0]), remote(REMOTE6[0])] },
      ],
    },
    {
      name: "dual-lb-local",
      spec: {
        type: "LoadBalancer",
        externalTrafficPolicy: "Local",
        ports: p80,
        ipFamilyPolicy: "RequireDualStack",
        ipFamilies: ["IPv6", "IPv4"],
        loadBalancerSourceRanges: ["fd00:77::/64", "192.168.77.0/24"],
      },
      slices: [
        { addressType: "IPv4", endpoints: [local(LOCAL4[1])] },
        { addressType: "IPv6", endpoints: [local(LOCAL6[1]), remote(REMOTE6[1])] },
      ],
      lbIngress: [{ ip: "203.0.113.80" }, { ip: "2001:db8::80" }],
    },
    {
      name: "v6",
      spec: { ports: p80, ipFamilyPolicy: "SingleStack", ipFamilies: ["IPv6"] },
      slices: [{ addressType: "IPv6", endpoints: [local(LOCAL6[0]), remote(REMOTE6[1])] }],
    },
    {
      name: "headless",
      spec: { clusterIP: "None", ports: p80 },
      slices: [{ endpoints: [local(LOCAL4[0])] }],
      programmed: false,
    },
    { name: "extname", spec: { type: "ExternalName", externalName: "example.com" }, programmed: false },
    {
      name: "other-proxy",
      labels: { "service.kubernetes.io/service-proxy-name": "someone-else" },
      spec: { ports: p80 },
      slices: [{ endpoints: [local(LOCAL4[0])] }],
      programmed: false,
    },
  ];
}

function serviceOf(c: Case): Service {
  const spec = structuredClone(c.spec) as Record<string, unknown>;
  if (spec.ports) {
    spec.ports = (spec.ports as PortLite[]).map((p) => ({ protocol: "TCP", ...p }));
  }
  spec.selector ??= c.spec.type === "ExternalName" ? undefined : { app: c.name };
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { namespace: c.namespace ?? NS, name: c.name, labels: c.labels },
    spec,
  } as Service;
}

function slicesOf(c: Case, svc: Service): EndpointSlice[] {
  return (c.slices ?? []).map((s, i) => ({
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      namespace: c.namespace ?? NS,
      name: `${c.name}-${i}`,
      labels: {
        "kubernetes.io/service-name": c.name,
        "endpointslice.kubernetes.io/managed-by": "dkp-parity-test",
        ...(c.labels ?? {}),
      },
    },
    addressType: s.addressType ?? "IPv4",
    endpoints: s.endpoints.map((e) => ({
      addresses: [e.ip],
      nodeName: e.node,
      zone: e.zone,
      conditions: {
        ready: e.ready ?? true,
        serving: e.serving ?? e.ready ?? true,
        terminating: e.terminating ?? false,
      },
      ...(e.hintZones || e.hintNodes
        ? {
          hints: {
            ...(e.hintZones ? { forZones: e.hintZones.map((name) => ({ name })) } : {}),
            ...(e.hintNodes ? { forNodes: e.hintNodes.map((name) => ({ name })) } : {}),
          },
        }
        : {}),
    })),
    ports: (s.ports ?? (svc.spec!.ports as PortLite[]).map((p) => ({
      name: p.name,
      port: p.targetPort ?? p.port,
      protocol: p.protocol,
    }))).map((p) => ({ name: p.name, port: p.port, protocol: p.protocol ?? "TCP" })),
  } as EndpointSlice));
}

/** The service port keys (`ns/name:port`) kube-proxy must program for a case. */
function portKeys(c: Case): string[] {
  if (c.programmed === false) return [];
  return ((c.spec.ports ?? []) as PortLite[]).map((p) => `${c.namespace ?? NS}/${c.name}:${p.name}`);
}

/**
 * The cluster state as the test wrote it through the API: the cases by name, and the service port keys
 * that existed once and are gone (they must disappear from both proxies' rules).
 */
export class ClusterState {
  readonly cases = new Map<string, Case>();
  readonly #gone = new Set<string>();
  /** Service port key → its cluster IPs and port as the API server allocated them (kept after removal). */
  readonly #clusterPorts = new Map<string, { protocol: string; ip: string; port: number }[]>();

  constructor(readonly api: KubeApiServer) {}

  /** Creates a case: its Service, its load balancer status (through /status), its EndpointSlices. */
  async add(c: Case): Promise<void> {
    const svc = await this.api.create(serviceOf(c));
    this.#remember(svc);
    if (c.lbIngress) await this.#setIngress(c);
    for (const sl of slicesOf(c, svc)) await this.api.create(sl);
    this.cases.set(c.name, c);
  }

  /** Deletes a case's Service and EndpointSlices. */
  async remove(name: string): Promise<void> {
    const c = this.#case(name);
    await this.api.remove(serviceOf(c));
    for (const sl of slicesOf(c, serviceOf(c))) await this.api.remove(sl);
    this.cases.delete(name);
    for (const k of portKeys(c)) this.#gone.add(k);
  }

  /**
   * Changes a case in place, as a user would: a merge patch of the Service (fields the new spec lacks are
   * removed), its status when the ingress changed, and each EndpointSlice updated, created or deleted.
   */
  async change(name: string, mutate: (c: Case) => void): Promise<void> {
    const before = this.#case(name);
    const after = structuredClone(before);
    mutate(after);
    const spec: Record<string, unknown> = { ...serviceOf(after).spec };
    for (const k of Object.keys(serviceOf(before).spec!)) if (!(k in spec)) spec[k] = null;
    const ref = { apiVersion: "v1", kind: "Service", namespace: before.namespace ?? NS, name };
    const svc = await this.api.patch<Service>(ref, { spec });
    this.#remember(svc);
    if (JSON.stringify(before.lbIngress) !== JSON.stringify(after.lbIngress)) await this.#setIngress(after);
    const [oldSlices, newSlices] = [slicesOf(before, svc), slicesOf(after, svc)];
    for (let i = 0; i < Math.max(oldSlices.length, newSlices.length); i++) {
      if (newSlices[i] && oldSlices[i]) await this.api.update(newSlices[i]);
      else if (newSlices[i]) await this.api.create(newSlices[i]);
      else await this.api.remove(oldSlices[i]);
    }
    this.cases.set(name, after);
    const keys = new Set(portKeys(after));
    for (const k of portKeys(before)) if (!keys.has(k)) this.#gone.add(k);
  }

  /** The service port keys kube-proxy must program now. */
  present(): string[] {
    return [...this.cases.values()].flatMap(portKeys);
  }

  /** Keys that were programmed once and must be gone now. */
  absent(): string[] {
    const present = new Set(this.present());
    return [...this.#gone].filter((k) => !present.has(k));
  }

  /**
   * The cluster IPs and port of a service port key (`ns/name:port`), as the API server allocated them, also
   * after the Service or the port is gone: `{protocol: "TCP", ip: "10.96.4.7", port: 80}` per family.
   */
  clusterPorts(key: string): { protocol: string; ip: string; port: number }[] {
    return this.#clusterPorts.get(key) ?? [];
  }

  #remember(svc: Service): void {
    const ips = (svc.spec?.clusterIPs ?? []).filter((ip) => ip !== "None");
    for (const p of svc.spec?.ports ?? []) {
      const key = `${svc.metadata!.namespace}/${svc.metadata!.name}:${p.name ?? ""}`;
      this.#clusterPorts.set(
        key,
        ips.map((ip) => ({ protocol: p.protocol ?? "TCP", ip, port: p.port ?? 0 })),
      );
    }
  }

  async #setIngress(c: Case): Promise<void> {
    await this.api.patchStatus({
      apiVersion: "v1",
      kind: "Service",
      namespace: c.namespace ?? NS,
      name: c.name,
    }, {
      loadBalancer: { ingress: (c.lbIngress ?? []).map((i) => ({ ip: i.ip, ipMode: i.ipMode ?? "VIP" })) },
    });
  }

  #case(name: string): Case {
    const c = this.cases.get(name);
    if (!c) throw new Error(`no case ${name}`);
    return c;
  }
}

/** A round of the comparison: changes to the cluster state made while both proxies run, then a compare. */
export interface Round {
  name: string;
  change?: (state: ClusterState) => Promise<void>;
}

/**
 * The changes made while the proxies run, one list per backend step (the second step starts from the
 * state the first left): deletions, endpoint moves, policy, affinity, type, port and family changes.
 */
export const CHANGES: Round[][] = [
  [
    {
      name: "delete, move endpoints, drop source ranges and affinity, eTP Local->Cluster, add a Service",
      change: async (st) => {
        await st.remove("cip");
        await st.change("np", (c) => c.slices = [{ endpoints: [local(LOCAL4[2]), remote(REMOTE4[2])] }]);
        await st.change("lb", (c) => {
          delete c.spec.loadBalancerSourceRanges;
          c.lbIngress = [{ ip: "203.0.113.12" }];
        });
        await st.change("affinity", (c) => {
          c.spec.sessionAffinity = "None";
          delete c.spec.sessionAffinityConfig;
        });
        await st.change("np-local", (c) => c.spec.externalTrafficPolicy = "Cluster");
        await st.change("noep", (c) => c.slices = [{ endpoints: [remote(REMOTE4[2])] }]);
        await st.change(
          "terminating",
          (c) => c.slices = [{ endpoints: [local(LOCAL4[0]), remote(REMOTE4[0])] }],
        );
        await st.change("multi", (c) => {
          c.spec.ports = (c.spec.ports as PortLite[]).filter((p) => p.name !== "https");
          c.slices![0].ports = c.slices![0].ports!.filter((p) => p.name !== "https");
        });
        await st.change("dual", (c) => c.slices = c.slices!.slice(0, 1));
        await st.add({
          name: "late",
          spec: { type: "NodePort", ports: p80, externalTrafficPolicy: "Local" },
          slices: [{ endpoints: [local(LOCAL4[1]), remote(REMOTE4[1])] }],
        });
      },
    },
  ],
  [
    {
      name:
        "re-create, iTP Local->Cluster, new external IPs, LB->ClusterIP, NodePort->LB, hints and slices go",
      change: async (st) => {
        await st.remove("late");
        await st.add(corpus().find((c) => c.name === "cip")!);
        await st.change("itp-local", (c) => delete c.spec.internalTrafficPolicy);
        await st.change("ext", (c) => c.spec.externalIPs = ["198.51.100.9"]);
        await st.change("lb-noalloc", (c) => {
          c.spec.type = "ClusterIP";
          delete c.spec.allocateLoadBalancerNodePorts;
        });
        await st.change("np", (c) => {
          c.spec.type = "LoadBalancer";
          c.lbIngress = [{ ip: "203.0.113.90" }];
        });
        await st.change("topo-zone", (c) => delete c.slices![0].endpoints[1].hintZones);
        await st.change("sctp", (c) => c.slices = []);
      },
    },
  ],
];

/** The zone label both proxies' node carries once they run (see `setNodeZone`). */
const NODE_ZONE = "zone-a";

/**
 * Sets (or, with null, removes) the node's `topology.kubernetes.io/zone` label.
 *
 * Upstream v1.37.2 can lose its node's zone for its whole life: `NewNodeTopologyConfig` adds its handler to the
 * node informer that is already running, which replays the node at once and records its labels, and the proxier
 * is registered as a listener only afterwards; when the replay wins, the proxier never hears the zone (later
 * events carry the same labels, and only changes are passed on) and programs every endpoint of a Service with
 * zone hints. So `runPair` starts both proxies on a node without the label and adds it once both have synced:
 * an update both must follow, not a start-up race.
 */
async function setNodeZone(api: KubeApiServer, zone: string | null): Promise<void> {
  const ref = { apiVersion: "v1", kind: "Node", name: NODE };
  await api.patch(ref, { metadata: { labels: { "topology.kubernetes.io/zone": zone } } });
}

/** The node object both proxies run as: dual-stack, labelled zone-a once they run (see `setNodeZone`). */
export function nodeObject(): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: {
      name: NODE,
      labels: { "kubernetes.io/hostname": NODE },
    },
    spec: { podCIDR: "10.244.0.0/24", podCIDRs: ["10.244.0.0/24", "fd00:10:244::/64"] },
    status: {
      addresses: [
        { type: "InternalIP", address: NODE_IP },
        { type: "InternalIP", address: NODE_IP6 },
        { type: "Hostname", address: NODE },
      ],
    },
  } as KubeObject;
}

/**
 * Binds both proxies' users to system:node-proxier, creates the node and the namespace, and writes the
 * corpus through the API; resolves with the state.
 */
export async function setUpCluster(api: KubeApiServer): Promise<ClusterState> {
  for (const user of [UPSTREAM_USER, OUR_USER]) {
    await api.create({
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "ClusterRoleBinding",
      metadata: { name: user },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node-proxier" },
      subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: user }],
    } as KubeObject);
  }
  await api.create(nodeObject());
  for (const ns of new Set([NS, ...corpus().map((c) => c.namespace ?? NS)])) {
    await api.create({ apiVersion: "v1", kind: "Namespace", metadata: { name: ns } });
  }
  const state = new ClusterState(api);
  for (const c of corpus()) await state.add(c);
  return state;
}

/** A directory whose `iptables*` programs are the given backend's (upstream calls plain `iptables`). */
export async function backendPath(dir: string, backend: Backend): Promise<string> {
  const bin = `${dir}/iptables-${backend}-bin`;
  try {
    await Deno.stat(bin);
    return bin;
  } catch { /* make it */ }
  await Deno.mkdir(bin, { recursive: true });
  for (const base of ["iptables", "ip6tables"]) {
    for (const suffix of ["", "-save", "-restore"]) {
      const target = await which(`${base}-${backend}${suffix}`);
      await Deno.symlink(target, `${bin}/${base}${suffix}`);
    }
  }
  return bin;
}

async function which(cmd: string): Promise<string> {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":").concat(["/usr/sbin", "/sbin"])) {
    try {
      await Deno.stat(`${dir}/${cmd}`);
      return `${dir}/${cmd}`;
    } catch { /* next */ }
  }
  throw new Error(`${cmd} not found`);
}

/** One side of a comparison: a proxy started in a sandbox's node namespace. */
export interface Proxy {
  who: string;
  /** Its API user (a static token bound to system:node-proxier). */
  user: string;
  start(sb: Sandbox, kubeconfig: string): Promise<SandboxProcess>;
}

/** A dataplane mode: how its rules are prepared, dumped, recognized and normalized. */
export interface Mode {
  name: string;
  /** Runs in each node namespace before the proxies start. */
  prepare?(sb: Sandbox): Promise<void>;
  dumper(exec: NsExec): RuleDumper;
  normalizer: Normalizer;
  /** Whether a dump (normalized sections joined by newlines) shows a service port key (`ns/name:port`). */
  names(all: string, key: string, state: ClusterState): boolean;
  known: KnownDifference[];
}

/** Upstream kube-proxy in `mode`, calling the `backend`'s iptables programs. */
export function upstreamProxy(
  api: KubeApiServer,
  proxyMode: "iptables" | "nftables" | "ipvs",
  backend: Backend,
  extraArgs: string[] = [],
): Proxy {
  return {
    who: `upstream kube-proxy (${proxyMode})`,
    user: UPSTREAM_USER,
    start: async (sb, kubeconfig) =>
      sb.spawn(sb.node, "env", [
        `PATH=${await backendPath(api.dir, backend)}:${Deno.env.get("PATH")}`,
        k8sBinary("kube-proxy"),
        `--kubeconfig=${kubeconfig}`,
        `--proxy-mode=${proxyMode}`,
        `--hostname-override=${NODE}`,
        `--cluster-cidr=${CLUSTER_CIDR}`,
        // Upstream's nftables mode takes its periods from the iptables flags (there are no nftables ones).
        ...(proxyMode === "ipvs"
          ? ["--ipvs-sync-period=5s", "--ipvs-min-sync-period=0s"]
          : ["--iptables-sync-period=5s", "--iptables-min-sync-period=0s"]),
        "--conntrack-max-per-core=0",
        // -v=4 for the line that says the node's zone reached the proxier (see setNodeZone).
        "-v=4",
        ...extraArgs,
      ]),
  };
}

/** This agent, started as the other packet tests start it (the `start` task's permissions). */
export function ourAgent(
  extraArgs: string[] = [],
  mode: "iptables" | "nftables" | "ipvs" = "iptables",
): Proxy {
  return {
    who: "the agent",
    user: OUR_USER,
    start: (sb, kubeconfig) =>
      Promise.resolve(
        startSandboxAgent(sb, kubeconfig, {
          nodeName: NODE,
          clusterCIDR: CLUSTER_CIDR,
          syncPeriodS: 5,
          // -v=4 for the line that says the node's zone reached the proxier (see setNodeZone).
          extraArgs: ["-v=4", ...extraArgs],
          mode,
        }),
      ),
  };
}

/**
 * Waits until `dump` names every `present` service port key and none of `absent`, and two normalized dumps
 * 1 s apart are identical; returns the last dump. Rejects with what is wrong after `timeoutMs`, or at once
 * when the proxy exits.
 */
async function synced(
  who: string,
  proc: SandboxProcess,
  dump: () => Promise<RuleDump>,
  mode: Mode,
  state: ClusterState,
  timeoutMs: number,
): Promise<RuleDump> {
  let exited = false;
  proc.status.then(() => exited = true);
  const deadline = Date.now() + timeoutMs;
  let prev = "";
  while (true) {
    if (exited) throw new Error(`${who} exited:\n${proc.tail()}`);
    const d = await dump();
    // Normalized first: an emptied chain waiting for deletion still bears a removed Service's name.
    const all = Object.entries(d).map(([k, v]) => mode.normalizer(k, v).join("\n")).join("\n");
    const wrong = [
      ...state.present().filter((k) => !mode.names(all, k, state)).map((k) => `missing ${k}`),
      ...state.absent().filter((k) => mode.names(all, k, state)).map((k) => `still has ${k}`),
    ];
    // Normalized: counters move with every packet (the proxies' own API traffic).
    const text = JSON.stringify(Object.entries(d).map(([k, v]) => [k, mode.normalizer(k, v)]));
    if (wrong.length === 0 && text === prev) return d;
    prev = wrong.length === 0 ? text : "";
    if (Date.now() > deadline) {
      throw new Error(`${who} did not sync in ${timeoutMs} ms: ${wrong.join(", ")}\n${proc.tail()}`);
    }
    await sleep(1000);
  }
}

/** The comparison after one round. */
export interface RoundResult {
  round: string;
  result: ParityResult;
  /** Whether the raw dumps differed (before normalization). */
  rawDiffered: boolean;
}

/**
 * Two proxies in two fresh, identical sandboxes: compares their rules in `mode` once synced, then after each
 * round of changes.
 */
export async function runPair(
  state: ClusterState,
  mode: Mode,
  left: Proxy,
  right: Proxy,
  rounds: Round[],
  /** How long each proxy may take to sync a round (default 30 s). */
  syncTimeoutMs = 30_000,
): Promise<RoundResult[]> {
  const api = state.api;
  const [lsb, rsb] = await Promise.all([
    Sandbox.create({ ipv6: true, nodeIP: NODE_IP, nodeIP6: NODE_IP6 }),
    Sandbox.create({ ipv6: true, nodeIP: NODE_IP, nodeIP6: NODE_IP6 }),
  ]);
  const procs: SandboxProcess[] = [];
  try {
    const sides: [Proxy, Sandbox][] = [[left, lsb], [right, rsb]];
    // Each node namespace's address on the control-plane link differs (the one thing the two sandboxes do
    // not share); where a mode writes node addresses (ipvs NodePort virtual servers), it reads as a name.
    const linkAddress = new Map<string, string>();
    await setNodeZone(api, null);
    for (const [proxy, sb] of sides) {
      linkAddress.set(sb.node, await api.attach(sb.node));
      await mode.prepare?.(sb);
      procs.push(await proxy.start(sb, await api.writeKubeconfig({ token: api.tokens.get(proxy.user) })));
    }
    const exec = async (ns: string, cmd: string, args: string[]) =>
      (await (ns === lsb.node ? lsb : rsb).exec(ns, cmd, args)).stdout;
    const dumpRaw = mode.dumper(exec);
    const dumper = async (ns: string): Promise<RuleDump> => {
      const re = new RegExp(`(?<![0-9.])${linkAddress.get(ns)!.replaceAll(".", "\\.")}(?![0-9])`, "g");
      const d = await dumpRaw(ns);
      for (const k of Object.keys(d)) d[k] = d[k].replace(re, CONTROL_PLANE_LINK_ADDRESS);
      return d;
    };
    // Both synced once without the zone label, then given it (see setNodeZone).
    await Promise.all(
      sides.map(([proxy, sb], i) =>
        synced(proxy.who, procs[i], () => dumper(sb.node), mode, state, syncTimeoutMs)
      ),
    );
    const offsets = procs.map((p) => p.output.length);
    await setNodeZone(api, NODE_ZONE);
    // Both proxies log this line (at -v=4) once the label has reached their endpoint selection.
    await Promise.all(
      procs.map((p, i) =>
        p.waitForOutput(
          new RegExp(`Updated proxier node topology labels.*${NODE_ZONE}`),
          syncTimeoutMs,
          offsets[i],
        )
      ),
    );
    const out: RoundResult[] = [];
    for (const round of [{ name: "initial state" } as Round, ...rounds]) {
      await round.change?.(state);
      // Both synced and stable, and then equal; a difference that lasts SETTLE_MS is reported.
      const settleBy = Date.now() + SETTLE_MS;
      let result: ParityResult;
      let rawDiffered: boolean;
      do {
        const [a, b] = await Promise.all(
          sides.map(([proxy, sb], i) =>
            synced(proxy.who, procs[i], () => dumper(sb.node), mode, state, syncTimeoutMs)
          ),
        );
        result = compareRules(a, b, mode.normalizer, { known: mode.known });
        rawDiffered = JSON.stringify(a) !== JSON.stringify(b);
      } while (!result.equal && Date.now() < settleBy);
      out.push({ round: round.name, result, rawDiffered });
    }
    return out;
  } finally {
    await Promise.all(procs.map((p) => p.stop(5000).catch(() => {})));
    await Promise.all([lsb.destroy(), rsb.destroy()]);
    assert.deepEqual(listNetns().filter((n) => n.startsWith(lsb.prefix) || n.startsWith(rsb.prefix)), []);
  }
}

/** Logs each round and fails with the diffs of the rounds that differ. */
export function assertSame(results: RoundResult[]): void {
  const failures: string[] = [];
  for (const { round, result, rawDiffered } of results) {
    console.log(
      `${round}: normalized lines ${JSON.stringify(result.lines)}; set aside as known differences ` +
        `${JSON.stringify(result.known)}; raw dumps ${rawDiffered ? "differed" : "identical"}`,
    );
    if (!result.equal) {
      failures.push(`${round}: rules differ in ${result.differing.join(", ")}:\n${result.diff}`);
    }
  }
  assert.deepEqual(failures, [], failures.join("\n"));
}
