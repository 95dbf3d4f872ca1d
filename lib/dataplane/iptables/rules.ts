/**
 * iptables rule rendering, rule for rule as upstream's `syncProxyRules` (pkg/proxy/iptables/proxier.go).
 *
 * Each service port is rendered into a {@linkcode ServicePortBlock} when it changes: its filter rules and nat
 * dispatch rules for KUBE-SERVICES / KUBE-NODEPORTS, encoded to bytes once, and the names of its own
 * SVC/SVL/EXT/FW/SEP chains. The rules of those chains are rendered by {@linkcode renderChainRules} each time the
 * port is written (so the bulk of the payload is never kept in memory). Static chains and rules are in
 * static_rules.ts (re-exported here).
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
  sepName,
  servicePortHash,
} from "./chain_names.ts";
import type { LocalTrafficDetector } from "./local_detector.ts";
import { LOCALHOST_NODEPORTS_ACCEPTED } from "./nfacct.ts";
import { cidrContains } from "../../net/ip.ts";
import { isJumpLine, jumpArgs, type JumpRule } from "../iptables_jumps.ts";
import { masqueradeMark } from "../masquerade.ts";
import { flatString } from "../../flat_string.ts";

/** Above this many endpoints in total, rule comments on SVC/SVL/SEP chains are left out (upstream). */
export const LARGE_CLUSTER_ENDPOINTS_THRESHOLD = 1000;

// The static chains, for the modules that import them from here.
export * from "./static_rules.ts";

export { masqueradeMark };

const probabilities: string[] = ["<bad value>"];

/** `%0.10f` of 1/n, cached (upstream `computeProbability`). */
export function probability(n: number): string {
  for (let i = probabilities.length; i <= n; i++) probabilities.push((1 / i).toFixed(10));
  return probabilities[n];
}

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

