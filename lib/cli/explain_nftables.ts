/**
 * explain for the nftables mode (upstream v1.37's layout): the packet through the `kube-proxy` table's base
 * chains, the shared maps and sets (firewall-ips, service-ips, service-nodeports, no-endpoint-services,
 * no-endpoint-nodeports, cluster-ips, hairpin-connections) and the port's firewall-/external-/service-/local-
 * chains (endpoint- chains only with ClientIP affinity), with the names of names.ts and the decisions of the
 * port's plan, as rules.ts renders them.
 * @module
 */
import { masqueradeMark } from "../dataplane/masquerade.ts";
import {
  CHAIN,
  endpointNames,
  localhostNodePortRejectChain,
  localhostNodePortRejectedCounter,
  servicePortChainNames,
  SET,
} from "../dataplane/nftables/names.ts";
import { ifNotLocal, localhostNodePortHandling, nftFamily } from "../dataplane/nftables/rules.ts";
import type { LocalTraffic } from "../dataplane/local_traffic.ts";
import { cidrContains, isLoopback } from "../net/ip.ts";
import { familyNodeIP, newNodePortAddresses } from "../net/node_addresses.ts";
import type { EndpointInfo, ServicePortState } from "../proxy/types.ts";
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

function localMatch(lt: LocalTraffic, ipX: string): string | null {
  switch (lt.kind) {
    case "none":
      return null;
    case "cidr":
      return `${ipX} saddr ${lt.cidr}`;
    case "interface":
      return `iifname ${lt.name}`;
    case "interfacePrefix":
      return `iifname ${lt.prefix}*`;
  }
}

