/**
 * kube-proxy's static iptables chains: their names, the fixed rules every payload writes around the
 * per-port ones (KUBE-FIREWALL's localnet block, KUBE-FORWARD, KUBE-POSTROUTING, KUBE-MARK-MASQ, the
 * KUBE-NODEPORTS jump at the end of KUBE-SERVICES), and the jump rules from the built-in chains into them.
 * @module
 */

import type { JumpRule } from "../iptables_jumps.ts";
import { comment, jump, ruleLine } from "../iptables_rule.ts";
import { CT_STATE_INVALID_DROPPED } from "./nfacct.ts";
import type { RenderConfig } from "./rules.ts";

/** Chain names of kube-proxy's static chains. */
export const KUBE_SERVICES = "KUBE-SERVICES";
/** Filter: REJECT/DROP for external destinations without endpoints. */
export const KUBE_EXTERNAL_SERVICES = "KUBE-EXTERNAL-SERVICES";
/** Filter: forwarding accept rules. */
export const KUBE_FORWARD = "KUBE-FORWARD";
/** nat: NodePort dispatch; filter: health-check node port accepts. */
export const KUBE_NODEPORTS = "KUBE-NODEPORTS";
/** Filter: loadBalancerSourceRanges drops. */
export const KUBE_PROXY_FIREWALL = "KUBE-PROXY-FIREWALL";
/** nat: SNAT of marked traffic. */
export const KUBE_POSTROUTING = "KUBE-POSTROUTING";
/** nat: sets the masquerade mark. */
export const KUBE_MARK_MASQ = "KUBE-MARK-MASQ";
/** Filter: kubelet's localnet block chain (copied by kube-proxy). */
export const KUBE_FIREWALL = "KUBE-FIREWALL";
/** Empty chain in mangle, nat and filter whose disappearance reveals an external flush. */
export const KUBE_PROXY_CANARY = "KUBE-PROXY-CANARY";

/** Static filter rules written before the per-service rules (the localnet block rule). */
export function filterHeadRules(cfg: RenderConfig): string {
  if (cfg.family !== "IPv4" || !cfg.localhostNodePorts) return "";
  return ruleLine(
    KUBE_FIREWALL,
    comment("block incoming localnet connections"),
    ["-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8"],
    ["-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT"],
    jump("DROP"),
  );
}

/** Static filter rules written after the per-service rules (INVALID drop, KUBE-FORWARD accepts). */
export function filterTailRules(cfg: RenderConfig, conntrackTCPLiberal: boolean): string {
  let s = "";
  if (!conntrackTCPLiberal) {
    const count = cfg.nfacctInvalidDrop ? ["-m", "nfacct", "--nfacct-name", CT_STATE_INVALID_DROPPED] : [];
    s += ruleLine(KUBE_FORWARD, ["-m", "conntrack", "--ctstate", "INVALID"], count, jump("DROP"));
  }
  s += ruleLine(
    KUBE_FORWARD,
    comment("kubernetes forwarding rules"),
    ["-m", "mark", "--mark", `${cfg.mark}/${cfg.mark}`],
    jump("ACCEPT"),
  );
  s += ruleLine(
    KUBE_FORWARD,
    comment("kubernetes forwarding conntrack rule"),
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"],
    jump("ACCEPT"),
  );
  return s;
}

/** Static nat rules (KUBE-POSTROUTING, KUBE-MARK-MASQ). */
export function natHeadRules(cfg: RenderConfig, randomFully: boolean): string {
  return ruleLine(
    KUBE_POSTROUTING,
    ["-m", "mark", "!", "--mark", `${cfg.mark}/${cfg.mark}`],
    jump("RETURN"),
  ) +
    ruleLine(KUBE_POSTROUTING, jump("MARK", "--xor-mark", cfg.mark)) +
    ruleLine(
      KUBE_POSTROUTING,
      comment("kubernetes service traffic requiring SNAT"),
      randomFully ? jump("MASQUERADE", "--random-fully") : jump("MASQUERADE"),
    ) +
    ruleLine(KUBE_MARK_MASQ, jump("MARK", "--or-mark", cfg.mark));
}