function ipOnly(ep: EndpointInfo): string {
  return ep.ip;
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
  const pp = `-m ${proto} -p ${proto}`;
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
  const comment = (v: NoEndpointVerdict | null) =>
    v === "reject" ? `"${name} has no endpoints"` : `"${name} has no local endpoints"`;
  const intTarget = target(plan.internalVerdict), intComment = comment(plan.internalVerdict);
  const extTarget = target(plan.externalVerdict), extComment = comment(plan.externalVerdict);
  const noLocalInternal = plan.internalVerdict === "drop";
  const noLocalExternal = plan.externalVerdict === "drop";

  let filter = "", dispatch = "";
  let nFilter = 0, nDispatch = 0;

  // ClusterIP.
  if (hasInternal) {
    dispatch +=
      `-A KUBE-SERVICES -m comment --comment "${name} cluster IP" ${pp} -d ${info.clusterIP} --dport ${port} -j ${internalChain}\n`;
    nDispatch++;
  } else {
    filter +=
      `-A KUBE-SERVICES -m comment --comment ${intComment} ${pp} -d ${info.clusterIP} --dport ${port} -j ${intTarget}\n`;
    nFilter++;
  }
  // External IPs.
  for (const ip of info.externalIPs) {
    if (hasEndpoints) {
      dispatch +=
        `-A KUBE-SERVICES -m comment --comment "${name} external IP" ${pp} -d ${ip} --dport ${port} -j ${ch.ext}\n`;
      nDispatch++;
    }
    if (!hasExternal) {
      filter +=
        `-A KUBE-EXTERNAL-SERVICES -m comment --comment ${extComment} ${pp} -d ${ip} --dport ${port} -j ${extTarget}\n`;
      nFilter++;
    }
  }
  // LoadBalancer VIPs.
  for (const ip of info.loadBalancerVIPs) {
    if (hasEndpoints) {
      dispatch +=
        `-A KUBE-SERVICES -m comment --comment "${name} loadbalancer IP" ${pp} -d ${ip} --dport ${port} -j ${lbChain}\n`;
      nDispatch++;
    }
    if (usesFW) {
      filter +=
        `-A KUBE-PROXY-FIREWALL -m comment --comment "${name} traffic not accepted by ${ch.fw}" ${pp} -d ${ip} --dport ${port} -j DROP\n`;
      nFilter++;
    }
  }
  if (!hasExternal) {
    for (const ip of info.loadBalancerVIPs) {
      filter +=
        `-A KUBE-EXTERNAL-SERVICES -m comment --comment ${extComment} ${pp} -d ${ip} --dport ${port} -j ${extTarget}\n`;
      nFilter++;
    }
  }
  // NodePort, with upstream's nfacct-counted copy for loopback destinations first when the counter exists.
  if (info.nodePort !== 0) {
    if (hasEndpoints && cfg.localhostNodePorts && cfg.family === "IPv4" && cfg.nfacctLocalhostNodePorts) {
      dispatch +=
        `-A KUBE-NODEPORTS -m comment --comment ${name} ${pp} -d 127.0.0.0/8 --dport ${info.nodePort} -m nfacct --nfacct-name ${LOCALHOST_NODEPORTS_ACCEPTED} -j ${ch.ext}\n`;
      nDispatch++;
    }
    if (hasEndpoints) {
      dispatch +=
        `-A KUBE-NODEPORTS -m comment --comment ${name} ${pp} --dport ${info.nodePort} -j ${ch.ext}\n`;
      nDispatch++;
    }
    if (!hasExternal) {
      filter +=
        `-A KUBE-EXTERNAL-SERVICES -m comment --comment ${extComment} -m addrtype --dst-type LOCAL ${pp} --dport ${info.nodePort} -j ${extTarget}\n`;
      nFilter++;
    }
  }
  // Health check node port: upstream writes it whenever the port's HealthCheckNodePort() != 0, which is only set
  // for services that NeedsHealthCheck (type LoadBalancer with eTP=Local; see service_port.ts). It does not
  // depend on the port being externally reachable yet: an eTP=Local LoadBalancer with
  // allocateLoadBalancerNodePorts:false and no VIP-mode ingress still needs its health check port open.
  if (info.healthCheckNodePort !== 0) {
    filter +=
      `-A KUBE-NODEPORTS -m comment --comment "${name} health check node port" -m tcp -p tcp --dport ${info.healthCheckNodePort} -j ACCEPT\n`;
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

/**
 * The rules of a port's own nat chains (the `:CHAIN` declarations are `block.chains`), exactly as upstream's
 * per-service loop writes them; sets `block.chainRuleCount`. Depends only on the block (its state, chain names
 * and large-cluster setting) and `cfg`, so rendering it again gives the same bytes.
 */
export function renderChainRules(block: ServicePortBlock, cfg: RenderConfig): string {
  const st = block.state;
  const info = st.info;
  const sel = st.selection;
  const plan = st.plan;
  const proto = info.protocol.toLowerCase();
  const name = info.nameString;
  const ch = chainsOfHash(block.chains.hash);
  const largeCluster = block.largeCluster;
  const pp = `-m ${proto} -p ${proto}`;
  const reachable = sel.allReachableEndpoints;
  const extLocal = plan.externalPolicyLocal;
  const internalChain = plan.internalUsesLocalChain ? ch.svl : ch.svc;
  const externalPolicyChain = plan.externalUsesLocalChain ? ch.svl : ch.svc;
  const hasExternal = plan.hasExternalEndpoints;
  let rules = "";
  let nRules = 0;

  if (plan.hasInternalEndpoints) {
    const args = `-m comment --comment "${name} cluster IP" ${pp} -d ${info.clusterIP} --dport ${info.port}`;
    if (cfg.masqueradeAll) {
      rules += `-A ${internalChain} ${args} -j KUBE-MARK-MASQ\n`;
      nRules++;
    } else if (cfg.localDetector.isImplemented) {
      rules += `-A ${internalChain} ${args} ${cfg.localDetector.ifNotLocal} -j KUBE-MARK-MASQ\n`;
      nRules++;
    }
  }

  if (plan.usesExternalChain) {
    if (!extLocal) {
      rules +=
        `-A ${ch.ext} -m comment --comment "masquerade traffic for ${name} external destinations" -j KUBE-MARK-MASQ\n`;
      nRules++;
    } else {
      if (cfg.localDetector.isImplemented) {
        rules +=
          `-A ${ch.ext} -m comment --comment "pod traffic for ${name} external destinations" ${cfg.localDetector.ifLocal} -j ${ch.svc}\n`;
        nRules++;
      }
      rules +=
        `-A ${ch.ext} -m comment --comment "masquerade LOCAL traffic for ${name} external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n`;
      rules +=
        `-A ${ch.ext} -m comment --comment "route LOCAL traffic for ${name} external destinations" -m addrtype --src-type LOCAL -j ${ch.svc}\n`;
      nRules += 2;
    }
    if (hasExternal) {
      rules += `-A ${ch.ext} -j ${externalPolicyChain}\n`;
      nRules++;
    }
  }

  if (plan.usesFirewallChain) {
    const head = `-A ${ch.fw} -m comment --comment "${name} loadbalancer IP"`;
    let allowFromNode = false;
    for (const cidr of info.loadBalancerSourceRanges) {
      rules += `${head} -s ${cidr} -j ${ch.ext}\n`;
      nRules++;
      if (cfg.nodeIP !== null && cidrContains(cidr, cfg.nodeIP)) allowFromNode = true;
    }
    if (allowFromNode) {
      for (const ip of info.loadBalancerVIPs) {
        rules += `${head} -s ${ip} -j ${ch.ext}\n`;
        nRules++;
      }
    }
    rules +=
      `-A ${ch.fw} -m comment --comment "other traffic to ${name} will be dropped by KUBE-PROXY-FIREWALL"\n`;
    nRules++;
  }

  // The SEP chain of an endpoint of a policy list (a sorted subset of the sorted reachable list).
  const sepOf = (eps: readonly EndpointInfo[]): string[] => {
    const out: string[] = new Array(eps.length);
    let j = 0;
    for (let i = 0; i < eps.length; i++) {
      const e = eps[i];
      while (j < reachable.length && reachable[j] !== e && reachable[j].endpoint < e.endpoint) j++;
      if (j >= reachable.length || reachable[j].endpoint !== e.endpoint) {
        throw new Error(`endpoint ${e.endpoint} of ${name} is not among its reachable endpoints`);
      }
      out[i] = sepName(block.chains, j);
    }
    return out;
  };

  const affinity = info.stickyMaxAgeSeconds > 0;
  const writeLB = (chain: string, eps: readonly EndpointInfo[]) => {
    const seps = sepOf(eps);
    if (affinity) {
      for (let i = 0; i < eps.length; i++) {
        const sep = seps[i];
        const c = largeCluster ? "" : ` -m comment --comment "${name} -> ${eps[i].endpoint}"`;
        rules +=
          `-A ${chain}${c} -m recent --name ${sep} --rcheck --seconds ${info.stickyMaxAgeSeconds} --reap -j ${sep}\n`;
        nRules++;
      }
    }
    const n = eps.length;
    for (let i = 0; i < n; i++) {
      const c = largeCluster ? "" : ` -m comment --comment "${name} -> ${eps[i].endpoint}"`;
      const p = i < n - 1 ? ` -m statistic --mode random --probability ${probability(n - i)}` : "";
      rules += `-A ${chain}${c}${p} -j ${seps[i]}\n`;
      nRules++;
    }
  };

  if (plan.usesClusterPolicyChain) writeLB(ch.svc, sel.clusterEndpoints ?? []);
  if (plan.usesLocalPolicyChain) writeLB(ch.svl, sel.localEndpoints ?? []);

  const sepComment = largeCluster ? "" : ` -m comment --comment ${name}`;
  const recent = affinity ? " -m recent --name " : "";
  for (let i = 0; i < reachable.length; i++) {
    const ep = reachable[i];
    const sep = sepName(block.chains, i);
    rules += `-A ${sep}${sepComment} -s ${ipOnly(ep)} -j KUBE-MARK-MASQ\n`;
    rules += `-A ${sep}${sepComment}${
      affinity ? recent + sep + " --set" : ""
    } ${pp} -j DNAT --to-destination ${ep.endpoint}\n`;
    nRules += 2;
  }
  block.chainRuleCount = nRules;
  return rules;
}

export type { JumpRule };
export { isJumpLine, jumpArgs };
