/**
 * The iptables rules of the ipvs mode, rule for rule as upstream's `writeIptablesRules` and
 * `createAndLinkKubeChain` (pkg/proxy/ipvs/proxier.go): they match the mode's ipsets, so they depend only on
 * which sets have members, the masquerade settings and the LoadBalancer IPs the node may not reach
 * (KUBE-IPVS-OUT-FILTER). One `iptables-restore --noflush` payload: nat first, then filter, as upstream.
 * @module
 */
import type { IPFamily } from "../../net/ip.ts";
import type { JumpRule } from "../iptables_jumps.ts";
import { chainLine, comment, jump, ruleLine, words } from "../iptables_rule.ts";
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
  return ruleLine(
    "KUBE-IPVS-OUT-FILTER",
    ["-s", e.ip, "-m", "ipvs", "--vaddr", e.ip, "--vproto", e.proto, "--vport", String(e.port)],
    jump("DROP"),
  );
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
  const setComment = (k: SetKey) => comment(SET_BY_KEY.get(k)!.comment);
  const matchSet = (k: SetKey, dirs: string) => ["-m", "set", "--match-set", name(k), dirs];
  const markMasq = jump("KUBE-MARK-MASQ");
  let nat = "", filter = "";
  nat += ruleLine("KUBE-SERVICES", ["-s", cfg.family === "IPv6" ? "::1/128" : "127.0.0.0/8"], jump("RETURN"));
  for (const r of SET_RULES) {
    if (!nonEmpty(r.set)) continue;
    const line = ruleLine(
      r.from,
      r.proto ? ["-p", r.proto] : [],
      setComment(r.set),
      matchSet(r.set, r.match),
      jump(r.to),
    );
    if (r.table === "nat") nat += line;
    else filter += line;
  }
  if (nonEmpty("KUBE-CLUSTER-IP")) {
    const c = setComment("KUBE-CLUSTER-IP");
    if (cfg.masqueradeAll) {
      nat += ruleLine("KUBE-SERVICES", c, matchSet("KUBE-CLUSTER-IP", "dst,dst"), markMasq);
    } else if (cfg.localDetector.isImplemented) {
      nat += ruleLine(
        "KUBE-SERVICES",
        c,
        matchSet("KUBE-CLUSTER-IP", "dst,dst"),
        words(cfg.localDetector.ifNotLocal),
        markMasq,
      );
    } else nat += ruleLine("KUBE-SERVICES", c, matchSet("KUBE-CLUSTER-IP", "src,dst"), markMasq);
  }
  const externalIPRules = (k: SetKey) => {
    const head = [setComment(k), matchSet(k, "dst,dst")];
    nat += ruleLine(
      "KUBE-SERVICES",
      ...head,
      ["-m", "physdev", "!", "--physdev-is-in", "-m", "addrtype", "!", "--src-type", "LOCAL"],
      jump("ACCEPT"),
    );
    nat += ruleLine("KUBE-SERVICES", ...head, ["-m", "addrtype", "--dst-type", "LOCAL"], jump("ACCEPT"));
  };
  if (nonEmpty("KUBE-EXTERNAL-IP")) {
    nat += ruleLine(
      "KUBE-SERVICES",
      setComment("KUBE-EXTERNAL-IP"),
      matchSet("KUBE-EXTERNAL-IP", "dst,dst"),
      markMasq,
    );
    externalIPRules("KUBE-EXTERNAL-IP");
  }
  if (nonEmpty("KUBE-EXTERNAL-IP-LOCAL")) externalIPRules("KUBE-EXTERNAL-IP-LOCAL");
  nat += ruleLine("KUBE-SERVICES", ["-m", "addrtype", "--dst-type", "LOCAL"], jump("KUBE-NODE-PORT"));
  nat += ruleLine("KUBE-LOAD-BALANCER", markMasq);
  filter += ruleLine("KUBE-SOURCE-RANGES-FIREWALL", jump("DROP"));
  filter += outFilter;
  // acceptIPVSTraffic: must stay at the end of KUBE-SERVICES.
  for (const k of ["KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"] as const) {
    if (nonEmpty(k)) nat += ruleLine("KUBE-SERVICES", matchSet(k, "dst,dst"), jump("ACCEPT"));
  }
  const mark = `${cfg.mark}/${cfg.mark}`;
  filter += ruleLine(
    "KUBE-FORWARD",
    comment("kubernetes forwarding rules"),
    ["-m", "mark", "--mark", mark],
    jump("ACCEPT"),
  );
  filter += ruleLine(
    "KUBE-FORWARD",
    comment("kubernetes forwarding conntrack rule"),
    ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"],
    jump("ACCEPT"),
  );
  filter += ruleLine(
    "KUBE-NODE-PORT",
    setComment("KUBE-HEALTH-CHECK-NODE-PORT"),
    matchSet("KUBE-HEALTH-CHECK-NODE-PORT", "dst"),
    jump("ACCEPT"),
  );
  for (
    const k of [
      "KUBE-LOAD-BALANCER",
      "KUBE-CLUSTER-IP",
      "KUBE-EXTERNAL-IP",
      "KUBE-EXTERNAL-IP-LOCAL",
    ] as const
  ) {
    filter += ruleLine("KUBE-IPVS-FILTER", matchSet(k, "dst,dst"), jump("RETURN"));
  }
  filter += ruleLine("KUBE-IPVS-FILTER", matchSet("KUBE-HEALTH-CHECK-NODE-PORT", "dst"), jump("RETURN"));
  filter += ruleLine(
    "KUBE-IPVS-FILTER",
    ["-m", "conntrack", "--ctstate", "NEW"],
    matchSet("KUBE-IPVS-IPS", "dst"),
    jump("REJECT"),
  );
  nat += ruleLine("KUBE-POSTROUTING", ["-m", "mark", "!", "--mark", mark], jump("RETURN"));
  nat += ruleLine("KUBE-POSTROUTING", jump("MARK", "--xor-mark", cfg.mark));
  nat += ruleLine(
    "KUBE-POSTROUTING",
    comment("kubernetes service traffic requiring SNAT"),
    cfg.randomFully ? jump("MASQUERADE", "--random-fully") : jump("MASQUERADE"),
  );
  nat += ruleLine("KUBE-MARK-MASQ", jump("MARK", "--or-mark", cfg.mark));
  return "*nat\n" + NAT_CHAINS.map((c) => chainLine(c)).join("") + nat + jumps.nat + "COMMIT\n" +
    "*filter\n" + FILTER_CHAINS.map((c) => chainLine(c)).join("") + filter + jumps.filter + "COMMIT\n";
}
