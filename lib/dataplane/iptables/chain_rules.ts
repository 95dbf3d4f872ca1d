/**
 * The rules of a service port's own nat chains (EXT, FW, SVC, SVL and one SEP chain per endpoint), rule for rule
 * as upstream's per-service loop writes them: the bulk of an iptables payload, rendered each time the port is
 * written and streamed, never kept (its filter and dispatch rules are rules.ts's `renderServicePort`).
 * @module
 */
import type { EndpointInfo } from "../../proxy/types.ts";
import { cidrContains } from "../../net/ip.ts";
import { args, comment, jump, protocol, ruleLine, words } from "../iptables_rule.ts";
import { chainsOfHash, sepName } from "./chain_names.ts";
import type { RenderConfig, ServicePortBlock } from "./rules.ts";
import { KUBE_MARK_MASQ } from "./static_rules.ts";

// Fixed runs of arguments of the endpoint rules (the bulk of a payload), checked once.
const NONE = args();
const JUMP = args("-j");
const RANDOM = args("-m", "statistic", "--mode", "random", "--probability");
const RECENT_NAME = args("-m", "recent", "--name");
const DNAT_TO = args("-j", "DNAT", "--to-destination");

const probabilities: string[] = ["<bad value>"];

/** `%0.10f` of 1/n, cached (upstream `computeProbability`). */
export function probability(n: number): string {
  for (let i = probabilities.length; i <= n; i++) probabilities.push((1 / i).toFixed(10));
  return probabilities[n];
}

function ipOnly(ep: EndpointInfo): string {
  return ep.ip;
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
  const pp = protocol(proto);
  const reachable = sel.allReachableEndpoints;
  const extLocal = plan.externalPolicyLocal;
  const internalChain = plan.internalUsesLocalChain ? ch.svl : ch.svc;
  const externalPolicyChain = plan.externalUsesLocalChain ? ch.svl : ch.svc;
  const hasExternal = plan.hasExternalEndpoints;
  const markMasq = jump(KUBE_MARK_MASQ);
  let rules = "";
  let nRules = 0;

  if (plan.hasInternalEndpoints) {
    const args = [comment(`${name} cluster IP`), pp, ["-d", info.clusterIP, "--dport", String(info.port)]];
    if (cfg.masqueradeAll) {
      rules += ruleLine(internalChain, ...args, markMasq);
      nRules++;
    } else if (cfg.localDetector.isImplemented) {
      rules += ruleLine(internalChain, ...args, words(cfg.localDetector.ifNotLocal), markMasq);
      nRules++;
    }
  }

  if (plan.usesExternalChain) {
    if (!extLocal) {
      rules += ruleLine(ch.ext, comment(`masquerade traffic for ${name} external destinations`), markMasq);
      nRules++;
    } else {
      const fromLocal = ["-m", "addrtype", "--src-type", "LOCAL"];
      if (cfg.localDetector.isImplemented) {
        rules += ruleLine(
          ch.ext,
          comment(`pod traffic for ${name} external destinations`),
          words(cfg.localDetector.ifLocal),
          jump(ch.svc),
        );
        nRules++;
      }
      rules += ruleLine(
        ch.ext,
        comment(`masquerade LOCAL traffic for ${name} external destinations`),
        fromLocal,
        markMasq,
      );
      rules += ruleLine(
        ch.ext,
        comment(`route LOCAL traffic for ${name} external destinations`),
        fromLocal,
        jump(ch.svc),
      );
      nRules += 2;
    }
    if (hasExternal) {
      rules += ruleLine(ch.ext, jump(externalPolicyChain));
      nRules++;
    }
  }

  if (plan.usesFirewallChain) {
    const head = comment(`${name} loadbalancer IP`);
    let allowFromNode = false;
    for (const cidr of info.loadBalancerSourceRanges) {
      rules += ruleLine(ch.fw, head, "-s", cidr, jump(ch.ext));
      nRules++;
      if (cfg.nodeIP !== null && cidrContains(cidr, cfg.nodeIP)) allowFromNode = true;
    }
    if (allowFromNode) {
      for (const ip of info.loadBalancerVIPs) {
        rules += ruleLine(ch.fw, head, "-s", ip, jump(ch.ext));
        nRules++;
      }
    }
    rules += ruleLine(ch.fw, comment(`other traffic to ${name} will be dropped by KUBE-PROXY-FIREWALL`));
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
    const epComment = (i: number) => largeCluster ? NONE : comment(`${name} -> ${eps[i].endpoint}`);
    if (affinity) {
      const seconds = String(info.stickyMaxAgeSeconds);
      for (let i = 0; i < eps.length; i++) {
        const sep = seps[i];
        rules += ruleLine(
          chain,
          epComment(i),
          RECENT_NAME,
          sep,
          "--rcheck",
          "--seconds",
          seconds,
          "--reap",
          JUMP,
          sep,
        );
        nRules++;
      }
    }
    const n = eps.length;
    for (let i = 0; i < n; i++) {
      rules += i < n - 1
        ? ruleLine(chain, epComment(i), RANDOM, probability(n - i), JUMP, seps[i])
        : ruleLine(chain, epComment(i), JUMP, seps[i]);
      nRules++;
    }
  };

  if (plan.usesClusterPolicyChain) writeLB(ch.svc, sel.clusterEndpoints ?? []);
  if (plan.usesLocalPolicyChain) writeLB(ch.svl, sel.localEndpoints ?? []);

  const sepComment = largeCluster ? NONE : comment(name);
  for (let i = 0; i < reachable.length; i++) {
    const ep = reachable[i];
    const sep = sepName(block.chains, i);
    rules += ruleLine(sep, sepComment, "-s", ipOnly(ep), markMasq);
    rules += affinity
      ? ruleLine(sep, sepComment, RECENT_NAME, sep, "--set", pp, DNAT_TO, ep.endpoint)
      : ruleLine(sep, sepComment, pp, DNAT_TO, ep.endpoint);
    nRules += 2;
  }
  block.chainRuleCount = nRules;
  return rules;
}
