/**
 * nftables rendering of one service port, rule for rule as the per-service loop of upstream v1.37's
 * `syncProxyRules`: its own chains (rule text in nft syntax), affinity sets and the elements it puts into the
 * shared maps and sets; `dataplane.ts` decides what of it goes into a transaction. The fixed table layout
 * (`setupNFTables`) is in `layout.ts` and the shared pieces in `render_parts.ts`, both re-exported here.
 * @module
 */
import type { EndpointInfo, IPFamily, ServicePortState } from "../../proxy/types.ts";
import { cidrContains, isLoopback } from "../../net/ip.ts";
import type { LocalTraffic } from "../local_traffic.ts";
import { CHAIN, endpointNames, localhostNodePortRejectChain, servicePortChainNames, SET } from "./names.ts";
import { ifLocal, nftFamily } from "./render_parts.ts";

export * from "./layout.ts";
export { elementObject, ifNotLocal, nftFamily, type NftOp, ruleObject } from "./render_parts.ts";

/** Settings that shape every service port's rules; a change of any invalidates every rendered port. */
export interface NftRenderConfig {
  readonly family: IPFamily;
  /** `masqueradeMark(masqueradeBit)`, e.g. `0x00004000`. */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  readonly localTraffic: LocalTraffic;
  /** The family's node IP (loadBalancerSourceRanges self-allow); null when unknown. */
  readonly nodeIP: string | null;
  /** Protocols (`TCP`, ...) whose localhost NodePort traffic is rejected and counted; empty without the gate. */
  readonly localhostRejects?: readonly string[];
}

/**
 * Upstream's localhost NodePort handling for one family under KubeProxyNFTablesLocalhostNodePorts: the protocols
 * rejected and counted, and whether TCP NodePorts are served by loopback listeners (when a nodePortAddresses
 * CIDR is itself loopback, like 127.0.0.0/8, not merely containing it, like 0.0.0.0/0).
 */
export function localhostNodePortHandling(
  gate: boolean,
  nodePortCIDRs: readonly string[],
): { rejects: readonly string[]; listeners: boolean } {
  if (!gate) return { rejects: [], listeners: false };
  if (nodePortCIDRs.some((c) => isLoopback(c.split("/")[0]))) {
    return { rejects: ["UDP", "SCTP"], listeners: true };
  }
  return { rejects: ["TCP", "UDP", "SCTP"], listeners: false };
}

/** An element of one of the shared maps or sets. */
export interface NftElement {
  /** The set or map. */
  readonly container: string;
  /** `a . b . c` */
  readonly key: string;
  /** The verdict of a map element (`goto chain`, `drop`); null in a set. */
  readonly value: string | null;
  readonly comment: string | null;
}

/** Everything one service port owns in the table. */
export interface NftPortRender {
  /** The state this was rendered from (identity check for the cache). */
  state: ServicePortState;
  /** The port's chains and their rules (rule text after `add rule <family> kube-proxy <chain> `). */
  readonly chains: ReadonlyMap<string, readonly string[]>;
  /** Affinity sets, each with the port's affinity timeout in seconds. */
  readonly affinitySets: readonly string[];
  readonly affinityTimeout: number;
  /** The port's elements in the shared maps and sets. */
  readonly elements: readonly NftElement[];
}

/** Longest comment nft accepts, in bytes (knftables `CommentLengthMax`). */
export const COMMENT_LENGTH_MAX = 128;

/** `s` cut to {@linkcode COMMENT_LENGTH_MAX} bytes, as upstream's `truncateNFTablesComment` (#139516). */
export function truncateComment(s: string): string {
  const bytes = new TextEncoder().encode(s);
  if (bytes.length <= COMMENT_LENGTH_MAX) return s;
  // Names are ASCII; a multi-byte character cut in half would be dropped rather than split.
  return new TextDecoder().decode(bytes.subarray(0, COMMENT_LENGTH_MAX)).replace(/\uFFFD$/, "");
}

