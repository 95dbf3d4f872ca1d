/**
 * nftables rendering, rule for rule as upstream v1.37's nftables proxier (`setupNFTables` and the per-service
 * loop of `syncProxyRules`): the fixed table layout as nftables objects, and for each service port its own
 * chains (rule text in nft syntax), affinity sets and the elements it puts into the shared maps and sets;
 * `dataplane.ts` decides what of it goes into a transaction.
 * @module
 */
import type { EndpointInfo, IPFamily, ServicePortState } from "../../proxy/types.ts";
import { cidrContains, isLoopback } from "../../net/ip.ts";
import type { LocalTraffic } from "../local_traffic.ts";
import {
  CHAIN,
  endpointNames,
  LOCALHOST_NODEPORT_PROTOCOLS,
  localhostNodePortRejectChain,
  localhostNodePortRejectedCounter,
  servicePortChainNames,
  SET,
  TABLE_COMMENT,
} from "./names.ts";
import type { ChainHook, ChainType, Element, NftMap, NftObject, NftSet, Rule } from "./objects.ts";

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

/** `ip` / `ip6`: the table family and the address match keyword. */
export function nftFamily(family: IPFamily): "ip" | "ip6" {
  return family === "IPv6" ? "ip6" : "ip";
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

function ifLocal(lt: LocalTraffic, ipX: string): string | null {
  switch (lt.kind) {
    case "none":
      return null;
    case "cidr":
      return `${ipX} saddr ${lt.cidr}`;
    case "interface":
      return `iifname ${lt.name}`;
    case "interfacePrefix":
      return `iifname ${lt.prefix}*`;
  }
}

/** The nftables match for traffic that is not from local pods (null when local traffic is not detected). */
export function ifNotLocal(lt: LocalTraffic, ipX: string): string | null {
  switch (lt.kind) {
    case "none":
      return null;
    case "cidr":
      return `${ipX} saddr != ${lt.cidr}`;
    case "interface":
      return `iifname != ${lt.name}`;
    case "interfacePrefix":
      return `iifname != ${lt.prefix}*`;
  }
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

/** Settings of the fixed part of the table (written on full syncs). */
export interface NftSetupConfig {
  readonly family: IPFamily;
  readonly mark: string;
  /** nodePortAddresses match every local address (no `nodeport-ips` set). */
  readonly nodePortsMatchAll: boolean;
  /** The node addresses accepting NodePorts when they do not match all (loopback already removed). */
  readonly nodePortIPs: readonly string[];
  /** This family's ServiceCIDRs (traffic to unallocated ClusterIPs in them is dropped). */
  readonly serviceCIDRs: readonly string[];
  /** First full sync of this process: delete and re-create the base chains (their settings may differ). */
  readonly recreateBaseChains: boolean;
  /** Protocols whose localhost NodePort traffic is rejected and counted (KubeProxyNFTablesLocalhostNodePorts). */
  readonly localhostRejects: readonly string[];
  /** Mark every packet to a ClusterIP for masquerade (else only those not from local pods, when detected). */
  readonly masqueradeAll: boolean;
  readonly localTraffic: LocalTraffic;
}

/**
 * The base chains: name, type, hook, priority. Upstream names the priorities (`dstnat-10`, `filter`, `dstnat`,
 * `srcnat`); written as numbers, because nft 1.0.6 refuses named priorities in the output hook.
 */
export const BASE_CHAINS: readonly [string, string, string, number][] = [
  [CHAIN.filterPreroutingPreDNAT, "filter", "prerouting", -110],
  [CHAIN.filterOutputPreDNAT, "filter", "output", -110],
  [CHAIN.filterInput, "filter", "input", 0],
  [CHAIN.filterForward, "filter", "forward", 0],
  [CHAIN.filterOutput, "filter", "output", 0],
  [CHAIN.natPrerouting, "nat", "prerouting", -100],
  [CHAIN.natOutput, "nat", "output", -100],
  [CHAIN.natPostrouting, "nat", "postrouting", 100],
];

/** Jumps from base chains into regular chains (upstream `nftablesJumpChains`), in upstream's order. */
const JUMPS: readonly [string, string, string][] = [
  [CHAIN.nodePortEndpointsCheck, CHAIN.filterInput, "ct state new"],
  [CHAIN.serviceEndpointsCheck, CHAIN.filterInput, "ct state new"],
  [CHAIN.serviceEndpointsCheck, CHAIN.filterForward, "ct state new"],
  [CHAIN.serviceEndpointsCheck, CHAIN.filterOutput, "ct state new"],
  [CHAIN.firewallCheck, CHAIN.filterPreroutingPreDNAT, "ct state new"],
  [CHAIN.firewallCheck, CHAIN.filterOutputPreDNAT, "ct state new"],
  [CHAIN.services, CHAIN.natOutput, ""],
  [CHAIN.services, CHAIN.natPrerouting, ""],
  [CHAIN.masquerading, CHAIN.natPostrouting, ""],
  [CHAIN.clusterIPsCheck, CHAIN.filterForward, "ct state new"],
  [CHAIN.clusterIPsCheck, CHAIN.filterOutput, "ct state new"],
];

/** One operation of a transaction: a verb and the object it applies to. */
export type NftOp = ["add" | "flush" | "delete", NftObject];

/** The shared maps and sets, by name. */
function containers(family: IPFamily): Map<string, NftSet | NftMap> {
  const addr = family === "IPv6" ? "ipv6_addr" : "ipv4_addr";
  const vmap = `${addr} . inet_proto . inet_service : verdict`;
  const list: (NftSet | NftMap)[] = [
    {
      kind: "set",
      name: SET.hairpinConnections,
      type: `${addr} . ${addr} . inet_proto . inet_service`,
      comment: "service hairpin connections",
    },
    { kind: "set", name: SET.clusterIPs, type: addr, comment: "Active ClusterIPs" },
    {
      kind: "map",
      name: SET.noEndpointServices,
      type: vmap,
      comment: "vmap to drop or reject packets to services with no endpoints",
    },
    {
      kind: "map",
      name: SET.noEndpointNodePorts,
      type: "inet_proto . inet_service : verdict",
      comment: "vmap to drop or reject packets to service nodeports with no endpoints",
    },
    {
      kind: "map",
      name: SET.firewallIPs,
      type: vmap,
      comment: "destinations that are subject to LoadBalancerSourceRanges",
    },
    {
      kind: "map",
      name: SET.serviceIPs,
      type: vmap,
      comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic",
    },
    {
      kind: "map",
      name: SET.serviceNodePorts,
      type: "inet_proto . inet_service : verdict",
      comment: "NodePort traffic",
    },
  ];
  return new Map(list.map((c) => [c.name, c]));
}

/** The declarations of the maps and sets holding per-service elements, as the fixed layout writes them. */
export function elementContainerDeclarations(family: IPFamily): (NftSet | NftMap)[] {
  return [...containers(family).values()];
}

/** The maps and sets holding per-service elements (flushed and refilled by a full sync). */
export function elementContainers(family: IPFamily): (NftSet | NftMap)[] {
  return [...containers(family).values()].map((c) => ({ kind: c.kind, name: c.name }) as NftSet | NftMap);
}

/** The sets among the shared containers (the rest are verdict maps). */
const SETS: ReadonlySet<string> = new Set([SET.clusterIPs, SET.nodePortIPs, SET.hairpinConnections]);

/** A port's element as an nftables object. */
export function elementObject(
  container: string,
  key: string,
  value: string | null,
  comment: string | null,
): Element {
  return {
    kind: "element",
    ...(SETS.has(container) ? { set: container } : { map: container }),
    key: key.split(" . "),
    ...(value !== null ? { value: [value] } : {}),
    ...(comment !== null ? { comment } : {}),
  };
}

/** A rendered rule (`... comment "text"` at its end, as nft prints it) as an nftables object. */
export function ruleObject(chain: string, text: string): Rule {
  const m = text.match(/^(.*) comment "([^"]*)"$/);
  return m ? { kind: "rule", chain, rule: m[1], comment: m[2] } : { kind: "rule", chain, rule: text };
}

/**
 * The fixed part of the table as upstream's `setupNFTables` writes it on every full sync, in its order: table,
 * base chains, jump rules, masquerading (marked packets and hairpin connections), the shared maps and sets
 * (declared, not flushed: the caller decides), the cluster-ips check, nodeport-ips, reject, firewall and
 * service dispatch (with the ClusterIP masquerade rule).
 */
export function setupOps(cfg: NftSetupConfig): NftOp[] {
  const mark = cfg.mark;
  const ipX = nftFamily(cfg.family);
  const addr = cfg.family === "IPv6" ? "ipv6_addr" : "ipv4_addr";
  const noLocalhost = cfg.family === "IPv6" ? "ip6 daddr != ::1" : "ip daddr != 127.0.0.0/8";
  const ops: NftOp[] = [["add", { kind: "table", comment: TABLE_COMMENT }]];
  const rule = (chain: string, text: string) => ops.push(["add", ruleObject(chain, text)]);
  if (cfg.recreateBaseChains) {
    for (const [name] of BASE_CHAINS) {
      ops.push(["add", { kind: "chain", name }], ["delete", { kind: "chain", name }]);
    }
  }
  for (const [name, type, hook, priority] of BASE_CHAINS) {
    ops.push(
      ["add", { kind: "chain", name, type: type as ChainType, hook: hook as ChainHook, priority }],
      ["flush", { kind: "chain", name }],
    );
  }
  const created = new Set<string>();
  const ensure = (name: string, comment?: string) => {
    if (created.has(name)) return;
    created.add(name);
    ops.push(["add", { kind: "chain", name, ...(comment ? { comment } : {}) }], ["flush", {
      kind: "chain",
      name,
    }]);
  };
  for (const [dst, src, extra] of JUMPS) {
    ensure(dst);
    rule(src, `${extra ? extra + " " : ""}jump ${dst}`);
  }
  for (const name of [CHAIN.services, CHAIN.clusterIPsCheck, CHAIN.masquerading]) ensure(name);
  const sets = containers(cfg.family);
  ops.push(["add", sets.get(SET.hairpinConnections)!]);
  rule(CHAIN.masquerading, `mark and ${mark} != 0 mark set mark xor ${mark} masquerade fully-random`);
  rule(
    CHAIN.masquerading,
    `ct status dnat ${ipX} saddr . ${ipX} daddr . meta l4proto . th dport @${SET.hairpinConnections} ` +
      "masquerade fully-random",
  );
  ops.push(["add", sets.get(SET.clusterIPs)!]);
  rule(
    CHAIN.clusterIPsCheck,
    `${ipX} daddr @${SET.clusterIPs} reject comment "Reject traffic to invalid ports of ClusterIPs"`,
  );
  if (cfg.serviceCIDRs.length > 0) {
    rule(
      CHAIN.clusterIPsCheck,
      `${ipX} daddr { ${cfg.serviceCIDRs.join(",")} } drop comment "Drop traffic to unallocated ClusterIPs"`,
    );
  }
  const nodePortIPs: NftSet = {
    kind: "set",
    name: SET.nodePortIPs,
    type: addr,
    comment: "IPs that accept NodePort traffic",
  };
  ops.push(["add", nodePortIPs]);
  if (cfg.nodePortsMatchAll) {
    ops.push(["delete", { kind: "set", name: SET.nodePortIPs }]);
  } else {
    ops.push(["flush", { kind: "set", name: SET.nodePortIPs }]);
    for (const ip of cfg.nodePortIPs) ops.push(["add", elementObject(SET.nodePortIPs, ip, null, null)]);
  }
  ops.push(["add", sets.get(SET.noEndpointServices)!], ["add", sets.get(SET.noEndpointNodePorts)!]);
  ensure(CHAIN.reject, "helper for @no-endpoint-services / @no-endpoint-nodeports");
  rule(CHAIN.reject, "reject");
  rule(CHAIN.serviceEndpointsCheck, `${ipX} daddr . meta l4proto . th dport vmap @${SET.noEndpointServices}`);
  rule(
    CHAIN.nodePortEndpointsCheck,
    cfg.nodePortsMatchAll
      ? `${noLocalhost} meta l4proto . th dport vmap @${SET.noEndpointNodePorts}`
      : `${ipX} daddr @${SET.nodePortIPs} meta l4proto . th dport vmap @${SET.noEndpointNodePorts}`,
  );
  // Localhost NodePorts kube-proxy does not serve: rejected and counted per protocol (with the gate); the objects of
  // protocols not rejected (or of the whole feature) are removed, whatever an earlier configuration left.
  const localhostMap: NftMap = {
    kind: "map",
    name: SET.localhostNodePortRejects,
    type: "inet_proto . inet_service : verdict",
    comment: "localhost NodePorts rejected by kube-proxy",
  };
  ops.push(["add", localhostMap]);
  if (cfg.localhostRejects.length > 0) {
    for (const protocol of cfg.localhostRejects) {
      const counter = localhostNodePortRejectedCounter(protocol);
      ops.push(["add", { kind: "counter", name: counter }]);
      ensure(localhostNodePortRejectChain(protocol));
      rule(localhostNodePortRejectChain(protocol), `counter name "${counter}" reject`);
    }
    rule(
      CHAIN.nodePortEndpointsCheck,
      `${cfg.family === "IPv6" ? "ip6 daddr ::1" : "ip daddr 127.0.0.0/8"} meta l4proto . th dport vmap ` +
        `@${SET.localhostNodePortRejects}`,
    );
  } else {
    ops.push(["delete", { kind: "map", name: SET.localhostNodePortRejects }]);
  }
  for (const protocol of LOCALHOST_NODEPORT_PROTOCOLS) {
    if (cfg.localhostRejects.includes(protocol)) continue;
    const chain = localhostNodePortRejectChain(protocol),
      counter = localhostNodePortRejectedCounter(protocol);
    ops.push(["add", { kind: "chain", name: chain }], ["delete", { kind: "chain", name: chain }]);
    ops.push(["add", { kind: "counter", name: counter }], ["delete", { kind: "counter", name: counter }]);
  }
  ops.push(["add", sets.get(SET.firewallIPs)!]);
  ensure(CHAIN.firewallCheck);
  rule(CHAIN.firewallCheck, `${ipX} daddr . meta l4proto . th dport vmap @${SET.firewallIPs}`);
  ops.push(["add", sets.get(SET.serviceIPs)!], ["add", sets.get(SET.serviceNodePorts)!]);
  const masq = `mark set mark or ${mark}`;
  if (cfg.masqueradeAll) {
    rule(
      CHAIN.services,
      `${ipX} daddr @${SET.clusterIPs} ${masq} comment "masquerade all clusterIP traffic"`,
    );
  } else {
    // Off-cluster traffic to a ClusterIP (a static route to the Service range via any node) may bounce
    // off-node: masqueraded.
    const notLocal = ifNotLocal(cfg.localTraffic, ipX);
    if (notLocal !== null) {
      rule(
        CHAIN.services,
        `${ipX} daddr @${SET.clusterIPs} ${notLocal} ${masq} comment "masquerade clusterIP traffic from outside cluster"`,
      );
    }
  }
  rule(CHAIN.services, `${ipX} daddr . meta l4proto . th dport vmap @${SET.serviceIPs}`);
  rule(
    CHAIN.services,
    cfg.nodePortsMatchAll
      ? `fib daddr type local ${noLocalhost} meta l4proto . th dport vmap @${SET.serviceNodePorts}`
      : `${ipX} daddr @${SET.nodePortIPs} meta l4proto . th dport vmap @${SET.serviceNodePorts}`,
  );
  return ops;
}
