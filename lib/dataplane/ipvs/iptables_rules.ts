/**
 * The iptables rules of the ipvs mode, rule for rule as upstream's `writeIptablesRules` and
 * `createAndLinkKubeChain` (pkg/proxy/ipvs/proxier.go): they match the mode's ipsets, so they depend only on
 * which sets have members, the masquerade settings and the LoadBalancer IPs the node may not reach
 * (KUBE-IPVS-OUT-FILTER). One `iptables-restore --noflush` payload: nat first, then filter, as upstream.
 * @module
 */
import type { IPFamily } from "../../net/ip.ts";
import type { JumpRule } from "../iptables_jumps.ts";
import type { LocalTrafficDetector } from "../iptables_local_detector.ts";
import { SET_BY_KEY, type SetKey, setName } from "./ipsets.ts";

/** nat chains of the mode, in upstream's `iptablesChains` order. */
export const NAT_CHAINS = [
  "KUBE-SERVICES",
  "KUBE-POSTROUTING",
  "KUBE-NODE-PORT",
  "KUBE-LOAD-BALANCER",
  "KUBE-MARK-MASQ",
] as const;
/** filter chains of the mode. */
export const FILTER_CHAINS = [
  "KUBE-FORWARD",
  "KUBE-NODE-PORT",
  "KUBE-PROXY-FIREWALL",
  "KUBE-SOURCE-RANGES-FIREWALL",
  "KUBE-IPVS-FILTER",
  "KUBE-IPVS-OUT-FILTER",
] as const;

/** The jump rules, in upstream's `iptablesJumpChain` order (each prepended when missing). */
export const IPVS_JUMP_RULES: readonly JumpRule[] = [
  { table: "nat", from: "OUTPUT", to: "KUBE-SERVICES", extra: "", comment: "kubernetes service portals" },
  { table: "nat", from: "PREROUTING", to: "KUBE-SERVICES", extra: "", comment: "kubernetes service portals" },
  {
    table: "nat",
    from: "POSTROUTING",
    to: "KUBE-POSTROUTING",
    extra: "",
    comment: "kubernetes postrouting rules",
  },
  { table: "filter", from: "FORWARD", to: "KUBE-FORWARD", extra: "", comment: "kubernetes forwarding rules" },
  {
    table: "filter",
    from: "INPUT",
    to: "KUBE-NODE-PORT",
    extra: "",
    comment: "kubernetes health check rules",
  },
  {
    table: "filter",
    from: "INPUT",
    to: "KUBE-PROXY-FIREWALL",
    extra: "",
    comment: "kube-proxy firewall rules",
  },
  {
    table: "filter",
    from: "FORWARD",
    to: "KUBE-PROXY-FIREWALL",
    extra: "",
    comment: "kube-proxy firewall rules",
  },
  {
    table: "filter",
    from: "INPUT",
    to: "KUBE-IPVS-FILTER",
    extra: "",
    comment: "kubernetes ipvs access filter",
  },
  {
    table: "filter",
    from: "OUTPUT",
    to: "KUBE-IPVS-OUT-FILTER",
    extra: "",
    comment: "kubernetes ipvs access filter",
  },
];

