/**
 * iptables rule rendering, rule for rule as upstream's `syncProxyRules` (pkg/proxy/iptables/proxier.go).
 *
 * Each service port is rendered into a {@linkcode ServicePortBlock} when it changes: its filter rules and nat
 * dispatch rules for KUBE-SERVICES / KUBE-NODEPORTS, encoded to bytes once, and the names of its own
 * SVC/SVL/EXT/FW/SEP chains. The rules of those chains are rendered by {@linkcode renderChainRules} each time the
 * port is written (so the bulk of the payload is never kept in memory; chain_rules.ts). Static chains and rules
 * are in static_rules.ts (re-exported here).
 * @module
 */

import type { EndpointInfo, IPFamily, ServicePortState } from "../../proxy/types.ts";
import type { NoEndpointVerdict } from "../../proxy/service_plan.ts";
import {
  CHAIN_EXT,
  CHAIN_FW,
  CHAIN_SVC,
  CHAIN_SVL,
  chainsOfHash,
  endpointHash,
  type PortChains,
  servicePortHash,
} from "./chain_names.ts";
import type { LocalTrafficDetector } from "./local_detector.ts";
import { LOCALHOST_NODEPORTS_ACCEPTED } from "./nfacct.ts";
import { isJumpLine, type JumpRule } from "../iptables_jumps.ts";
import { masqueradeMark } from "../masquerade.ts";
import { comment, jump, protocol, ruleLine } from "../iptables_rule.ts";
import {
  KUBE_EXTERNAL_SERVICES,
  KUBE_NODEPORTS,
  KUBE_PROXY_FIREWALL,
  KUBE_SERVICES,
} from "./static_rules.ts";
import { flatString } from "../../flat_string.ts";

/** Above this many endpoints in total, rule comments on SVC/SVL/SEP chains are left out (upstream). */
export const LARGE_CLUSTER_ENDPOINTS_THRESHOLD = 1000;

// The static chains, for the modules that import them from here.
export * from "./static_rules.ts";

export { masqueradeMark };

// A port's own chains' rules (chain_rules.ts), for the modules that import them from here.
export { probability, renderChainRules } from "./chain_rules.ts";

/** Settings that shape every service port's rules. A change of any of them invalidates all cached blocks. */
export interface RenderConfig {
  readonly family: IPFamily;
  /** e.g. `0x00004000`. */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  readonly localDetector: LocalTrafficDetector;
  /** Effective localhost NodePorts (IPv4 only, and only when nodePortAddresses include 127.0.0.1). */
  readonly localhostNodePorts: boolean;
  /** Primary node IP of the family (loadBalancerSourceRanges self-allow); null when unknown. */
  readonly nodeIP: string | null;
  /** The nfacct counter for INVALID drops exists: the KUBE-FORWARD drop rule counts into it. */
  readonly nfacctInvalidDrop: boolean;
  /** The nfacct counter for localhost NodePorts exists: loopback NodePort traffic gets a counting rule. */
  readonly nfacctLocalhostNodePorts: boolean;
}

/**
 * One rendered service port: its filter and nat dispatch rules (rendered once when the port changes, written on
 * every sync) and the names of its own nat chains. The rules of those chains, the bulk of a payload,
 * are not kept: {@linkcode renderChainRules} renders them when the port is written (on a change, and on full
 * syncs), straight into the payload stream.
 */
export interface ServicePortBlock {
  /** The state this block was rendered from (identity check for the cache). */
  state: ServicePortState;
  /** Filter rules (KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-PROXY-FIREWALL, KUBE-NODEPORTS). */
  filter: string;
  /** nat rules in KUBE-SERVICES and KUBE-NODEPORTS (always written). */
  dispatch: string;
  /**
   * The port's own nat chains (compactly; `chainNames` lists them), in declaration order: EXT, FW, SVC, SVL
   * (those it uses), then one SEP chain per `state.selection.allReachableEndpoints` entry, in that order.
   */
  readonly chains: PortChains;
  readonly filterRuleCount: number;
  readonly dispatchRuleCount: number;
  /** Rules in the port's own chains; -1 until {@linkcode renderChainRules} ran for this block. */
  chainRuleCount: number;
  /** Rendered with large-cluster mode (no comments). */
  readonly largeCluster: boolean;
  /** iTP=Local without local endpoints (DROP). */
  readonly noLocalInternal: boolean;
  /** eTP=Local without local endpoints (DROP for external destinations). */
  readonly noLocalExternal: boolean;
}

