/** Test builders for service ports, endpoints, Services and EndpointSlices (addresses as upstream tests). */
import type { EndpointSlice, Service } from "../../lib/kube/types.ts";
import { joinHostPort } from "../../lib/net/ip.ts";
import type { EndpointInfo, ServicePortInfo } from "../../lib/proxy/types.ts";

/** A ClusterIP port ns1/svc1:p80 on 172.30.1.1:80/TCP with overrides. */
export function svcInfo(over: Partial<ServicePortInfo> = {}): ServicePortInfo {
  return {
    name: { namespace: "ns1", name: "svc1", port: "p80", protocol: "TCP" },
    nameString: "ns1/svc1:p80",
    serviceKey: "ns1/svc1",
    clusterIP: "172.30.1.1",
    port: 80,
    protocol: "TCP",
    nodePort: 0,
    externalIPs: [],
    loadBalancerVIPs: [],
    loadBalancerSourceRanges: [],
    stickyMaxAgeSeconds: 0,
    externalPolicyLocal: false,
    internalPolicyLocal: false,
    healthCheckNodePort: 0,
    ...over,
  };
}

/** Options of {@linkcode ep}. */
export interface EpOpts {
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  local?: boolean;
  zoneHints?: string[];
  nodeHints?: string[];
  zone?: string;
}

/** An endpoint `ip:port`; ready/serving default true, terminating false. */
export function ep(ip: string, o: EpOpts = {}, port = 80): EndpointInfo {
  return {
    ip,
    port,
    endpoint: joinHostPort(ip, port),
    isLocal: o.local ?? false,
    ready: o.ready ?? true,
    serving: o.serving ?? true,
    terminating: o.terminating ?? false,
    zoneHints: o.zoneHints ? new Set(o.zoneHints) : null,
    nodeHints: o.nodeHints ? new Set(o.nodeHints) : null,
    nodeName: o.local ? "host1" : "host2",
    zone: o.zone ?? "",
  };
}

/** A Service with sensible defaults. */
export function service(
  ns: string,
  name: string,
  spec: Service["spec"] = {},
  status?: Service["status"],
): Service {
  return {
    metadata: { namespace: ns, name, resourceVersion: "1" },
    spec: {
      type: "ClusterIP",
      clusterIP: "172.30.1.1",
      clusterIPs: ["172.30.1.1"],
      ports: [{ name: "p80", port: 80, protocol: "TCP" }],
      ...spec,
    },
    status,
  };
}

/** An EndpointSlice for service `svc` with one port and the given endpoints. */
export function slice(
  ns: string,
  svc: string,
  name: string,
  endpoints: NonNullable<EndpointSlice["endpoints"]>,
  opts: { addressType?: string; ports?: EndpointSlice["ports"]; annotations?: Record<string, string> } = {},
): EndpointSlice {
  return {
    metadata: {
      namespace: ns,
      name,
      labels: { "kubernetes.io/service-name": svc },
      annotations: opts.annotations,
    },
    addressType: opts.addressType ?? "IPv4",
    endpoints,
    ports: opts.ports ?? [{ name: "p80", port: 80, protocol: "TCP" }],
  };
}

/** The `endpoint` strings of a list, or null. */
export function names(list: readonly EndpointInfo[] | null): string[] | null {
  return list === null ? null : list.map((e) => e.endpoint);
}