/** Upstream's `ipsetWithIptablesChain`: set → rule in a chain (LOCAL sets before the others). */
const SET_RULES: readonly {
  set: SetKey;
  table: "nat" | "filter";
  from: string;
  to: string;
  match: string;
  proto: string;
}[] = [
  {
    set: "KUBE-LOOP-BACK",
    table: "nat",
    from: "KUBE-POSTROUTING",
    to: "MASQUERADE",
    match: "dst,dst,src",
    proto: "",
  },
  {
    set: "KUBE-LOAD-BALANCER",
    table: "nat",
    from: "KUBE-SERVICES",
    to: "KUBE-LOAD-BALANCER",
    match: "dst,dst",
    proto: "",
  },
  {
    set: "KUBE-LOAD-BALANCER-LOCAL",
    table: "nat",
    from: "KUBE-LOAD-BALANCER",
    to: "RETURN",
    match: "dst,dst",
    proto: "",
  },
  {
    set: "KUBE-NODE-PORT-LOCAL-TCP",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "RETURN",
    match: "dst",
    proto: "tcp",
  },
  {
    set: "KUBE-NODE-PORT-TCP",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "KUBE-MARK-MASQ",
    match: "dst",
    proto: "tcp",
  },
  {
    set: "KUBE-NODE-PORT-LOCAL-UDP",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "RETURN",
    match: "dst",
    proto: "udp",
  },
  {
    set: "KUBE-NODE-PORT-UDP",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "KUBE-MARK-MASQ",
    match: "dst",
    proto: "udp",
  },
  {
    set: "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "RETURN",
    match: "dst,dst",
    proto: "sctp",
  },
  {
    set: "KUBE-NODE-PORT-SCTP-HASH",
    table: "nat",
    from: "KUBE-NODE-PORT",
    to: "KUBE-MARK-MASQ",
    match: "dst,dst",
    proto: "sctp",
  },
  {
    set: "KUBE-LOAD-BALANCER-FW",
    table: "filter",
    from: "KUBE-PROXY-FIREWALL",
    to: "KUBE-SOURCE-RANGES-FIREWALL",
    match: "dst,dst",
    proto: "",
  },
  {
    set: "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    table: "filter",
    from: "KUBE-SOURCE-RANGES-FIREWALL",
    to: "RETURN",
    match: "dst,dst,src",
    proto: "",
  },
  {
    set: "KUBE-LOAD-BALANCER-SOURCE-IP",
    table: "filter",
    from: "KUBE-SOURCE-RANGES-FIREWALL",
    to: "RETURN",
    match: "dst,dst,src",
    proto: "",
  },
];

/** What the rules depend on besides the sets' contents. */
export interface IpvsRulesConfig {
  readonly family: IPFamily;
  /** e.g. `0x00004000`. */
  readonly mark: string;
  readonly masqueradeAll: boolean;
  readonly localDetector: LocalTrafficDetector;
  /** Append `--random-fully` to MASQUERADE. */
  readonly randomFully: boolean;
}

/** A LoadBalancer IP:port the node itself may not reach (source ranges that do not contain the node IP). */
export interface OutFilterEntry {
  readonly ip: string;
  /** Lowercase. */
  readonly proto: string;
  readonly port: number;
}

/** The `-A KUBE-IPVS-OUT-FILTER` rule of one entry. */
export function outFilterRule(e: OutFilterEntry): string {
  return `-A KUBE-IPVS-OUT-FILTER -s ${e.ip} -m ipvs --vaddr ${e.ip} --vproto ${e.proto} --vport ${e.port} -j DROP\n`;
}

/**
 * The restore payload (without jump rules): chain declarations, then upstream's rules in its order.
 * `nonEmpty(key)` tells whether a set has members after this sync; `outFilter` holds the rules of
 * KUBE-IPVS-OUT-FILTER (one per entry, in service order).
 */
