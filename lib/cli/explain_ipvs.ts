/**
 * explain for the ipvs mode: the iptables rules that match the mode's ipsets (masquerade marks, the
 * loadBalancerSourceRanges firewall, KUBE-IPVS-FILTER), then the IPVS virtual server on the address bound to
 * kube-ipvs0 with its scheduler, persistence and real servers, as render.ts (renderPort) and iptables_rules.ts
 * write them, with their set names and virtual server keys.
 * @module
 */
import { DUMMY_INTERFACE } from "../dataplane/ipvs/addresses.ts";
import { ipPortEntry, type SetKey, setName } from "../dataplane/ipvs/ipsets.ts";
import { serviceKey } from "../dataplane/ipvs/ipvsadm.ts";
import { iptablesLocalMatch } from "../dataplane/iptables_local_detector.ts";
import { masqueradeMark } from "../dataplane/masquerade.ts";
import { cidrContains, isLoopback } from "../net/ip.ts";
import { familyNodeIP, newNodePortAddresses } from "../net/node_addresses.ts";
import type { EndpointInfo } from "../proxy/types.ts";
import {
  describeMatch,
  type EndpointChoice,
  type ExplainContext,
  findServicePort,
  isNodeAddress,
  type ModeExplanation,
  selectionNotes,
  sourceAllowed,
  type Step,
  uniform,
} from "./explain_common.ts";