/** Explains the packet of `ctx` in nftables mode. */
export function explainNftables(ctx: ExplainContext): ModeExplanation {
  const o = ctx.opts;
  const fam = ctx.family;
  const ipX = nftFamily(fam);
  const npa = newNodePortAddresses(fam, o.nodePortAddresses, ctx.nodeIPs);
  const acceptsNodePort = (dst: string) =>
    !isLoopback(dst) && ctx.nodeIPs.includes(dst) &&
    (npa.matchAll || npa.cidrs.some((c) => cidrContains(c, dst)));
  const steps: Step[] = [];
  const step = (text: string, ...names: string[]) => steps.push({ text, names });
  const notes: string[] = [];
  const fromNode = ctx.from === "node";
  const dstLocal = isNodeAddress(ctx, ctx.dst);
  const preDnat = fromNode ? CHAIN.filterOutputPreDNAT : CHAIN.filterPreroutingPreDNAT;
  const natHook = fromNode ? CHAIN.natOutput : CHAIN.natPrerouting;
  const filterHook = fromNode ? CHAIN.filterOutput : dstLocal ? CHAIN.filterInput : CHAIN.filterForward;
  const key = `${ctx.dst} . ${ctx.proto} . ${ctx.port}`;

  const match = findServicePort(ctx, acceptsNodePort);
  if (match === null) return unmatched(ctx, steps, filterHook, acceptsNodePort);
  const { st, access } = match;
  const info = st.info, plan = st.plan, sel = st.selection;
  const n = servicePortChainNames(info.name, ctx.proto);
  const mark = `mark set mark or ${masqueradeMark(o.masqueradeBit)}`;
  const base = {
    service: info.nameString,
    access,
    address: describeMatch(st, access, ctx.dst, ctx.port),
    affinity: info.stickyMaxAgeSeconds > 0 ? `ClientIP, ${info.stickyMaxAgeSeconds} s` : "none",
  };
  const stop = (kind: "reject" | "drop", reason: string): ModeExplanation => ({
    ...base,
    steps,
    verdict: { kind, reason },
    endpoints: [],
    masquerade: null,
    notes,
  });
  const noEndpoints = (v: "reject" | "drop" | null) =>
    v === "reject" ? "it has no endpoints" : "it has no endpoints on this node (traffic policy Local)";
  const verdictText = (v: "reject" | "drop" | null) =>
    v === "reject" ? `goto ${CHAIN.reject}, which rejects it` : "drop";
  const endpointsCheck = (v: "reject" | "drop" | null): ModeExplanation => {
    if (access === "nodePort") {
      step(
        `${CHAIN.filterInput} -> ${CHAIN.nodePortEndpointsCheck}: @${SET.noEndpointNodePorts} maps ` +
          `${ctx.proto} . ${info.nodePort} to ${verdictText(v)}.`,
        CHAIN.nodePortEndpointsCheck,
        SET.noEndpointNodePorts,
        ...(v === "reject" ? [CHAIN.reject] : []),
      );
    } else {
      step(
        `${filterHook} -> ${CHAIN.serviceEndpointsCheck}: @${SET.noEndpointServices} maps ${key} to ${
          verdictText(v)
        }.`,
        CHAIN.serviceEndpointsCheck,
        SET.noEndpointServices,
        ...(v === "reject" ? [CHAIN.reject] : []),
      );
    }
    return stop(v === "reject" ? "reject" : "drop", noEndpoints(v));
  };

  // loadBalancerSourceRanges: before DNAT, whether or not there are endpoints.
  if (access === "loadBalancer" && plan.firewalled) {
    const nodeIP = familyNodeIP(fam, o.config.bindAddress, ctx.nodeIPs);
    const sources = [...info.loadBalancerSourceRanges];
    if (nodeIP !== null && info.loadBalancerSourceRanges.some((c) => cidrContains(c, nodeIP))) {
      sources.push(...info.loadBalancerVIPs);
    }
    step(
      `${preDnat} -> ${CHAIN.firewallCheck}: @${SET.firewallIPs} maps ${key} to goto ${n.firewall}.`,
      CHAIN.firewallCheck,
      SET.firewallIPs,
      n.firewall,
    );
    const why = sourceAllowed(st, ctx.src, nodeIP);
    if (why === null) {
      step(
        `${n.firewall}: "${ipX} saddr != { ${
          sources.join(" , ")
        } } drop" drops it: the source ${ctx.src} is not ` +
          "in the Service's loadBalancerSourceRanges.",
        n.firewall,
      );
      return stop("drop", `the source ${ctx.src} is not in the Service's loadBalancerSourceRanges`);
    }
    step(`${n.firewall}: the source is allowed (${why}), so its drop rule does not match.`, n.firewall);
  }

  // ClusterIP.
  if (access === "clusterIP") {
    if (!plan.hasInternalEndpoints) {
      step(
        `${natHook} -> ${CHAIN.services}: @${SET.serviceIPs} has no element for ${key} (${
          noEndpoints(plan.internalVerdict)
        }), so it is not DNATed.`,
        CHAIN.services,
        SET.serviceIPs,
      );
      return endpointsCheck(plan.internalVerdict);
    }
    const local = plan.internalUsesLocalChain;
    const chain = local ? n.local : n.cluster;
    let masq: { masqueraded: boolean; reason: string };
    const notLocal = ifNotLocal(ctx.localTraffic, ipX);
    if (o.masqueradeAll) {
      step(
        `${natHook} -> ${CHAIN.services}: masqueradeAll is on: "${ipX} daddr @${SET.clusterIPs} ${mark}".`,
        CHAIN.services,
        SET.clusterIPs,
      );
      masq = { masqueraded: true, reason: "masqueradeAll is on" };
    } else if (notLocal === null) {
      masq = { masqueraded: false, reason: `${ctx.localWhy}, so ClusterIP traffic is not masqueraded` };
    } else if (ctx.isLocalTraffic) {
      step(
        `${natHook} -> ${CHAIN.services}: "${ipX} daddr @${SET.clusterIPs} ${notLocal} ${mark}" does not ` +
          `match: ${ctx.localWhy}.`,
        CHAIN.services,
        SET.clusterIPs,
      );
      masq = { masqueraded: false, reason: `local traffic keeps its source (${ctx.localWhy})` };
    } else {
      step(
        `${natHook} -> ${CHAIN.services}: "${ipX} daddr @${SET.clusterIPs} ${notLocal} ${mark}" matches ` +
          `(${ctx.localWhy}).`,
        CHAIN.services,
        SET.clusterIPs,
      );
      masq = {
        masqueraded: true,
        reason: `traffic from outside the pod network is masqueraded (${ctx.localWhy})`,
      };
    }
    step(
      `${CHAIN.services}: @${SET.serviceIPs} maps ${key} to goto ${chain}` +
        (local ? " (internalTrafficPolicy Local: endpoints on this node only)." : "."),
      CHAIN.services,
      SET.serviceIPs,
      chain,
    );
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

  // External destinations.
  if (!plan.hasEndpoints) {
    step(
      access === "nodePort"
        ? `${natHook} -> ${CHAIN.services}: @${SET.serviceNodePorts} has no element for ${ctx.proto} . ${info.nodePort} (it has no endpoints).`
        : `${natHook} -> ${CHAIN.services}: @${SET.serviceIPs} has no element for ${key} (it has no endpoints).`,
      CHAIN.services,
      access === "nodePort" ? SET.serviceNodePorts : SET.serviceIPs,
    );
    return endpointsCheck(plan.externalVerdict);
  }
  if (access === "nodePort") {
    const how = npa.matchAll
      ? `"fib daddr type local ${fam === "IPv6" ? "ip6 daddr != ::1" : "ip daddr != 127.0.0.0/8"}"`
      : `"${ipX} daddr @${SET.nodePortIPs}"`;
    step(
      `${natHook} -> ${CHAIN.services}: ${how} and @${SET.serviceNodePorts} maps ${ctx.proto} . ${info.nodePort} ` +
        `to goto ${n.external}.`,
      CHAIN.services,
      SET.serviceNodePorts,
      n.external,
      ...(npa.matchAll ? [] : [SET.nodePortIPs]),
    );
  } else {
    step(
      `${natHook} -> ${CHAIN.services}: @${SET.serviceIPs} maps ${key} to goto ${n.external}.`,
      CHAIN.services,
      SET.serviceIPs,
      n.external,
    );
  }
  if (!plan.externalPolicyLocal) {
    step(`${n.external}: "${mark}" (masquerade), then "goto ${n.cluster}".`, n.external, n.cluster);
    return finish(ctx, st, base, steps, notes, n.cluster, sel.clusterEndpoints!, {
      masqueraded: true,
      reason:
        "externalTrafficPolicy Cluster: external traffic is masqueraded, so that replies come back here",
    });
  }
  const local = localMatch(ctx.localTraffic, ipX);
  if (local !== null && ctx.isLocalTraffic) {
    step(
      `${n.external}: "${local} goto ${n.cluster}" (short-circuit pod traffic) matches (${ctx.localWhy}): every ` +
        "endpoint of the Service, not only this node's.",
      n.external,
      n.cluster,
    );
    return finish(ctx, st, base, steps, notes, n.cluster, sel.clusterEndpoints!, {
      masqueraded: false,
      reason: "a pod's traffic to the Service's external address is short-circuited with its own source",
    });
  }
  if (ctx.from === "node") {
    step(
      `${n.external}: "fib saddr type local ${mark}" (masquerade local traffic) and "fib saddr type ` +
        `local goto ${n.cluster}" (short-circuit local traffic) match: every endpoint of the Service.`,
      n.external,
      n.cluster,
    );
    return finish(ctx, st, base, steps, notes, n.cluster, sel.clusterEndpoints!, {
      masqueraded: true,
      reason: "traffic from the node itself to an externalTrafficPolicy Local address is masqueraded",
    });
  }
  if (!plan.hasExternalEndpoints) {
    step(
      `${n.external}: externalTrafficPolicy Local and no endpoint on this node: nothing sends the packet on, so ` +
        "it is not DNATed.",
      n.external,
    );
    return endpointsCheck(plan.externalVerdict);
  }
  step(
    `${n.external}: externalTrafficPolicy Local: "goto ${n.local}", this node's endpoints only.`,
    n.external,
    n.local,
  );
  return finish(ctx, st, base, steps, notes, n.local, sel.localEndpoints!, {
    masqueraded: false,
    reason: "externalTrafficPolicy Local keeps the client's source IP",
  });
}

/** Load balancing in `chain` (and the endpoint chains with affinity), and postrouting. */
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
  const ipX = nftFamily(ctx.family);
  const names = servicePortChainNames(info.name, ctx.proto);
  const n = eps.length;
  const affinity = info.stickyMaxAgeSeconds > 0;
  // Without affinity the policy chain DNATs itself; with it, each endpoint has a chain.
  const epNames = eps.map((e) => endpointNames(names.base, e.ip, e.port));
  const via = affinity ? epNames.map((x) => x.chain) : eps.map(() => chain);
  if (affinity) {
    steps.push({
      text:
        `${chain}: ClientIP affinity: "${ipX} saddr @affinity-... goto endpoint-..." sends a source seen in the ` +
        `last ${info.stickyMaxAgeSeconds} s back to its endpoint (one affinity set per endpoint); a new source ` +
        "goes on to the random choice.",
      names: [chain, ...epNames.map((x) => x.affinitySet)],
    });
    steps.push({
      text: n === 1
        ? `${chain}: "numgen random mod 1" always picks ${epNames[0].chain}, its only endpoint.`
        : `${chain}: "numgen random mod ${n} vmap { 0 : goto ..., ${
          n - 1
        } : goto ... }" picks one of ${n} endpoint ` +
          `chains, each with probability 1/${n}.`,
      names: [chain, ...epNames.map((x) => x.chain)],
    });
    steps.push({
      text: `${n === 1 ? epNames[0].chain : "The chosen endpoint- chain"}: "update @affinity-... { ${ipX} ` +
        `saddr }", then "meta l4proto ${ctx.proto} dnat to ip:port".`,
      names: epNames.map((x) => x.chain),
    });
  } else {
    steps.push({
      text: n === 1
        ? `${chain}: "meta l4proto ${ctx.proto} dnat to ${eps[0].endpoint}", its only endpoint.`
        : `${chain}: "meta l4proto ${ctx.proto} dnat ${ipX} addr . port to numgen random mod ${n} map { 0 : ` +
          `ip . port, ... }" picks one of ${n} endpoints, each with probability 1/${n}.`,
      names: [chain],
    });
  }
  // hairpin-connections holds the endpoints on this node: a pod reaching itself through the Service.
  const hairpin = eps.some((e) => e.isLocal && e.ip === ctx.src);
  if (masq.masqueraded || hairpin) {
    const m = masqueradeMark(ctx.opts.masqueradeBit);
    steps.push({
      text: masq.masqueraded
        ? `${CHAIN.natPostrouting} -> ${CHAIN.masquerading}: a packet marked ${m} is masqueraded (masquerade ` +
          "fully-random): the endpoint sees the node's address as the source."
        : `${CHAIN.natPostrouting} -> ${CHAIN.masquerading}: "ct status dnat ${ipX} saddr . ${ipX} daddr . meta ` +
          `l4proto . th dport @${SET.hairpinConnections}" masquerades a connection from an endpoint on this node ` +
          "to itself (here only if the chosen endpoint is the source): it then sees the node's address as the source.",
      names: [CHAIN.masquerading, ...(masq.masqueraded ? [] : [SET.hairpinConnections])],
    });
  }
  notes.push(...selectionNotes(st, eps));
  const endpoints: EndpointChoice[] = eps.map((e, i) => ({
    endpoint: e.endpoint,
    ip: e.ip,
    nodeName: e.nodeName,
    local: e.isLocal,
    probability: uniform(n),
    via: via[i],
    hairpin: e.isLocal && e.ip === ctx.src,
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

/** No service port matched: other ports of a ClusterIP are rejected, unallocated ClusterIPs dropped. */
function unmatched(
  ctx: ExplainContext,
  steps: Step[],
  filterHook: string,
  acceptsNodePort: (dst: string) => boolean,
): ModeExplanation {
  const ipX = nftFamily(ctx.family);
  const none = {
    service: null,
    access: null,
    address: null,
    endpoints: [],
    masquerade: null,
    affinity: null,
  };
  const isClusterIP = [...ctx.snapshot.servicePorts.values()].some((s) => s.info.clusterIP === ctx.dst);
  const cidr = ctx.snapshot.serviceCIDRs.find((c) => cidrContains(c, ctx.dst));
  const checked = filterHook !== CHAIN.filterInput;
  if (checked && isClusterIP) {
    steps.push({
      text:
        `${filterHook} -> ${CHAIN.clusterIPsCheck}: ${ctx.dst} is in @${SET.clusterIPs} but no Service port ` +
        `${ctx.protocol} ${ctx.port} matched: "Reject traffic to invalid ports of ClusterIPs".`,
      names: [CHAIN.clusterIPsCheck, SET.clusterIPs],
    });
    return {
      ...none,
      steps,
      verdict: { kind: "reject", reason: "no such port on this ClusterIP" },
      notes: [],
    };
  }
  if (checked && cidr !== undefined) {
    steps.push({
      text: `${filterHook} -> ${CHAIN.clusterIPsCheck}: "${ipX} daddr { ... } drop": ${ctx.dst} is in the ` +
        `ServiceCIDR ${cidr} but no Service has it ("Drop traffic to unallocated ClusterIPs").`,
      names: [CHAIN.clusterIPsCheck],
    });
    return { ...none, steps, verdict: { kind: "drop", reason: "an unallocated ClusterIP" }, notes: [] };
  }
  const nodePort = [...ctx.snapshot.servicePorts.values()].find((s) =>
    s.info.nodePort === ctx.port && s.info.protocol === ctx.protocol
  );
  const nodePortHere = nodePort !== undefined;
  // KubeProxyNFTablesLocalhostNodePorts: a NodePort on loopback is rejected and counted, or (TCP, loopback named
  // in nodePortAddresses) taken by the agent's own listener.
  const localhost = localhostNodePortHandling(
    ctx.opts.featureGates?.["KubeProxyNFTablesLocalhostNodePorts"] ?? false,
    newNodePortAddresses(ctx.family, ctx.opts.nodePortAddresses, ctx.nodeIPs).cidrs,
  );
  if (nodePort !== undefined && isLoopback(ctx.dst) && localhost.rejects.includes(ctx.protocol)) {
    const chain = localhostNodePortRejectChain(ctx.protocol);
    steps.push({
      text:
        `${CHAIN.filterInput} -> ${CHAIN.nodePortEndpointsCheck}: @${SET.localhostNodePortRejects} maps ` +
        `${ctx.proto} . ${ctx.port} to goto ${chain}, which counts it (counter ` +
        `${
          localhostNodePortRejectedCounter(ctx.protocol)
        }) and rejects it (KubeProxyNFTablesLocalhostNodePorts).`,
      names: [CHAIN.nodePortEndpointsCheck, SET.localhostNodePortRejects, chain],
    });
    return {
      ...none,
      steps,
      verdict: {
        kind: "reject",
        reason: "a NodePort on localhost, not served (KubeProxyNFTablesLocalhostNodePorts)",
      },
      notes: [],
    };
  }
  if (nodePort !== undefined && isLoopback(ctx.dst) && localhost.listeners && ctx.protocol === "TCP") {
    const st = nodePort;
    const eps = (st.plan.externalPolicyLocal ? st.selection.localEndpoints : st.selection.clusterEndpoints) ??
      [];
    steps.push({
      text: eps.length > 0
        ? `No rule of the table matches; the agent's own listener on ${ctx.dst}:${ctx.port} ` +
          `(KubeProxyNFTablesLocalhostNodePorts, loopback in nodePortAddresses) accepts the connection and opens ` +
          `one to an endpoint of ${st.info.nameString} (${eps.map((e) => e.endpoint).join(", ")}).`
        : `No rule of the table matches, and ${st.info.nameString} has no endpoints, so the agent has no listener ` +
          `on ${ctx.dst}:${ctx.port}: the connection is refused.`,
      names: [],
    });
    return {
      ...none,
      steps,
      verdict: eps.length > 0
        ? {
          kind: "untouched",
          reason: "no rule matches; the agent's own localhost NodePort listener serves it",
        }
        : { kind: "untouched", reason: "no rule matches and nothing listens" },
      notes: [],
    };
  }
  const why = nodePortHere && isNodeAddress(ctx, ctx.dst) && !acceptsNodePort(ctx.dst)
    ? `${ctx.dst} does not accept NodePorts (nodePortAddresses: ${ctx.opts.nodePortAddresses.join(",")}` +
      `${
        isLoopback(ctx.dst)
          ? "; the nftables mode accepts no NodePort on localhost without the gate " +
            "KubeProxyNFTablesLocalhostNodePorts"
          : ""
      })`
    : `${ctx.dst}:${ctx.port} is not a Service address this node knows`;
  steps.push({
    text: `${
      ctx.from === "node" ? CHAIN.natOutput : CHAIN.natPrerouting
    } -> ${CHAIN.services}: nothing matches: ${why}.`,
    names: [CHAIN.services],
  });
  return { ...none, steps, verdict: { kind: "untouched", reason: "no kube-proxy rule matches" }, notes: [] };
}