export function renderIpvsIptables(
  cfg: IpvsRulesConfig,
  nonEmpty: (key: SetKey) => boolean,
  outFilter: string,
  jumps: { nat: string; filter: string } = { nat: "", filter: "" },
): string {
  const name = (k: SetKey) => setName(k, cfg.family);
  const comment = (k: SetKey) => `"${SET_BY_KEY.get(k)!.comment}"`;
  let nat = "", filter = "";
  nat += `-A KUBE-SERVICES -s ${cfg.family === "IPv6" ? "::1/128" : "127.0.0.0/8"} -j RETURN\n`;
  for (const r of SET_RULES) {
    if (!nonEmpty(r.set)) continue;
    const line = `-A ${r.from}${r.proto ? ` -p ${r.proto}` : ""} -m comment --comment ${comment(r.set)} ` +
      `-m set --match-set ${name(r.set)} ${r.match} -j ${r.to}\n`;
    if (r.table === "nat") nat += line;
    else filter += line;
  }
  if (nonEmpty("KUBE-CLUSTER-IP")) {
    const head = `-A KUBE-SERVICES -m comment --comment ${comment("KUBE-CLUSTER-IP")} -m set --match-set ${
      name("KUBE-CLUSTER-IP")
    }`;
    if (cfg.masqueradeAll) nat += `${head} dst,dst -j KUBE-MARK-MASQ\n`;
    else if (cfg.localDetector.isImplemented) {
      nat += `${head} dst,dst ${cfg.localDetector.ifNotLocal} -j KUBE-MARK-MASQ\n`;
    } else nat += `${head} src,dst -j KUBE-MARK-MASQ\n`;
  }
  const externalIPRules = (head: string) => {
    nat += `${head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT\n`;
    nat += `${head} -m addrtype --dst-type LOCAL -j ACCEPT\n`;
  };
  if (nonEmpty("KUBE-EXTERNAL-IP")) {
    const head = `-A KUBE-SERVICES -m comment --comment ${comment("KUBE-EXTERNAL-IP")} -m set --match-set ${
      name("KUBE-EXTERNAL-IP")
    } dst,dst`;
    nat += `${head} -j KUBE-MARK-MASQ\n`;
    externalIPRules(head);
  }
  if (nonEmpty("KUBE-EXTERNAL-IP-LOCAL")) {
    externalIPRules(
      `-A KUBE-SERVICES -m comment --comment ${comment("KUBE-EXTERNAL-IP-LOCAL")} -m set --match-set ${
        name("KUBE-EXTERNAL-IP-LOCAL")
      } dst,dst`,
    );
  }
  nat += "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n";
  nat += "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n";
  filter += "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n";
  filter += outFilter;
  // acceptIPVSTraffic: must stay at the end of KUBE-SERVICES.
  for (const k of ["KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"] as const) {
    if (nonEmpty(k)) nat += `-A KUBE-SERVICES -m set --match-set ${name(k)} dst,dst -j ACCEPT\n`;
  }
  const mark = `${cfg.mark}/${cfg.mark}`;
  filter +=
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark} -j ACCEPT\n`;
  filter +=
    `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n`;
  filter += `-A KUBE-NODE-PORT -m comment --comment ${
    comment("KUBE-HEALTH-CHECK-NODE-PORT")
  } -m set --match-set ${name("KUBE-HEALTH-CHECK-NODE-PORT")} dst -j ACCEPT\n`;
  for (
    const k of [
      "KUBE-LOAD-BALANCER",
      "KUBE-CLUSTER-IP",
      "KUBE-EXTERNAL-IP",
      "KUBE-EXTERNAL-IP-LOCAL",
    ] as const
  ) {
    filter += `-A KUBE-IPVS-FILTER -m set --match-set ${name(k)} dst,dst -j RETURN\n`;
  }
  filter += `-A KUBE-IPVS-FILTER -m set --match-set ${name("KUBE-HEALTH-CHECK-NODE-PORT")} dst -j RETURN\n`;
  filter += `-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set ${
    name("KUBE-IPVS-IPS")
  } dst -j REJECT\n`;
  nat += `-A KUBE-POSTROUTING -m mark ! --mark ${mark} -j RETURN\n`;
  nat += `-A KUBE-POSTROUTING -j MARK --xor-mark ${cfg.mark}\n`;
  nat += `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${
    cfg.randomFully ? " --random-fully" : ""
  }\n`;
  nat += `-A KUBE-MARK-MASQ -j MARK --or-mark ${cfg.mark}\n`;
  return "*nat\n" + NAT_CHAINS.map((c) => `:${c} - [0:0]\n`).join("") + nat + jumps.nat + "COMMIT\n" +
    "*filter\n" + FILTER_CHAINS.map((c) => `:${c} - [0:0]\n`).join("") + filter + jumps.filter + "COMMIT\n";
}
