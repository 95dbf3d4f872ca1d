/**
 * Fixtures shared by the dataplane tests and benchmarks: ServicePortState objects built with the proxy
 * core's own selection code, snapshots, a recording runner that answers `sysctl`, and the Service corpus of
 * upstream's TestOverallIPTablesRules / TestOverallNFTablesRules.
 * @module
 */

import { type RecordedCall, RecordingCommandRunner } from "../lib/exec.ts";
import type {
  EndpointInfo,
  IPFamily,
  Protocol,
  ProxySnapshot,
  ServicePortInfo,
  ServicePortState,
} from "../lib/proxy/types.ts";
import { servicePortNameString } from "../lib/proxy/types.ts";
import { servicePortState } from "../lib/proxy/service_plan.ts";

export const TEST_NODE = "test-node";

export interface SvcSpec {
  ns: string;
  name: string;
  port?: string;
  protocol?: Protocol;
  clusterIP: string;
  portNum?: number;
  nodePort?: number;
  externalIPs?: string[];
  lbVIPs?: string[];
  sourceRanges?: string[];
  affinity?: number;
  eTPLocal?: boolean;
  iTPLocal?: boolean;
  hcnp?: number;
}

export interface EpSpec {
  ip: string;
  port?: number;
  local?: boolean;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
}

export function ep(e: EpSpec): EndpointInfo {
  const port = e.port ?? 80;
  return {
    ip: e.ip,
    port,
    endpoint: e.ip.includes(":") ? `[${e.ip}]:${port}` : `${e.ip}:${port}`,
    isLocal: e.local ?? false,
    ready: e.ready ?? true,
    serving: e.serving ?? e.ready ?? true,
    terminating: e.terminating ?? false,
    zoneHints: null,
    nodeHints: null,
    nodeName: e.local ? TEST_NODE : "",
    zone: "",
  };
}

/** A port state built as the proxier builds it (the real selection and plan), on node {@linkcode TEST_NODE}. */
export function makeState(s: SvcSpec, eps: EpSpec[]): ServicePortState {
  const protocol = s.protocol ?? "TCP";
  const name = { namespace: s.ns, name: s.name, port: s.port ?? "p80", protocol };
  const info: ServicePortInfo = {
    name,
    nameString: servicePortNameString(name),
    serviceKey: `${s.ns}/${s.name}`,
    clusterIP: s.clusterIP,
    port: s.portNum ?? 80,
    protocol,
    nodePort: s.nodePort ?? 0,
    externalIPs: s.externalIPs ?? [],
    loadBalancerVIPs: s.lbVIPs ?? [],
    loadBalancerSourceRanges: s.sourceRanges ?? [],
    stickyMaxAgeSeconds: s.affinity ?? 0,
    externalPolicyLocal: s.eTPLocal ?? false,
    internalPolicyLocal: s.iTPLocal ?? false,
    // As lib/proxy/service_port.ts (upstream's NeedsHealthCheck gate on HealthCheckNodePort()): the spec value
    // counts only with eTP=Local. Upstream's TestOverallIPTablesRules gives the eTP=Cluster svc5 one too.
    healthCheckNodePort: s.eTPLocal ? s.hcnp ?? 0 : 0,
  };
  const endpoints = eps.map(ep).sort((
    a,
    b,
  ) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
  return servicePortState(info, endpoints, TEST_NODE, {}, { preferSameTrafficDistribution: true });
}

export function snapshot(
  states: ServicePortState[],
  opts: { family?: IPFamily; changed?: string[] | null; nodeIPs?: string[]; serviceCIDRs?: string[] } = {},
): ProxySnapshot {
  const m = new Map<string, ServicePortState>();
  let total = 0;
  for (const s of states) {
    m.set(s.info.nameString, s);
    total += s.endpoints.length;
  }
  return {
    family: opts.family ?? "IPv4",
    servicePorts: m,
    changedServices: opts.changed === undefined ? null : opts.changed === null ? null : new Set(opts.changed),
    node: { name: TEST_NODE, ips: opts.nodeIPs ?? ["192.168.0.2"], labels: {} },
    totalEndpoints: total,
    serviceCIDRs: opts.serviceCIDRs ?? [],
  };
}

/** A recorder answering sysctl be_liberal = 0 and empty iptables-save output. */
export function recorder(
  extra?: (c: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
) {
  return new RecordingCommandRunner((c) => {
    const r = extra?.(c);
    if (r) return r;
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: "0\n" };
    return undefined;
  });
}

/**
 * The services and endpoints of upstream's TestOverallIPTablesRules; with `localEndpoints`, those of v1.37's
 * TestOverallNFTablesRules, whose svc1, svc3 and svc5 endpoints are on this node (they fill hairpin-connections).
 */
export function overallFixture(opts: { localEndpoints?: boolean } = {}) {
  const local = opts.localEndpoints ?? false;
  return [
    makeState({ ns: "ns1", name: "svc1", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1", local }]),
    makeState({
      ns: "ns2",
      name: "svc2",
      clusterIP: "172.30.0.42",
      nodePort: 3001,
      lbVIPs: ["1.2.3.4"],
      externalIPs: ["192.168.99.22"],
      eTPLocal: true,
      hcnp: 30000,
    }, [{ ip: "10.180.0.2" }]),
    makeState({ ns: "ns3", name: "svc3", clusterIP: "172.30.0.43", nodePort: 3003 }, [{
      ip: "10.180.0.3",
      local,
    }]),
    makeState({ ns: "ns4", name: "svc4", clusterIP: "172.30.0.44", externalIPs: ["192.168.99.33"] }, [
      { ip: "10.180.0.4" },
      { ip: "10.180.0.5", local: true },
    ]),
    makeState({
      ns: "ns5",
      name: "svc5",
      clusterIP: "172.30.0.45",
      nodePort: 3002,
      lbVIPs: ["5.6.7.8"],
      hcnp: 30000,
      sourceRanges: ["203.0.113.0/25"],
      affinity: 10800,
    }, [{ ip: "10.180.0.3", local }]),
    makeState({ ns: "ns6", name: "svc6", clusterIP: "172.30.0.46" }, []),
  ];
}