const NODEPORTS_COMMENT = comment(
  "kubernetes service nodeports; NOTE: this must be the last rule in this chain",
);

/**
 * The final KUBE-SERVICES rule(s) jumping to KUBE-NODEPORTS: one addrtype LOCAL rule when nodePortAddresses
 * match all, else one rule per allowed node IP (loopback only with localhost NodePorts on IPv4).
 */
export function nodePortsTailRules(cfg: RenderConfig, matchAll: boolean, nodeIPs: readonly string[]): string {
  if (matchAll) {
    const dest = ["-m", "addrtype", "--dst-type", "LOCAL"];
    if (cfg.family === "IPv6") dest.push("!", "-d", "::1/128");
    else if (!cfg.localhostNodePorts) dest.push("!", "-d", "127.0.0.0/8");
    return ruleLine(KUBE_SERVICES, NODEPORTS_COMMENT, dest, jump(KUBE_NODEPORTS));
  }
  let s = "";
  for (const ip of nodeIPs) {
    const loop = cfg.family === "IPv6" ? ip === "::1" : ip.startsWith("127.");
    if (loop && (cfg.family === "IPv6" || !cfg.localhostNodePorts)) continue;
    s += ruleLine(KUBE_SERVICES, NODEPORTS_COMMENT, ["-d", ip], jump(KUBE_NODEPORTS));
  }
  return s;
}

const NEW = "-m conntrack --ctstate NEW";

/** The jump rules, in upstream order (each is inserted at position 1 when missing). */
export const JUMP_RULES: readonly JumpRule[] = [
  {
    table: "filter",
    from: "INPUT",
    to: KUBE_EXTERNAL_SERVICES,
    extra: NEW,
    comment: "kubernetes externally-visible service portals",
  },
  {
    table: "filter",
    from: "FORWARD",
    to: KUBE_EXTERNAL_SERVICES,
    extra: NEW,
    comment: "kubernetes externally-visible service portals",
  },
  {
    table: "filter",
    from: "INPUT",
    to: KUBE_NODEPORTS,
    extra: "",
    comment: "kubernetes health check service ports",
  },
  { table: "filter", from: "FORWARD", to: KUBE_SERVICES, extra: NEW, comment: "kubernetes service portals" },
  { table: "filter", from: "OUTPUT", to: KUBE_SERVICES, extra: NEW, comment: "kubernetes service portals" },
  { table: "filter", from: "FORWARD", to: KUBE_FORWARD, extra: "", comment: "kubernetes forwarding rules" },
  {
    table: "filter",
    from: "INPUT",
    to: KUBE_PROXY_FIREWALL,
    extra: NEW,
    comment: "kubernetes load balancer firewall",
  },
  {
    table: "filter",
    from: "OUTPUT",
    to: KUBE_PROXY_FIREWALL,
    extra: NEW,
    comment: "kubernetes load balancer firewall",
  },
  {
    table: "filter",
    from: "FORWARD",
    to: KUBE_PROXY_FIREWALL,
    extra: NEW,
    comment: "kubernetes load balancer firewall",
  },
  { table: "nat", from: "OUTPUT", to: KUBE_SERVICES, extra: "", comment: "kubernetes service portals" },
  { table: "nat", from: "PREROUTING", to: KUBE_SERVICES, extra: "", comment: "kubernetes service portals" },
  {
    table: "nat",
    from: "POSTROUTING",
    to: KUBE_POSTROUTING,
    extra: "",
    comment: "kubernetes postrouting rules",
  },
];

/** kubelet's KUBE-FIREWALL jumps, copied by kube-proxy (only with localhost NodePorts here). */
export const KUBELET_JUMP_RULES: readonly JumpRule[] = [
  { table: "filter", from: "INPUT", to: KUBE_FIREWALL, extra: "", comment: "" },
  { table: "filter", from: "OUTPUT", to: KUBE_FIREWALL, extra: "", comment: "" },
];
