/**
 * What one service port needs in ipvs mode, as upstream's per-service loop in `syncProxyRules` decides it:
 * its virtual servers with their real servers, its ipset members, the addresses it binds on kube-ipvs0 and
 * its KUBE-IPVS-OUT-FILTER rules. Rendered once per change of the port (or of the node facts it uses) and
 * kept by the dataplane; endpoint selection comes from the model (`st.selection`, `st.plan`).
 * @module
 */
import { cidrContains, type IPFamily } from "../../net/ip.ts";
import type { EndpointInfo, ServicePortState } from "../../proxy/types.ts";
import { type OutFilterEntry, outFilterRule } from "./iptables_rules.ts";
import { ipPortEntry, ipPortIPEntry, ipPortNetEntry, type SetKey } from "./ipsets.ts";
import { serviceKey, type VirtualServerDef } from "./ipvsadm.ts";

/** Node facts and settings every port's rendering depends on; a change re-renders every port. */
export interface RenderContext {
  readonly family: IPFamily;
  /** `--ipvs-scheduler`, "" meaning rr. */
  readonly scheduler: string;
  /** Addresses of NodePort virtual servers (upstream's nodeIPs). */
  readonly nodePortIPs: readonly string[];
  /** Local addresses on interfaces other than kube-ipvs0 (externalIPs/LB IPs among them are not bound). */
  readonly nodeAddresses: ReadonlySet<string>;
  /** The family's node IP (loadBalancerSourceRanges self-allow); null when unknown. */
  readonly nodeIP: string | null;
}

/** A wanted virtual server. */
export interface WantedVirtualServer {
  readonly key: string;
  readonly def: VirtualServerDef;
  /** Real servers (`ip:port`), sorted. */
  readonly reals: readonly string[];
}

/** One port's rendering. */
export interface PortRendering {
  readonly state: ServicePortState;
  readonly ctx: RenderContext;
  readonly vs: readonly WantedVirtualServer[];
  /**
   * Set members as a flat list of set key and member, alternating (one array per port rather than one pair
   * each); a member may appear in several ports: the dataplane counts references.
   */
  readonly sets: readonly string[];
  /** Addresses to bind on kube-ipvs0. */
  readonly bind: readonly string[];
  /** KUBE-IPVS-OUT-FILTER rules ("" for none). */
  readonly outFilter: string;
}

function endpointsFor(st: ServicePortState, onlyLocal: boolean): readonly EndpointInfo[] {
  const sel = st.selection;
  const cluster = sel.clusterEndpoints ?? [];
  if (!onlyLocal) return cluster;
  // Upstream (kubernetes#97081): without local endpoints, the Local-policy virtual servers get the cluster
  // endpoints, so that pods on this node still reach the service; traffic from outside is answered from a pod
  // address and dropped by the client.
  const local = sel.localEndpoints ?? [];
  return local.length > 0 ? local : cluster;
}

/** Renders one service port. */
export function renderPort(st: ServicePortState, ctx: RenderContext): PortRendering {
  const info = st.info;
  const proto = info.protocol.toLowerCase();
  const port = info.port;
  const def: VirtualServerDef = {
    scheduler: ctx.scheduler || "rr",
    persistence: info.stickyMaxAgeSeconds,
    flags: (ctx.scheduler || "rr") === "mh" ? "mh-port" : "",
  };
  const extLocal = st.plan.externalPolicyLocal;
  const vs: WantedVirtualServer[] = [];
  const sets: string[] = [];
  const member = (k: SetKey, e: string) => sets.push(k, e);
  const bind: string[] = [];
  const outFilter: OutFilterEntry[] = [];
  let internalReals: readonly string[] | null = null, externalReals: readonly string[] | null = null;
  const reals = (onlyLocal: boolean) => endpointsFor(st, onlyLocal).map((e) => e.endpoint);
  const internal = () => internalReals ??= reals(info.internalPolicyLocal);
  // The same policy selects the same endpoints: one array for both (the dataplane's kernel model shares it too).
  const external = () =>
    externalReals ??= extLocal === info.internalPolicyLocal ? internal() : reals(extLocal);

  // Hairpin: every local endpoint, selected or not.
  for (const e of st.endpoints) {
    if (e.isLocal) member("KUBE-LOOP-BACK", ipPortIPEntry(e.ip, proto, e.port, e.ip));
  }
  member("KUBE-CLUSTER-IP", ipPortEntry(info.clusterIP, proto, port));
  vs.push({ key: serviceKey(info.protocol, info.clusterIP, port), def, reals: internal() });
  bind.push(info.clusterIP);

  for (const ip of info.externalIPs) {
    member(extLocal ? "KUBE-EXTERNAL-IP-LOCAL" : "KUBE-EXTERNAL-IP", ipPortEntry(ip, proto, port));
    vs.push({ key: serviceKey(info.protocol, ip, port), def, reals: external() });
    if (!ctx.nodeAddresses.has(ip)) bind.push(ip);
  }

  for (const ip of info.loadBalancerVIPs) {
    const entry = ipPortEntry(ip, proto, port);
    member("KUBE-LOAD-BALANCER", entry);
    if (extLocal) member("KUBE-LOAD-BALANCER-LOCAL", entry);
    if (info.loadBalancerSourceRanges.length > 0) {
      member("KUBE-LOAD-BALANCER-FW", entry);
      let allowFromNode = false;
      for (const cidr of info.loadBalancerSourceRanges) {
        member("KUBE-LOAD-BALANCER-SOURCE-CIDR", ipPortNetEntry(ip, proto, port, cidr));
        if (ctx.nodeIP !== null && cidrContains(cidr, ctx.nodeIP)) allowFromNode = true;
      }
      if (allowFromNode) member("KUBE-LOAD-BALANCER-SOURCE-IP", ipPortIPEntry(ip, proto, port, ip));
      else outFilter.push({ ip, proto, port });
    }
    vs.push({ key: serviceKey(info.protocol, ip, port), def, reals: external() });
    if (!ctx.nodeAddresses.has(ip)) bind.push(ip);
  }

  let skipHealthCheck = false;
  if (info.nodePort !== 0) {
    if (ctx.nodePortIPs.length === 0) {
      // Upstream skips the rest of the port (its health check node port too) when it has no node IPs.
      skipHealthCheck = true;
    } else {
      const np = info.nodePort;
      const entries = info.protocol === "SCTP"
        ? ctx.nodePortIPs.map((ip) => ipPortEntry(ip, proto, np))
        : [String(np)];
      const [all, local]: [SetKey, SetKey] = info.protocol === "TCP"
        ? ["KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP"]
        : info.protocol === "UDP"
        ? ["KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP"]
        : ["KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"];
      for (const e of entries) member(all, e);
      if (extLocal) { for (const e of entries) member(local, e); }
      for (const ip of ctx.nodePortIPs) {
        vs.push({ key: serviceKey(info.protocol, ip, np), def, reals: external() });
      }
    }
  }
  if (!skipHealthCheck && info.healthCheckNodePort !== 0) {
    member("KUBE-HEALTH-CHECK-NODE-PORT", String(info.healthCheckNodePort));
  }
  // Kept until the port changes: copies of exact length (arrays grown by push keep 16 or more slots).
  return {
    state: st,
    ctx,
    vs: vs.slice(),
    sets: sets.slice(),
    bind: bind.slice(),
    outFilter: outFilter.map(outFilterRule).join(""),
  };
}
