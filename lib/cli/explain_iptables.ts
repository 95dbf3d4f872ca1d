/**
 * explain for the iptables mode: the packet through nat KUBE-SERVICES / KUBE-NODEPORTS, the port's
 * KUBE-FW/KUBE-EXT/KUBE-SVC/KUBE-SVL/KUBE-SEP chains (names from chain_names.ts, as rules.ts writes them) and
 * the filter chains that reject or drop (KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-PROXY-FIREWALL), following
 * the decisions of the port's plan exactly as `renderServicePort` does.
 * @module
 */
import { endpointChainName, servicePortChains } from "../dataplane/iptables/chain_names.ts";
import { probability } from "../dataplane/iptables/rules.ts";
import { iptablesLocalMatch } from "../dataplane/iptables_local_detector.ts";
import { masqueradeMark } from "../dataplane/masquerade.ts";
import { cidrContains, isLoopback } from "../net/ip.ts";
import { familyNodeIP, newNodePortAddresses } from "../net/node_addresses.ts";
import type { EndpointInfo, ServicePortState } from "../proxy/types.ts";
import {
  type AccessKind,
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

/** Explains the packet of `ctx` in iptables mode. */
export function explainIptables(ctx: ExplainContext): ModeExplanation {
  const o = ctx.opts;
  const fam = ctx.family;
  const npa = newNodePortAddresses(fam, o.nodePortAddresses, ctx.nodeIPs);
  const localhostNodePorts = o.config.iptables.localhostNodePorts && fam === "IPv4" &&
    npa.containsIPv4Loopback;
  const acceptsNodePort = (dst: string) => {
    const loop = isLoopback(dst);
    if (loop && (fam === "IPv6" || !localhostNodePorts || ctx.from !== "node")) return false;
    if (!loop && !ctx.nodeIPs.includes(dst)) return false;
    return npa.matchAll || npa.cidrs.some((c) => cidrContains(c, dst));
  };
  const steps: Step[] = [];
  const step = (text: string, ...names: string[]) => steps.push({ text, names });
  const notes: string[] = [];
  const nat = ctx.from === "node" ? "nat OUTPUT" : "nat PREROUTING";
  const dstLocal = isNodeAddress(ctx, ctx.dst);
  const filterExternal = ctx.from === "node" && !dstLocal
    ? null
    : dstLocal
    ? "filter INPUT"
    : "filter FORWARD";

  const match = findServicePort(ctx, acceptsNodePort);
  if (match === null) {
    step(`${nat} -> KUBE-SERVICES: ${unmatched(ctx, acceptsNodePort)}`, "KUBE-SERVICES");
    return {
      service: null,
      access: null,
      address: null,
      steps,
      verdict: { kind: "untouched", reason: "no kube-proxy rule matches; the packet is routed as it is" },
      endpoints: [],
      masquerade: null,
      affinity: null,
      notes,
    };
  }
  const { st, access } = match;
  const info = st.info, plan = st.plan, sel = st.selection;
  const name = info.nameString;
  const proto = ctx.proto;
  const ch = servicePortChains(name, proto);
  const base = {
    service: name,
    access,
    address: describeMatch(st, access, ctx.dst, ctx.port),
    affinity: info.stickyMaxAgeSeconds > 0 ? `ClientIP, ${info.stickyMaxAgeSeconds} s` : "none",
  };
  const noEndpoints = (v: "reject" | "drop" | null) =>
    v === "reject" ? "it has no endpoints" : "it has no endpoints on this node (traffic policy Local)";
  const verdictRule = (v: "reject" | "drop" | null) =>
    `"${name} has no ${v === "reject" ? "" : "local "}endpoints" ${v === "reject" ? "REJECTs" : "DROPs"} it`;
  const stop = (kind: "reject" | "drop" | "untouched", reason: string): ModeExplanation => ({
    ...base,
    steps,
    verdict: { kind, reason },
    endpoints: [],
    masquerade: null,
    notes,
  });

  // ClusterIP.
  if (access === "clusterIP") {
    if (!plan.hasInternalEndpoints) {
      const v = plan.internalVerdict;
      step(
        `${nat} -> KUBE-SERVICES: no rule for ${name}'s ClusterIP (${noEndpoints(v)}), so it is not DNATed.`,
      );
      step(
        `${ctx.from === "node" ? "filter OUTPUT" : "filter FORWARD"} -> KUBE-SERVICES (filter table): rule ${
          verdictRule(v)
        }.`,
        "KUBE-SERVICES",
      );
      return stop(v === "reject" ? "reject" : "drop", noEndpoints(v));
    }
    const local = plan.internalUsesLocalChain;
    const chain = local ? ch.svl : ch.svc;
    step(
      `${nat} -> KUBE-SERVICES: rule "${name} cluster IP" (-d ${info.clusterIP} --dport ${info.port}) jumps to ${chain}` +
        (local ? " (internalTrafficPolicy Local: endpoints on this node only)." : "."),
      "KUBE-SERVICES",
      chain,
    );
    const masq = clusterIPMasquerade(ctx, chain, step);
    return finish(
      ctx,
      st,
      base,
      steps,
      notes,
      chain,
      local ? sel.localEndpoints! : sel.clusterEndpoints!,
      masq,
    );
  }

  // External destinations: externalIPs, LoadBalancer IPs, NodePorts.
  const rejectExternal = (v: "reject" | "drop" | null): ModeExplanation => {
    if (filterExternal === null) {
      step(
        `filter OUTPUT: kube-proxy's rules that ${v === "reject" ? "reject" : "drop"} traffic to external ` +
          `destinations are in KUBE-EXTERNAL-SERVICES, which only INPUT and FORWARD jump to, so the packet ` +
          `leaves the node towards ${ctx.dst} unchanged.`,
        "KUBE-EXTERNAL-SERVICES",
      );
      return stop(
        "untouched",
        `${noEndpoints(v)}, but only traffic entering the node is rejected or dropped`,
      );
    }
    step(`${filterExternal} -> KUBE-EXTERNAL-SERVICES: rule ${verdictRule(v)}.`, "KUBE-EXTERNAL-SERVICES");
    return stop(v === "reject" ? "reject" : "drop", noEndpoints(v));
  };
  if (!plan.hasEndpoints) {
    step(`${nat} -> KUBE-SERVICES: no rule for ${name}'s ${label(access)} (it has no endpoints).`);
    if (access === "loadBalancer" && plan.firewalled) {
      notes.push(
        "without endpoints the loadBalancerSourceRanges firewall is not written: every source is rejected",
      );
    }
    return rejectExternal(plan.externalVerdict);
  }
  // Dispatch to the external chain (through the firewall chain for LoadBalancer IPs with source ranges).
  if (access === "externalIP") {
    step(
      `${nat} -> KUBE-SERVICES: rule "${name} external IP" (-d ${ctx.dst} --dport ${info.port}) jumps to ${ch.ext}.`,
      "KUBE-SERVICES",
      ch.ext,
    );
  } else if (access === "loadBalancer") {
    const to = plan.usesFirewallChain ? ch.fw : ch.ext;
    step(
      `${nat} -> KUBE-SERVICES: rule "${name} loadbalancer IP" (-d ${ctx.dst} --dport ${info.port}) jumps to ${to}.`,
      "KUBE-SERVICES",
      to,
    );
    if (plan.usesFirewallChain) {
      const why = sourceAllowed(st, ctx.src, familyNodeIP(fam, o.config.bindAddress, ctx.nodeIPs));
      if (why === null) {
        step(
          `${ch.fw}: the source ${ctx.src} is not in loadBalancerSourceRanges (${
            info.loadBalancerSourceRanges.join(", ")
          }); no rule matches, so the packet leaves the chain without DNAT.`,
          ch.fw,
        );
        step(
          `filter ${
            ctx.from === "node" ? "OUTPUT" : dstLocal ? "INPUT" : "FORWARD"
          } -> KUBE-PROXY-FIREWALL: rule ` +
            `"${name} traffic not accepted by ${ch.fw}" DROPs it.`,
          "KUBE-PROXY-FIREWALL",
        );
        return stop("drop", `the source ${ctx.src} is not in the Service's loadBalancerSourceRanges`);
      }
      step(`${ch.fw}: the source is allowed (${why}): jumps to ${ch.ext}.`, ch.fw, ch.ext);
    }
  } else {
    const tail = npa.matchAll ? "the destination is a local address" : `-d ${ctx.dst}`;
    step(
      `${nat} -> KUBE-SERVICES: its last rule (${tail}) jumps to KUBE-NODEPORTS; there rule "${name}" ` +
        `(--dport ${info.nodePort}) jumps to ${ch.ext}` +
        (isLoopback(ctx.dst) ? " (localhost NodePort: net.ipv4.conf.all.route_localnet is 1)." : "."),
      "KUBE-SERVICES",
      "KUBE-NODEPORTS",
      ch.ext,
    );
  }
  // The external chain: masquerade, and which endpoints.
  if (!plan.externalPolicyLocal) {
    step(
      `${ch.ext}: "masquerade traffic for ${name} external destinations" jumps to KUBE-MARK-MASQ, then to ${ch.svc}.`,
      ch.ext,
      "KUBE-MARK-MASQ",
      ch.svc,
    );
    return finish(ctx, st, base, steps, notes, ch.svc, sel.clusterEndpoints!, {
      masqueraded: true,
      reason:
        "externalTrafficPolicy Cluster: external traffic is masqueraded, so that replies come back here",
    });
  }
  const detector = iptablesLocalMatch(ctx.localTraffic);
  if (detector.isImplemented && ctx.isLocalTraffic) {
    step(
      `${ch.ext}: "pod traffic for ${name} external destinations" (${detector.ifLocal}) matches (${ctx.localWhy}): ` +
        `jumps to ${ch.svc}, every endpoint of the Service, not only this node's.`,
      ch.ext,
      ch.svc,
    );
    return finish(ctx, st, base, steps, notes, ch.svc, sel.clusterEndpoints!, {
      masqueraded: false,
      reason: "a pod's traffic to the Service's external address is short-circuited with its own source",
    });
  }
  if (ctx.from === "node") {
    step(
      `${ch.ext}: the source is a local address (-m addrtype --src-type LOCAL): "masquerade LOCAL traffic" jumps to ` +
        `KUBE-MARK-MASQ, then "route LOCAL traffic" to ${ch.svc}, every endpoint of the Service.`,
      ch.ext,
      "KUBE-MARK-MASQ",
      ch.svc,
    );
    return finish(ctx, st, base, steps, notes, ch.svc, sel.clusterEndpoints!, {
      masqueraded: true,
      reason: "traffic from the node itself to an externalTrafficPolicy Local address is masqueraded",
    });
  }
  if (!plan.hasExternalEndpoints) {
    step(
      `${ch.ext}: externalTrafficPolicy Local and no endpoint on this node: no rule sends the packet on, ` +
        "so it is not DNATed.",
      ch.ext,
    );
    return rejectExternal(plan.externalVerdict);
  }
  step(
    `${ch.ext}: externalTrafficPolicy Local: jumps to ${ch.svl}, this node's endpoints only.`,
    ch.ext,
    ch.svl,
  );
  return finish(ctx, st, base, steps, notes, ch.svl, sel.localEndpoints!, {
    masqueraded: false,
    reason: "externalTrafficPolicy Local keeps the client's source IP",
  });
}

function label(access: AccessKind): string {
  return access === "externalIP" ? "externalIP" : access === "loadBalancer" ? "LoadBalancer IP" : "NodePort";
}

/** The masquerade rule at the top of the ClusterIP's policy chain. */
function clusterIPMasquerade(
  ctx: ExplainContext,
  chain: string,
  step: (text: string, ...names: string[]) => void,
): { masqueraded: boolean; reason: string } {
  if (ctx.opts.masqueradeAll) {
    step(`${chain}: masqueradeAll is on: its first rule jumps to KUBE-MARK-MASQ.`, chain, "KUBE-MARK-MASQ");
    return { masqueraded: true, reason: "masqueradeAll is on" };
  }
  const detector = iptablesLocalMatch(ctx.localTraffic);
  if (!detector.isImplemented) {
    return {
      masqueraded: false,
      reason: `${ctx.localWhy}, so ClusterIP traffic is not masqueraded (only hairpin traffic is)`,
    };
  }
  if (ctx.isLocalTraffic) {
    step(`${chain}: its masquerade rule (${detector.ifNotLocal}) does not match: ${ctx.localWhy}.`, chain);
    return { masqueraded: false, reason: `local traffic keeps its source (${ctx.localWhy})` };
  }
  step(
    `${chain}: its masquerade rule (${detector.ifNotLocal}) matches (${ctx.localWhy}): jumps to KUBE-MARK-MASQ.`,
    chain,
    "KUBE-MARK-MASQ",
  );
  return {
    masqueraded: true,
    reason: `traffic from outside the pod network is masqueraded (${ctx.localWhy})`,
  };
}

/** Load balancing in `chain`, the endpoint chains and POSTROUTING. */
function finish(
  ctx: ExplainContext,
  st: ServicePortState,
  base: Pick<ModeExplanation, "service" | "access" | "address" | "affinity">,
  steps: Step[],
  notes: string[],
  chain: string,
  eps: readonly EndpointInfo[],
  masq: { masqueraded: boolean; reason: string },
): ModeExplanation {
  const info = st.info;
  const proto = ctx.proto;
  const seps = eps.map((e) => endpointChainName(info.nameString, proto, e.endpoint));
  const n = eps.length;
  if (info.stickyMaxAgeSeconds > 0) {
    const t = info.stickyMaxAgeSeconds;
    steps.push({
      text:
        `${chain}: ClientIP affinity: a source that used an endpoint in the last ${t} s goes back to it ` +
        `(one "-m recent --name KUBE-SEP-... --rcheck --seconds ${t} --reap" rule per endpoint); a new source ` +
        "goes on to the random choice.",
      names: [chain],
    });
  }
  if (n === 1) {
    steps.push({ text: `${chain} jumps to ${seps[0]}, its only endpoint.`, names: [chain, seps[0]] });
  } else {
    const probs = eps.slice(0, -1).map((_, i) => probability(n - i)).join(", ");
    steps.push({
      text: `${chain} picks one of ${n} endpoints at random: its statistic rules try them in order with ` +
        `--probability ${probs} and the last one unconditionally, so each gets 1/${n}.`,
      names: [chain, ...seps],
    });
  }
  steps.push({
    text:
      `${
        n === 1 ? seps[0] : "The chosen KUBE-SEP chain"
      } DNATs to the endpoint (--to-destination ip:port); ` +
      "its first rule (-s <endpoint IP> -j KUBE-MARK-MASQ) marks a pod reaching itself.",
    names: seps,
  });
  const hairpin = eps.some((e) => e.ip === ctx.src);
  if (masq.masqueraded || hairpin) {
    steps.push({
      text:
        `nat POSTROUTING -> KUBE-POSTROUTING: a packet carrying the mark ${
          masqueradeMark(ctx.opts.masqueradeBit)
        } ` +
        "(set by KUBE-MARK-MASQ) is masqueraded: the endpoint sees the node's address as the source." +
        (masq.masqueraded ? "" : " (Here only if the chosen endpoint is the source itself.)"),
      names: ["KUBE-POSTROUTING", "KUBE-MARK-MASQ"],
    });
  }
  notes.push(...selectionNotes(st, eps));
  const endpoints: EndpointChoice[] = eps.map((e, i) => ({
    endpoint: e.endpoint,
    ip: e.ip,
    nodeName: e.nodeName,
    local: e.isLocal,
    probability: uniform(n),
    via: seps[i],
    hairpin: e.ip === ctx.src,
  }));
  return {
    ...base,
    steps,
    verdict: { kind: "dnat", reason: n === 1 ? `to ${eps[0].endpoint}` : `to one of ${n} endpoints` },
    endpoints,
    masquerade: masq,
    notes,
  };
}

/** Why no rule matched: the nearest thing the packet could have meant. */
function unmatched(ctx: ExplainContext, acceptsNodePort: (dst: string) => boolean): string {
  for (const st of ctx.snapshot.servicePorts.values()) {
    const i = st.info;
    const addresses = [i.clusterIP, ...i.externalIPs, ...i.loadBalancerVIPs];
    if (addresses.includes(ctx.dst)) {
      return `no rule matches: ${ctx.dst} is an address of ${i.serviceKey}, but not for ${ctx.protocol} port ` +
        `${ctx.port} (iptables mode leaves other ports of a Service address alone).`;
    }
    if (i.nodePort === ctx.port && i.protocol === ctx.protocol && isNodeAddress(ctx, ctx.dst)) {
      return acceptsNodePort(ctx.dst)
        ? "no rule matches."
        : `no rule matches: ${ctx.dst} does not accept NodePorts (nodePortAddresses: ${
          ctx.opts.nodePortAddresses.join(",") || "all local addresses"
        }${
          isLoopback(ctx.dst)
            ? "; localhost NodePorts need IPv4, --iptables-localhost-nodeports and a packet from the node"
            : ""
        }).`;
    }
  }
  return `no rule matches: ${ctx.dst} is not an address of any Service this node knows.`;
}
