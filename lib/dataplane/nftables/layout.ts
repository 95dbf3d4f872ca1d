/**
 * The fixed part of the nftables table, as upstream v1.37's `setupNFTables` writes it on every full sync: the
 * table, the base chains and their jumps into regular chains, the shared maps and sets holding per-port elements,
 * and the static chains' rules (masquerading, ClusterIP checks, NodePort and localhost NodePort checks, reject,
 * firewall and service dispatch). Re-exported by `rules.ts`.
 * @module
 */
import type { IPFamily } from "../../proxy/types.ts";
import type { LocalTraffic } from "../local_traffic.ts";
import {
  CHAIN,
  LOCALHOST_NODEPORT_PROTOCOLS,
  localhostNodePortRejectChain,
  localhostNodePortRejectedCounter,
  SET,
  TABLE_COMMENT,
} from "./names.ts";
import type { ChainHook, ChainType, NftMap, NftSet } from "./objects.ts";
import { elementObject, ifNotLocal, nftFamily, type NftOp, ruleObject } from "./render_parts.ts";

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