/** Renders one service port exactly as upstream's per-service loop body. */
export function renderServicePort(st: ServicePortState, cfg: NftRenderConfig): NftPortRender {
  const { info, selection: sel, plan } = st;
  const ipX = nftFamily(cfg.family);
  const proto = info.protocol.toLowerCase();
  const names = servicePortChainNames(info.name, proto);
  const port = String(info.port);
  // nft refuses comments over 128 bytes; a Service at the API's name limits has a longer name (#139516).
  const comment = truncateComment(info.nameString);
  const epNames = new Map<string, ReturnType<typeof endpointNames>>();
  const namesOf = (ep: EndpointInfo) => {
    let n = epNames.get(ep.endpoint);
    if (n === undefined) epNames.set(ep.endpoint, n = endpointNames(names.base, ep.ip, ep.port));
    return n;
  };

  const clusterChain = names.cluster;
  const localChain = names.local;
  const internalChain = plan.internalUsesLocalChain ? localChain : clusterChain;
  const externalPolicyChain = plan.externalUsesLocalChain ? localChain : clusterChain;
  const externalChain = names.external;
  const verdictOf = (v: "reject" | "drop" | null) => v === "drop" ? "drop" : `goto ${CHAIN.reject}`;

  const chains = new Map<string, string[]>();
  const chain = (name: string) => {
    let rules = chains.get(name);
    if (rules === undefined) chains.set(name, rules = []);
    return rules;
  };
  const elements: NftElement[] = [];
  const element = (container: string, key: string, value: string | null, withComment = false) =>
    elements.push({ container, key, value, comment: withComment ? comment : null });

  // Only ClientIP affinity uses per-endpoint chains (each records the client in its affinity set).
  const affinity = info.stickyMaxAgeSeconds > 0;

  // Chains in upstream's order of creation (the order matters only for readability of a transaction).
  for (const ep of sel.allReachableEndpoints) {
    if (affinity) chain(namesOf(ep).chain);
    // Endpoints on this node: a connection from the endpoint to itself through the Service is masqueraded
    // (`masquerading` matches `ct status dnat` connections in this set).
    if (ep.isLocal) element(SET.hairpinConnections, `${ep.ip} . ${ep.ip} . ${proto} . ${ep.port}`, null);
  }
  if (plan.usesClusterPolicyChain) chain(clusterChain);
  if (plan.usesLocalPolicyChain) chain(localChain);
  if (plan.usesExternalChain) chain(externalChain);

  // ClusterIP.
  element(SET.clusterIPs, info.clusterIP, null);
  if (plan.hasInternalEndpoints) {
    element(SET.serviceIPs, `${info.clusterIP} . ${proto} . ${port}`, `goto ${internalChain}`);
  } else {
    element(
      SET.noEndpointServices,
      `${info.clusterIP} . ${proto} . ${port}`,
      verdictOf(plan.internalVerdict),
      true,
    );
  }
  // External IPs.
  for (const ip of info.externalIPs) {
    if (plan.hasEndpoints) element(SET.serviceIPs, `${ip} . ${proto} . ${port}`, `goto ${externalChain}`);
    if (!plan.hasExternalEndpoints) {
      element(SET.noEndpointServices, `${ip} . ${proto} . ${port}`, verdictOf(plan.externalVerdict), true);
    }
  }
  // LoadBalancer VIPs (the firewall chain is written with or without endpoints, unlike iptables').
  if (plan.firewalled) chain(names.firewall);
  for (const ip of info.loadBalancerVIPs) {
    if (plan.hasEndpoints) element(SET.serviceIPs, `${ip} . ${proto} . ${port}`, `goto ${externalChain}`);
    if (plan.firewalled) element(SET.firewallIPs, `${ip} . ${proto} . ${port}`, `goto ${names.firewall}`);
  }
  if (!plan.hasExternalEndpoints) {
    for (const ip of info.loadBalancerVIPs) {
      element(SET.noEndpointServices, `${ip} . ${proto} . ${port}`, verdictOf(plan.externalVerdict), true);
    }
  }
  // NodePort.
  if (info.nodePort !== 0) {
    if (cfg.localhostRejects?.includes(info.protocol)) {
      element(
        SET.localhostNodePortRejects,
        `${proto} . ${info.nodePort}`,
        `goto ${localhostNodePortRejectChain(info.protocol)}`,
      );
    }
    if (plan.hasEndpoints) {
      element(SET.serviceNodePorts, `${proto} . ${info.nodePort}`, `goto ${externalChain}`);
    }
    if (!plan.hasExternalEndpoints) {
      element(SET.noEndpointNodePorts, `${proto} . ${info.nodePort}`, verdictOf(plan.externalVerdict), true);
    }
  }

  // (Off-cluster traffic to a ClusterIP is marked by one rule in `services` over @cluster-ips, not here.)
  const masq = `mark set mark or ${cfg.mark}`;

  // External traffic.
  if (plan.usesExternalChain) {
    const ext = chain(externalChain);
    if (!plan.externalPolicyLocal) {
      ext.push(`${masq} comment "masquerade"`);
    } else {
      const local = ifLocal(cfg.localTraffic, ipX);
      if (local !== null) ext.push(`${local} goto ${clusterChain} comment "short-circuit pod traffic"`);
      ext.push(`fib saddr type local ${masq} comment "masquerade local traffic"`);
      ext.push(`fib saddr type local goto ${clusterChain} comment "short-circuit local traffic"`);
    }
    if (plan.hasExternalEndpoints) ext.push(`goto ${externalPolicyChain}`);
  }

  // loadBalancerSourceRanges.
  if (plan.firewalled) {
    const sources = [...info.loadBalancerSourceRanges];
    if (cfg.nodeIP !== null && info.loadBalancerSourceRanges.some((c) => cidrContains(c, cfg.nodeIP!))) {
      // A VIP that is a local address loops back with the VIP as source: allow it from this node.
      sources.push(...info.loadBalancerVIPs);
    }
    chain(names.firewall).push(`${ipX} saddr != { ${sources.join(" , ")} } drop`);
  }

  // Session affinity sets, one per reachable endpoint.
  const affinitySets = affinity ? sel.allReachableEndpoints.map((ep) => namesOf(ep).affinitySet) : [];

  // Load balancing to endpoints: without affinity, DNAT in the policy chain itself (one endpoint: plain
  // `dnat to`; more: a numgen map of address . port); with affinity, jumps to the endpoint chains.
  const writeLB = (rules: string[], eps: readonly EndpointInfo[]) => {
    if (!affinity) {
      if (eps.length === 1) {
        rules.push(`meta l4proto ${proto} dnat to ${eps[0].endpoint}`);
      } else {
        const map = eps.map((ep, i) => `${i} : ${ep.ip} . ${ep.port}`).join(" , ");
        rules.push(
          `meta l4proto ${proto} dnat ${ipX} addr . port to numgen random mod ${eps.length} map { ${map} }`,
        );
      }
      return;
    }
    for (const ep of eps) {
      const n = namesOf(ep);
      rules.push(`${ipX} saddr @${n.affinitySet} goto ${n.chain}`);
    }
    const vmap = eps.map((ep, i) => `${i} : goto ${namesOf(ep).chain}`).join(" , ");
    rules.push(`numgen random mod ${eps.length} vmap { ${vmap} }`);
  };
  if (plan.usesClusterPolicyChain) writeLB(chain(clusterChain), sel.clusterEndpoints!);
  if (plan.usesLocalPolicyChain) writeLB(chain(localChain), sel.localEndpoints!);

  // Endpoint chains (affinity only).
  if (affinity) {
    for (const ep of sel.allReachableEndpoints) {
      const n = namesOf(ep);
      const rules = chain(n.chain);
      rules.push(`update @${n.affinitySet} { ${ipX} saddr }`);
      rules.push(`meta l4proto ${proto} dnat to ${ep.endpoint}`);
    }
  }

  return { state: st, chains, affinitySets, affinityTimeout: info.stickyMaxAgeSeconds, elements };
}
