/**
 * kube-proxy's static iptables chains: their names, the fixed rules every payload writes around the
 * per-port ones (KUBE-FIREWALL's localnet block, KUBE-FORWARD, KUBE-POSTROUTING, KUBE-MARK-MASQ, the
 * KUBE-NODEPORTS jump at the end of KUBE-SERVICES), and the jump rules from the built-in chains into them.
 * @module
 */

import type { JumpRule } from "../iptables_jumps.ts";
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
  return `-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n`;
}

/** Static filter rules written after the per-service rules (INVALID drop, KUBE-FORWARD accepts). */
export function filterTailRules(cfg: RenderConfig, conntrackTCPLiberal: boolean): string {
  let s = "";
  if (!conntrackTCPLiberal) {
    const count = cfg.nfacctInvalidDrop ? ` -m nfacct --nfacct-name ${CT_STATE_INVALID_DROPPED}` : "";
    s += `-A KUBE-FORWARD -m conntrack --ctstate INVALID${count} -j DROP\n`;
  }
  s +=
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark ${cfg.mark}/${cfg.mark} -j ACCEPT\n`;
  s +=
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n`;
  return s;
}

/** Static nat rules (KUBE-POSTROUTING, KUBE-MARK-MASQ). */
export function natHeadRules(cfg: RenderConfig, randomFully: boolean): string {
  return `-A KUBE-POSTROUTING -m mark ! --mark ${cfg.mark}/${cfg.mark} -j RETURN\n` +
    `-A KUBE-POSTROUTING -j MARK --xor-mark ${cfg.mark}\n` +
    `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${
      randomFully ? " --random-fully" : ""
    }\n` +
    `-A KUBE-MARK-MASQ -j MARK --or-mark ${cfg.mark}\n`;
}

const NODEPORTS_COMMENT = `"kubernetes service nodeports; NOTE: this must be the last rule in this chain"`;

/**
 * The final KUBE-SERVICES rule(s) jumping to KUBE-NODEPORTS: one addrtype LOCAL rule when nodePortAddresses
 * match all, else one rule per allowed node IP (loopback only with localhost NodePorts on IPv4).
 */
export function nodePortsTailRules(cfg: RenderConfig, matchAll: boolean, nodeIPs: readonly string[]): string {
  if (matchAll) {
    let dest = "-m addrtype --dst-type LOCAL";
    if (cfg.family === "IPv6") dest += " ! -d ::1/128";
    else if (!cfg.localhostNodePorts) dest += " ! -d 127.0.0.0/8";
    return `-A KUBE-SERVICES -m comment --comment ${NODEPORTS_COMMENT} ${dest} -j KUBE-NODEPORTS\n`;
  }
  let s = "";
  for (const ip of nodeIPs) {
    const loop = cfg.family === "IPv6" ? ip === "::1" : ip.startsWith("127.");
    if (loop && (cfg.family === "IPv6" || !cfg.localhostNodePorts)) continue;
    s += `-A KUBE-SERVICES -m comment --comment ${NODEPORTS_COMMENT} -d ${ip} -j KUBE-NODEPORTS\n`;
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