/** Explains the packet of `ctx` in ipvs mode. */
export function explainIpvs(ctx: ExplainContext): ModeExplanation {
  const o = ctx.opts;
  const fam = ctx.family;
  const set = (k: SetKey) => setName(k, fam);
  const npa = newNodePortAddresses(fam, o.nodePortAddresses, ctx.nodeIPs);
  const nodePortIPs = ctx.nodeIPs.filter((ip) =>
    !isLoopback(ip) && npa.cidrs.some((c) => cidrContains(c, ip))
  );
  const acceptsNodePort = (dst: string) => nodePortIPs.includes(dst);
  const steps: Step[] = [];
  const step = (text: string, ...names: string[]) => steps.push({ text, names });
  const notes: string[] = [];
  const nat = ctx.from === "node" ? "nat OUTPUT" : "nat PREROUTING";
  const scheduler = o.config.ipvs.scheduler || "rr";

  const match = findServicePort(ctx, acceptsNodePort);
  if (match === null) {
    const bound = [...ctx.snapshot.servicePorts.values()].some((s) =>
      s.info.clusterIP === ctx.dst ||
      ((s.info.externalIPs.includes(ctx.dst) || s.info.loadBalancerVIPs.includes(ctx.dst)) &&
        !isNodeAddress(ctx, ctx.dst))
    );
    const none = {
      service: null,
      access: null,
      address: null,
      endpoints: [],
      masquerade: null,
      affinity: null,
    };
    if (bound) {
      step(
        `${ctx.dst} is bound on ${DUMMY_INTERFACE}, so the packet is delivered locally; filter INPUT -> ` +
          `KUBE-IPVS-FILTER: no set holds ${ctx.dst},${ctx.proto}:${ctx.port}, and its last rule rejects new ` +
          `connections to addresses in ${set("KUBE-IPVS-IPS")}.`,
        DUMMY_INTERFACE,
        "KUBE-IPVS-FILTER",
        set("KUBE-IPVS-IPS"),
      );
      return {
        ...none,
        steps,
        verdict: { kind: "reject", reason: "no such port on this Service address" },
        notes,
      };
    }
    step(
      `${nat} -> KUBE-SERVICES: nothing matches: ${ctx.dst}:${ctx.port} is not a Service address this node knows` +
        (ctx.nodeIPs.includes(ctx.dst) && !acceptsNodePort(ctx.dst)
          ? ` as a NodePort address (nodePortAddresses: ${o.nodePortAddresses.join(",")})`
          : "") +
        ".",
      "KUBE-SERVICES",
    );
    return { ...none, steps, verdict: { kind: "untouched", reason: "no kube-proxy rule matches" }, notes };
  }

  const { st, access } = match;
  const info = st.info, plan = st.plan, sel = st.selection;
  const proto = ctx.proto;
  const base = {
    service: info.nameString,
    access,
    address: describeMatch(st, access, ctx.dst, ctx.port),
    affinity: info.stickyMaxAgeSeconds > 0
      ? `ClientIP, ${info.stickyMaxAgeSeconds} s (IPVS persistence)`
      : "none",
  };
  const entry = ipPortEntry(ctx.dst, proto, ctx.port);

  // nat: the masquerade mark, by set.
  let masq: { masqueraded: boolean; reason: string };
  if (ctx.from === "node" && isLoopback(ctx.src)) {
    step(`${nat} -> KUBE-SERVICES: its first rule returns for loopback sources.`, "KUBE-SERVICES");
    masq = { masqueraded: false, reason: "loopback sources are left alone" };
  } else if (access === "clusterIP") {
    const m = `-m set --match-set ${set("KUBE-CLUSTER-IP")}`;
    const detector = iptablesLocalMatch(ctx.localTraffic);
    if (o.masqueradeAll) {
      step(
        `${nat} -> KUBE-SERVICES: "${m} dst,dst -j KUBE-MARK-MASQ" (masqueradeAll) matches ${entry}.`,
        "KUBE-SERVICES",
        set("KUBE-CLUSTER-IP"),
        "KUBE-MARK-MASQ",
      );
      masq = { masqueraded: true, reason: "masqueradeAll is on" };
    } else if (!detector.isImplemented) {
      step(
        `${nat} -> KUBE-SERVICES: "${m} src,dst -j KUBE-MARK-MASQ" (no local-traffic detection) does not match ` +
          "an ordinary client.",
        "KUBE-SERVICES",
        set("KUBE-CLUSTER-IP"),
      );
      masq = { masqueraded: false, reason: `${ctx.localWhy}, so ClusterIP traffic is not masqueraded` };
    } else if (ctx.isLocalTraffic) {
      step(
        `${nat} -> KUBE-SERVICES: "${m} dst,dst ${detector.ifNotLocal} -j KUBE-MARK-MASQ" does not match: ` +
          `${ctx.localWhy}.`,
        "KUBE-SERVICES",
        set("KUBE-CLUSTER-IP"),
      );
      masq = { masqueraded: false, reason: `local traffic keeps its source (${ctx.localWhy})` };
    } else {
      step(
        `${nat} -> KUBE-SERVICES: "${m} dst,dst ${detector.ifNotLocal} -j KUBE-MARK-MASQ" matches ` +
          `${entry} (${ctx.localWhy}).`,
        "KUBE-SERVICES",
        set("KUBE-CLUSTER-IP"),
        "KUBE-MARK-MASQ",
      );
      masq = {
        masqueraded: true,
        reason: `traffic from outside the pod network is masqueraded (${ctx.localWhy})`,
      };
    }
  } else if (access === "externalIP") {
    if (plan.externalPolicyLocal) {
      step(
        `${nat} -> KUBE-SERVICES: ${entry} is in ${
          set("KUBE-EXTERNAL-IP-LOCAL")
        } (externalTrafficPolicy Local): ` +
          "accepted without a masquerade mark.",
        "KUBE-SERVICES",
        set("KUBE-EXTERNAL-IP-LOCAL"),
      );
      masq = { masqueraded: false, reason: "externalTrafficPolicy Local keeps the client's source IP" };
    } else {
      step(
        `${nat} -> KUBE-SERVICES: ${entry} is in ${
          set("KUBE-EXTERNAL-IP")
        }: jumps to KUBE-MARK-MASQ, then ACCEPT.`,
        "KUBE-SERVICES",
        set("KUBE-EXTERNAL-IP"),
        "KUBE-MARK-MASQ",
      );
      masq = { masqueraded: true, reason: "externalTrafficPolicy Cluster: external traffic is masqueraded" };
    }
  } else if (access === "loadBalancer") {
    if (plan.externalPolicyLocal) {
      step(
        `${nat} -> KUBE-SERVICES -> KUBE-LOAD-BALANCER (${set("KUBE-LOAD-BALANCER")}): ${entry} is in ` +
          `${
            set("KUBE-LOAD-BALANCER-LOCAL")
          } (externalTrafficPolicy Local): returns without a masquerade mark.`,
        "KUBE-SERVICES",
        "KUBE-LOAD-BALANCER",
        set("KUBE-LOAD-BALANCER"),
        set("KUBE-LOAD-BALANCER-LOCAL"),
      );
      masq = { masqueraded: false, reason: "externalTrafficPolicy Local keeps the client's source IP" };
    } else {
      step(
        `${nat} -> KUBE-SERVICES -> KUBE-LOAD-BALANCER (${
          set("KUBE-LOAD-BALANCER")
        } holds ${entry}): its last ` +
          "rule jumps to KUBE-MARK-MASQ.",
        "KUBE-SERVICES",
        "KUBE-LOAD-BALANCER",
        set("KUBE-LOAD-BALANCER"),
        "KUBE-MARK-MASQ",
      );
      masq = { masqueraded: true, reason: "externalTrafficPolicy Cluster: external traffic is masqueraded" };
    }
  } else {
    const [all, local] = info.protocol === "TCP"
      ? ["KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP"] as const
      : info.protocol === "UDP"
      ? ["KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP"] as const
      : ["KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"] as const;
    const member = info.protocol === "SCTP" ? entry : String(info.nodePort);
    if (plan.externalPolicyLocal) {
      step(
        `${nat} -> KUBE-SERVICES -> KUBE-NODE-PORT (the destination is a local address): ${member} is in ` +
          `${set(local)} (externalTrafficPolicy Local): returns without a masquerade mark.`,
        "KUBE-SERVICES",
        "KUBE-NODE-PORT",
        set(local),
      );
      masq = { masqueraded: false, reason: "externalTrafficPolicy Local keeps the client's source IP" };
    } else {
      step(
        `${nat} -> KUBE-SERVICES -> KUBE-NODE-PORT (the destination is a local address): ${member} is in ` +
          `${set(all)}: jumps to KUBE-MARK-MASQ.`,
        "KUBE-SERVICES",
        "KUBE-NODE-PORT",
        set(all),
        "KUBE-MARK-MASQ",
      );
      masq = { masqueraded: true, reason: "externalTrafficPolicy Cluster: external traffic is masqueraded" };
    }
  }

  // Local delivery (or, for the node's own connections, IPVS on the way out), the source-range firewall.
  const bound = access !== "nodePort" && !isNodeAddress(ctx, ctx.dst);
  const fromNode = ctx.from === "node";
  const where = bound ? `${ctx.dst} is bound on ${DUMMY_INTERFACE}` : `${ctx.dst} is an address of the node`;
  const delivered = fromNode
    ? `${where}: IPVS takes the node's own connection on its way out (LOCAL_OUT)`
    : `${where}, so the packet is delivered locally and IPVS takes it on input`;
  const dropped = (reason: string): ModeExplanation => ({
    ...base,
    steps,
    verdict: { kind: "drop", reason },
    endpoints: [],
    masquerade: null,
    notes,
  });
  if (fromNode && bound) {
    notes.push(
      `a connection from the node to an address on ${DUMMY_INTERFACE} gets that address as its source unless the ` +
        "program picks one",
    );
  }
  if (access === "loadBalancer" && info.loadBalancerSourceRanges.length > 0 && fromNode) {
    // The node's connections never reach INPUT; KUBE-IPVS-OUT-FILTER drops those from the VIP itself when the
    // node IP is not in the source ranges (render.ts writes the rule exactly then).
    const nodeIP = familyNodeIP(fam, o.config.bindAddress, ctx.nodeIPs);
    const allowed = nodeIP !== null && info.loadBalancerSourceRanges.some((c) => cidrContains(c, nodeIP));
    step(`${delivered}.`, ...(bound ? [DUMMY_INTERFACE] : []));
    if (!allowed) {
      step(
        `filter OUTPUT -> KUBE-IPVS-OUT-FILTER: "-s ${ctx.dst} -m ipvs --vaddr ${ctx.dst} --vproto ${proto} ` +
          `--vport ${ctx.port} -j DROP" drops the node's own connections (from the VIP) to it: the node IP ` +
          `${nodeIP ?? "(unknown)"} is not in loadBalancerSourceRanges.`,
        "KUBE-IPVS-OUT-FILTER",
      );
      return dropped(`the node IP is not in the Service's loadBalancerSourceRanges`);
    }
    step(
      `the node IP ${nodeIP} is in loadBalancerSourceRanges: ${ctx.dst},${proto}:${ctx.port},${ctx.dst} is in ` +
        `${set("KUBE-LOAD-BALANCER-SOURCE-IP")} and KUBE-IPVS-OUT-FILTER has no rule for it.`,
      set("KUBE-LOAD-BALANCER-SOURCE-IP"),
    );
  } else if (access === "loadBalancer" && info.loadBalancerSourceRanges.length > 0) {
    const why = sourceAllowed(st, ctx.src, familyNodeIP(fam, o.config.bindAddress, ctx.nodeIPs));
    step(
      `${delivered}; filter INPUT -> KUBE-PROXY-FIREWALL: ${entry} is in ${
        set("KUBE-LOAD-BALANCER-FW")
      }, so it ` +
        `goes to KUBE-SOURCE-RANGES-FIREWALL, which ${
          why === null
            ? `DROPs it: the source ${ctx.src} matches neither ${set("KUBE-LOAD-BALANCER-SOURCE-CIDR")} nor ${
              set("KUBE-LOAD-BALANCER-SOURCE-IP")
            }.`
            : `returns: the source is allowed (${why}).`
        }`,
      ...(bound ? [DUMMY_INTERFACE] : []),
      "KUBE-PROXY-FIREWALL",
      set("KUBE-LOAD-BALANCER-FW"),
      "KUBE-SOURCE-RANGES-FIREWALL",
      ...(why === null ? [set("KUBE-LOAD-BALANCER-SOURCE-CIDR"), set("KUBE-LOAD-BALANCER-SOURCE-IP")] : []),
    );
    if (why === null) {
      return dropped(`the source ${ctx.src} is not in the Service's loadBalancerSourceRanges`);
    }
  } else {
    step(`${delivered}.`, ...(bound ? [DUMMY_INTERFACE] : []));
  }

  // IPVS: the virtual server and its real servers (upstream's Local-policy fallback to every endpoint).
  const vs = serviceKey(info.protocol, ctx.dst, ctx.port);
  const onlyLocal = access === "clusterIP" ? info.internalPolicyLocal : plan.externalPolicyLocal;
  const cluster = sel.clusterEndpoints ?? [];
  const localEps = sel.localEndpoints ?? [];
  const eps: readonly EndpointInfo[] = onlyLocal ? (localEps.length > 0 ? localEps : cluster) : cluster;
  if (onlyLocal && localEps.length === 0 && cluster.length > 0) {
    notes.push(
      `no endpoint on this node: as upstream's ipvs mode (kubernetes#97081), the ${
        access === "clusterIP" ? "internal" : "external"
      } Local policy falls back to every endpoint` +
        (masq.masqueraded
          ? ""
          : "; traffic that is not masqueraded may not find its way back from another node"),
    );
  }
  const persistence = info.stickyMaxAgeSeconds > 0 ? ` -p ${info.stickyMaxAgeSeconds}` : "";
  if (eps.length === 0) {
    step(
      `IPVS virtual server "${vs} -s ${scheduler}${persistence}" has no real servers: IPVS answers with ICMP port ` +
        "unreachable, so the connection is refused.",
      vs,
    );
    return {
      ...base,
      steps,
      verdict: {
        kind: "reject",
        reason: plan.hasEndpoints
          ? "it has no endpoints on this node (traffic policy Local), so its virtual server has no real servers"
          : "it has no endpoints",
      },
      endpoints: [],
      masquerade: null,
      notes,
    };
  }
  const rr = scheduler === "rr";
  step(
    `IPVS virtual server "${vs} -s ${scheduler}${persistence}" forwards to one of ${eps.length} real server(s) ` +
      `(masquerading forward, weight 1 each)` +
      (rr
        ? `: round robin, each in turn (1/${eps.length} of new connections)`
        : `, chosen by the ${scheduler} scheduler`) +
      (info.stickyMaxAgeSeconds > 0
        ? `; a client keeps its real server while its persistence template lives (${info.stickyMaxAgeSeconds} s)`
        : "") +
      ".",
    vs,
  );
  const hairpin = eps.some((e) => e.ip === ctx.src);
  if (masq.masqueraded || hairpin) {
    step(
      `nat POSTROUTING -> KUBE-POSTROUTING: ` +
        (masq.masqueraded
          ? `the packet carries the mark ${masqueradeMark(o.masqueradeBit)} and is masqueraded`
          : `only a pod reaching itself (${set("KUBE-LOOP-BACK")}) is masqueraded`) +
        ".",
      "KUBE-POSTROUTING",
      ...(masq.masqueraded ? ["KUBE-MARK-MASQ"] : [set("KUBE-LOOP-BACK")]),
    );
  }
  notes.push(...selectionNotes(st, eps));
  const endpoints: EndpointChoice[] = eps.map((e) => ({
    endpoint: e.endpoint,
    ip: e.ip,
    nodeName: e.nodeName,
    local: e.isLocal,
    probability: rr ? uniform(eps.length) : null,
    via: `real server ${e.endpoint}`,
    hairpin: e.ip === ctx.src,
  }));
  return {
    ...base,
    steps,
    verdict: {
      kind: "dnat",
      reason: eps.length === 1 ? `to ${eps[0].endpoint}` : `to one of ${eps.length} endpoints`,
    },
    endpoints,
    masquerade: masq,
    notes,
  };
}