/**
 * The KUBE-SEP chain hashes of a port's reachable endpoints (in `eps` order, concatenated), reusing those of
 * `prev` (the same port's previous block, rendered with the same settings) for endpoints it already had, so that
 * a re-render only hashes new endpoints without a process-wide name cache.
 */
function sepHashes(
  eps: readonly EndpointInfo[],
  name: string,
  proto: string,
  prev: ServicePortBlock | undefined,
): string {
  const out: string[] = new Array(eps.length);
  const old = prev !== undefined && prev.state.info.nameString === name &&
      prev.state.info.protocol.toLowerCase() === proto
    ? prev.state.selection.allReachableEndpoints
    : [];
  const seps = prev?.chains.seps ?? "";
  let j = 0;
  for (let i = 0; i < eps.length; i++) {
    const e = eps[i].endpoint;
    while (j < old.length && old[j].endpoint < e) j++;
    out[i] = j < old.length && old[j].endpoint === e
      ? seps.substring(j << 4, (j + 1) << 4)
      : endpointHash(name, proto, e);
  }
  return out.join("");
}

/**
 * Renders one service port's filter and dispatch rules exactly as upstream's per-service loop body, and names
 * its chains. `prev`, the port's previous block rendered with the same settings, only lends its endpoint chain
 * names. (`cfg` shapes the chains' own rules, see {@linkcode renderChainRules}, and the localhost NodePort
 * rule's nfacct counter; a block is always made for one configuration.)
 */
export function renderServicePort(
  st: ServicePortState,
  cfg: RenderConfig,
  largeCluster: boolean,
  prev?: ServicePortBlock,
): ServicePortBlock {
  const info = st.info;
  const sel = st.selection;
  const proto = info.protocol.toLowerCase();
  const name = info.nameString;
  const samePort = prev !== undefined && prev.state.info.nameString === name &&
    prev.state.info.protocol === info.protocol;
  const hash = samePort ? prev.chains.hash : servicePortHash(name, proto);
  const ch = chainsOfHash(hash);
  const seps = sepHashes(sel.allReachableEndpoints, name, proto, prev);
  const pp = protocol(proto);
  const port = String(info.port);

  const plan = st.plan;
  const hasEndpoints = plan.hasEndpoints;
  const internalChain = plan.internalUsesLocalChain ? ch.svl : ch.svc;
  const hasInternal = plan.hasInternalEndpoints;
  const hasExternal = plan.hasExternalEndpoints;
  const usesFW = plan.usesFirewallChain;
  const lbChain = usesFW ? ch.fw : ch.ext;

  // REJECT when the port has no endpoints at all, DROP when a Local policy finds none on this node.
  const target = (v: NoEndpointVerdict | null) => v === "reject" ? "REJECT" : "DROP";
  const noEndpoints = (v: NoEndpointVerdict | null) =>
    comment(v === "reject" ? `${name} has no endpoints` : `${name} has no local endpoints`);
  const intTarget = jump(target(plan.internalVerdict)), intComment = noEndpoints(plan.internalVerdict);
  const extTarget = jump(target(plan.externalVerdict)), extComment = noEndpoints(plan.externalVerdict);
  const noLocalInternal = plan.internalVerdict === "drop";
  const noLocalExternal = plan.externalVerdict === "drop";

  let filter = "", dispatch = "";
  let nFilter = 0, nDispatch = 0;
  const to = (ip: string) => ["-d", ip, "--dport", port];

  // ClusterIP.
  if (hasInternal) {
    dispatch += ruleLine(
      KUBE_SERVICES,
      comment(`${name} cluster IP`),
      pp,
      to(info.clusterIP),
      jump(internalChain),
    );
    nDispatch++;
  } else {
    filter += ruleLine(KUBE_SERVICES, intComment, pp, to(info.clusterIP), intTarget);
    nFilter++;
  }
  // External IPs.
  for (const ip of info.externalIPs) {
    if (hasEndpoints) {
      dispatch += ruleLine(KUBE_SERVICES, comment(`${name} external IP`), pp, to(ip), jump(ch.ext));
      nDispatch++;
    }
    if (!hasExternal) {
      filter += ruleLine(KUBE_EXTERNAL_SERVICES, extComment, pp, to(ip), extTarget);
      nFilter++;
    }
  }
  // LoadBalancer VIPs.
  for (const ip of info.loadBalancerVIPs) {
    if (hasEndpoints) {
      dispatch += ruleLine(KUBE_SERVICES, comment(`${name} loadbalancer IP`), pp, to(ip), jump(lbChain));
      nDispatch++;
    }
    if (usesFW) {
      filter += ruleLine(
        KUBE_PROXY_FIREWALL,
        comment(`${name} traffic not accepted by ${ch.fw}`),
        pp,
        to(ip),
        jump("DROP"),
      );
      nFilter++;
    }
  }
  if (!hasExternal) {
    for (const ip of info.loadBalancerVIPs) {
      filter += ruleLine(KUBE_EXTERNAL_SERVICES, extComment, pp, to(ip), extTarget);
      nFilter++;
    }
  }
  // NodePort, with upstream's nfacct-counted copy for loopback destinations first when the counter exists.
  if (info.nodePort !== 0) {
    const nodePort = ["--dport", String(info.nodePort)];
    if (hasEndpoints && cfg.localhostNodePorts && cfg.family === "IPv4" && cfg.nfacctLocalhostNodePorts) {
      dispatch += ruleLine(
        KUBE_NODEPORTS,
        comment(name),
        pp,
        ["-d", "127.0.0.0/8"],
        nodePort,
        ["-m", "nfacct", "--nfacct-name", LOCALHOST_NODEPORTS_ACCEPTED],
        jump(ch.ext),
      );
      nDispatch++;
    }
    if (hasEndpoints) {
      dispatch += ruleLine(KUBE_NODEPORTS, comment(name), pp, nodePort, jump(ch.ext));
      nDispatch++;
    }
    if (!hasExternal) {
      filter += ruleLine(
        KUBE_EXTERNAL_SERVICES,
        extComment,
        ["-m", "addrtype", "--dst-type", "LOCAL"],
        pp,
        nodePort,
        extTarget,
      );
      nFilter++;
    }
  }
  // Health check node port: upstream writes it whenever the port's HealthCheckNodePort() != 0, which is only set
  // for services that NeedsHealthCheck (type LoadBalancer with eTP=Local; see service_port.ts). It does not
  // depend on the port being externally reachable yet: an eTP=Local LoadBalancer with
  // allocateLoadBalancerNodePorts:false and no VIP-mode ingress still needs its health check port open.
  if (info.healthCheckNodePort !== 0) {
    filter += ruleLine(
      KUBE_NODEPORTS,
      comment(`${name} health check node port`),
      protocol("tcp"),
      ["--dport", String(info.healthCheckNodePort)],
      jump("ACCEPT"),
    );
    nFilter++;
  }

  // The port's own chains (their rules are rendered by renderChainRules, when the port is written).
  const kinds = (plan.usesExternalChain ? CHAIN_EXT : 0) | (usesFW ? CHAIN_FW : 0) |
    (plan.usesClusterPolicyChain ? CHAIN_SVC : 0) | (plan.usesLocalPolicyChain ? CHAIN_SVL : 0);
  const chains: PortChains = { hash, kinds, seps };

  return {
    state: st,
    // Kept as long as the port is unchanged: flattened (a concatenation would keep every piece).
    filter: flatString(filter),
    dispatch: flatString(dispatch),
    chains,
    filterRuleCount: nFilter,
    dispatchRuleCount: nDispatch,
    chainRuleCount: -1,
    largeCluster,
    noLocalInternal,
    noLocalExternal,
  };
}

export type { JumpRule };
export { isJumpLine };
