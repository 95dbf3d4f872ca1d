/**
 * `kube-proxy explain`: one packet's path through the rules of the chosen mode. The packet tracer walks the
 * objects the first sync writes (`explain_path.ts`): the path printed is the rules the packet matches, and the
 * verdict, endpoints, shares and masquerading are where that walk ends, so explain cannot disagree with the
 * rules. The model adds only what rules do not say: which Service owns the address, how its endpoints were
 * selected, and a mode's facts beyond its rules (IPVS's Local fallback, the nftables localhost listener).
 *
 * What explain assumes about the node: its addresses are the Node's InternalIP/ExternalIP addresses (or
 * `--node-ip`) plus loopback, as render's simulated node has them.
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import { DUMMY_INTERFACE } from "../dataplane/ipvs/addresses.ts";
import { configuredLocalTraffic, type LocalTraffic } from "../dataplane/local_traffic.ts";
import { localhostNodePortHandling } from "../dataplane/nftables/rules.ts";
import { cidrContains, familyOf, type IPFamily, isLoopback, parseIP, splitHostPort } from "../net/ip.ts";
import { newNodePortAddresses } from "../net/node_addresses.ts";
import type { EndpointInfo, Protocol, ProxySnapshot, ServicePortState } from "../proxy/types.ts";
import type { FirstSync } from "./engine.ts";
import {
  type AccessKind,
  describeMatch,
  type EndpointChoice,
  type Explanation,
  findServicePort,
  hostPort,
  type PacketOrigin,
  selectionNotes,
  type VerdictKind,
} from "./explain_common.ts";
import { type PathOutcome, type PathStep, splitPath, tracePath } from "./explain_path.ts";
import { tracePacket } from "./explain_trace.ts";

export type { Explanation, PacketOrigin };

/** The packet as given on the command line. */
export interface PacketFlags {
  source: string;
  destination: string;
  protocol: string;
  from: PacketOrigin | "";
  inInterface: string;
}

/** A parsed packet (the source may still be unknown: `--from node` without `--source`). */
export interface PacketSpec {
  readonly source: string | null;
  readonly destination: string;
  readonly port: number;
  readonly protocol: Protocol;
  readonly family: IPFamily;
  readonly from: PacketOrigin | null;
  readonly inInterface: string;
}

/**
 * Checks and parses the packet flags.
 * @throws {Error} With a message for the user when a flag is missing or malformed.
 */
export function parsePacket(f: PacketFlags): PacketSpec {
  if (f.destination === "") throw new Error("--destination IP:PORT is required");
  const m = f.destination.match(/^\[([^\]]+)\]:(\d+)$/) ?? f.destination.match(/^([^:]+):(\d+)$/);
  const dst = m ? parseIP(m[1]) : null;
  const port = m ? Number(m[2]) : NaN;
  if (!m || !dst || !(port >= 1 && port <= 65535)) {
    throw new Error(
      `--destination must be IP:PORT or [IPv6]:PORT with a port 1-65535, not "${f.destination}"`,
    );
  }
  const protocol = f.protocol.toUpperCase();
  if (protocol !== "TCP" && protocol !== "UDP" && protocol !== "SCTP") {
    throw new Error(`--protocol must be tcp, udp or sctp, not "${f.protocol}"`);
  }
  if (f.from !== "" && f.from !== "pod" && f.from !== "node" && f.from !== "outside") {
    throw new Error(`--from must be pod, node or outside, not "${f.from}"`);
  }
  let source: string | null = null;
  if (f.source !== "") {
    const s = parseIP(f.source);
    if (!s) throw new Error(`--source must be an IP address, not "${f.source}"`);
    if (s.family !== dst.family) {
      throw new Error(`--source ${f.source} and --destination ${f.destination} are of different IP families`);
    }
    source = s.ip;
  } else if (f.from !== "node") {
    throw new Error("--source is required (it may be left out only with --from node: the node's IP is used)");
  }
  return {
    source,
    destination: dst.ip,
    port,
    protocol: protocol as Protocol,
    family: dst.family,
    from: f.from === "" ? null : f.from,
    inInterface: f.inInterface,
  };
}

function describeLocal(
  lt: LocalTraffic,
  src: string,
  from: PacketOrigin,
  iface: string,
): [boolean | null, string] {
  switch (lt.kind) {
    case "none":
      return [
        null,
        "this family has no local-traffic detection (no cluster CIDR / pod CIDR / interface set)",
      ];
    case "cidr": {
      const inside = cidrContains(lt.cidr, src);
      return [inside, `the source ${src} is ${inside ? "" : "not "}in ${lt.cidr}`];
    }
    case "interface": {
      if (from === "node") return [false, `it comes from the node itself, not in through ${lt.name}`];
      const local = iface !== "" ? iface === lt.name : from === "pod";
      return [local, `it ${local ? "arrives" : "does not arrive"} through ${lt.name}`];
    }
    case "interfacePrefix": {
      if (from === "node") return [false, `it comes from the node itself, not in through ${lt.prefix}*`];
      const local = iface !== "" ? iface.startsWith(lt.prefix) : from === "pod";
      return [local, `it ${local ? "arrives" : "does not arrive"} through an interface named ${lt.prefix}*`];
    }
  }
}

/** Where a packet comes from, as explain decides it when the flags leave it open. */
export interface PacketOriginResolved {
  /** The source (the node's first IP of the family when `--source` was left out). */
  readonly src: string;
  readonly from: PacketOrigin;
  /** Why `from` was inferred ("" when given). */
  readonly fromWhy: string;
  /** The node's IPs of the packet's family. */
  readonly nodeIPs: readonly string[];
  readonly localTraffic: LocalTraffic;
}

/**
 * Decides the packet's source and where it enters: a node address is the node; local traffic by the
 * detect-local mode is a pod; anything else comes from outside.
 * @throws {Error} When the sync served no family of the packet.
 */
export function resolveOrigin(packet: PacketSpec, sync: FirstSync, opts: ProxyOptions): PacketOriginResolved {
  const family = packet.family;
  if (!sync.snapshots.has(family)) {
    throw new Error(`the agent serves no ${family} here (families: ${sync.families.join(", ")})`);
  }
  const nodeIPs = sync.nodeIPs.filter((ip) => familyOf(ip) === family);
  const src = packet.source ?? nodeIPs[0] ?? (family === "IPv6" ? "::1" : "127.0.0.1");
  const localTraffic = configuredLocalTraffic(opts, sync.podCIDRs, family);
  let from = packet.from;
  let fromWhy = "";
  if (from === null) {
    if (isLoopback(src) || nodeIPs.includes(src)) {
      from = "node";
      fromWhy = ` (the source ${src} is an address of the node)`;
    } else {
      const [local] = describeLocal(localTraffic, src, "pod", packet.inInterface);
      from = local ? "pod" : "outside";
      fromWhy = local
        ? ` (the source ${src} is local traffic for --detect-local-mode ${opts.detectLocalMode})`
        : ` (the source ${src} is neither a node address nor local traffic)`;
    }
  }
  return { src, from, fromWhy, nodeIPs, localTraffic };
}

/**
 * Explains `packet` with the rules of a first sync: the packet tracer walks the objects the sync writes and
 * every part of the answer (path, verdict, endpoints and shares, masquerading) is the tracer's; the model adds
 * which Service owns the address and notes on how its endpoints were selected.
 * @throws {Error} When the sync served no family of the packet.
 */
export function explainPacket(packet: PacketSpec, sync: FirstSync, opts: ProxyOptions): Explanation {
  const family = packet.family;
  const { src, from, fromWhy, nodeIPs } = resolveOrigin(packet, sync, opts);
  const snapshot = sync.snapshots.get(family)!;
  const traced = tracePath(
    opts.mode,
    sync,
    family,
    tracePacket(packet, src, from, nodeIPs),
    opts.config.ipvs.scheduler,
  );
  const match = findServicePort(snapshot, packet, nodeIPs);
  const st = match?.st ?? null;
  const dnat = traced.outcomes.filter((o) => o.verdict === "dnat");
  const endpoints: EndpointChoice[] = dnat.map((o) => {
    const ep = modelEndpoint(snapshot, st, o.endpoint!);
    const ip = ep?.ip ?? splitHostPort(o.endpoint!)[0];
    return {
      endpoint: o.endpoint!,
      ip,
      nodeName: ep?.nodeName ?? "",
      local: ep?.isLocal ?? false,
      probability: traced.sharesExact ? o.probability : null,
      via: o.via ?? "",
      hairpin: ip === src,
      masqueraded: o.masqueraded,
    };
  });
  const notes: string[] = [];
  if (st !== null) {
    const reached = st.endpoints.filter((e) => endpoints.some((x) => x.endpoint === e.endpoint));
    notes.push(...selectionNotes(st, reached));
    notes.push(...modeNotes(opts, st, match!.access, endpoints, from, packet, traced.dummyAddresses));
  }
  const verdict = verdictOf(traced.outcomes, endpoints);
  if (verdict.kind === "untouched" || match === null) {
    notes.push(...unmatchedNotes(opts, snapshot, match, packet, nodeIPs));
  }
  const where = from === "pod"
    ? `from a pod on ${opts.hostname}`
    : from === "node"
    ? `from ${opts.hostname} itself`
    : `from outside ${opts.hostname}${packet.inInterface ? ` through ${packet.inInterface}` : ""}`;
  const sticky = st !== null && st.info.stickyMaxAgeSeconds > 0;
  return {
    mode: opts.mode,
    family,
    packet: `${packet.protocol} ${src} -> ${hostPort(packet.destination, packet.port)} (${family})`,
    origin: where + fromWhy,
    service: st?.info.nameString ?? null,
    access: match?.access ?? null,
    address: match ? describeMatch(match.st, match.access, packet.destination, packet.port) : null,
    path: splitPath(traced.outcomes),
    verdict: listenerVerdict(opts, match, packet, verdict),
    endpoints,
    masquerade: masqueradeOf(traced.outcomes, endpoints),
    affinity: st === null
      ? null
      : sticky
      ? `ClientIP, ${st.info.stickyMaxAgeSeconds} s${opts.mode === "ipvs" ? " (IPVS persistence)" : ""}`
      : "none",
    notes,
    assumptions: traced.assumptions,
    objects: [...traced.objects, ...endpoints.map((x) => x.via)],
  };
}

/** The model's endpoint for a traced DNAT target (the Service's first, any Service's otherwise). */
function modelEndpoint(
  snapshot: ProxySnapshot,
  st: ServicePortState | null,
  endpoint: string,
): EndpointInfo | null {
  const own = st?.endpoints.find((e) => e.endpoint === endpoint);
  if (own) return own;
  for (const s of snapshot.servicePorts.values()) {
    const e = s.endpoints.find((x) => x.endpoint === endpoint);
    if (e) return e;
  }
  return null;
}

function verdictOf(
  outcomes: readonly PathOutcome[],
  endpoints: readonly EndpointChoice[],
): Explanation["verdict"] {
  const kinds = new Set(outcomes.map((o) => o.verdict));
  if (kinds.size > 1) {
    return {
      kind: outcomes[0].verdict,
      reason: `it depends on the way taken: ${
        outcomes.map((o) => `${percent(o.probability)} ${verdictWord(o.verdict)}`).join(", ")
      }`,
    };
  }
  const o = outcomes[0];
  switch (o.verdict) {
    case "dnat":
      return {
        kind: "dnat",
        reason: endpoints.length === 1
          ? `to ${endpoints[0].endpoint}`
          : `to one of ${endpoints.length} endpoints`,
      };
    case "untouched":
      return { kind: "untouched", reason: "no kube-proxy rule takes it; the packet is routed as it is" };
    default:
      return { kind: o.verdict, reason: o.endedBy ? `by ${cite(o.endedBy)}` : "" };
  }
}

function masqueradeOf(
  outcomes: readonly PathOutcome[],
  endpoints: readonly EndpointChoice[],
): Explanation["masquerade"] {
  if (endpoints.length === 0) return null;
  const others = endpoints.filter((x) => !x.hairpin);
  const judged = others.length > 0 ? others : endpoints;
  const masqueraded = judged.every((x) => x.masqueraded);
  if (!masqueraded) {
    return {
      masqueraded: false,
      reason: judged.some((x) => x.masqueraded)
        ? "only on some ways (see Endpoints)"
        : "no rule on its path marks it for masquerading: the endpoint sees the client's address",
    };
  }
  const by = outcomes.find((o) => o.verdict === "dnat" && o.markedBy !== null)?.markedBy;
  return {
    masqueraded: true,
    reason: by ? `marked by ${cite(by)}` : "masqueraded on its way out (nat POSTROUTING)",
  };
}

/** A step as a verdict or reason names it: where the rule is, and its comment. */
function cite(s: PathStep): string {
  return s.comment ? `${s.where} ("${s.comment}")` : s.where;
}

/** Facts of a mode that are not in its rules but follow from what the trace reached. */
function modeNotes(
  opts: ProxyOptions,
  st: ServicePortState,
  access: AccessKind,
  endpoints: readonly EndpointChoice[],
  from: PacketOrigin,
  packet: PacketSpec,
  dummyAddresses: readonly string[],
): string[] {
  if (opts.mode !== "ipvs") return [];
  const notes: string[] = [];
  const local = access === "clusterIP" ? st.info.internalPolicyLocal : st.plan.externalPolicyLocal;
  if (local && endpoints.some((x) => !x.local) && (st.selection.localEndpoints ?? []).length === 0) {
    notes.push(
      `no endpoint on this node: as upstream's ipvs mode (kubernetes#97081), the ${
        access === "clusterIP" ? "internal" : "external"
      } Local policy falls back to every endpoint` +
        (endpoints.every((x) => x.masqueraded)
          ? ""
          : "; traffic that is not masqueraded may not find its way back from another node"),
    );
  }
  if (from === "node" && dummyAddresses.includes(packet.destination)) {
    notes.push(
      `a connection from the node to an address on ${DUMMY_INTERFACE} gets that address as its source unless the ` +
        "program picks one",
    );
  }
  return notes;
}

/**
 * What the model knows of a packet no Service port matched or no rule took: which Service has the address, or
 * whose NodePort the port is.
 */
function unmatchedNotes(
  opts: ProxyOptions,
  snapshot: ProxySnapshot,
  match: { st: ServicePortState; access: AccessKind } | null,
  packet: PacketSpec,
  nodeIPs: readonly string[],
): string[] {
  const dst = packet.destination;
  if (match !== null) {
    if (match.access !== "nodePort") return [];
    return [
      `${packet.port} is the NodePort of ${match.st.info.nameString}, but no rule takes it at ${dst} ` +
      `(nodePortAddresses: ${opts.nodePortAddresses.join(",") || "all of the node's addresses"})`,
    ];
  }
  for (const st of snapshot.servicePorts.values()) {
    const i = st.info;
    if ([i.clusterIP, ...i.externalIPs, ...i.loadBalancerVIPs].includes(dst)) {
      return [
        `${dst} is an address of ${i.serviceKey}, but none of its ports is ${packet.protocol} ${packet.port}`,
      ];
    }
  }
  return isLoopback(dst) || nodeIPs.includes(dst)
    ? []
    : [`${dst} is not an address of any Service this node knows`];
}

/**
 * nftables with KubeProxyNFTablesLocalhostNodePorts and loopback in nodePortAddresses: a TCP NodePort on
 * localhost that no rule takes is served by the agent's own listener (a process, not a rule).
 */
function listenerVerdict(
  opts: ProxyOptions,
  match: { st: ServicePortState; access: AccessKind } | null,
  packet: PacketSpec,
  verdict: Explanation["verdict"],
): Explanation["verdict"] {
  if (
    opts.mode !== "nftables" || verdict.kind !== "untouched" || match?.access !== "nodePort" ||
    !isLoopback(packet.destination) || packet.protocol !== "TCP"
  ) return verdict;
  const handling = localhostNodePortHandling(
    opts.featureGates?.["KubeProxyNFTablesLocalhostNodePorts"] ?? false,
    newNodePortAddresses(packet.family, opts.nodePortAddresses, []).cidrs,
  );
  if (!handling.listeners) return verdict;
  return match.st.plan.hasEndpoints
    ? {
      kind: "untouched",
      reason: `no rule takes it; the agent's own localhost NodePort listener on ${
        hostPort(packet.destination, packet.port)
      } serves it (KubeProxyNFTablesLocalhostNodePorts)`,
    }
    : {
      kind: "untouched",
      reason: `no rule takes it, and ${match.st.info.nameString} has no endpoints, so nothing listens`,
    };
}

function percent(p: number): string {
  const v = p * 100;
  return Number.isInteger(v) ? `${v}%` : `${v.toFixed(1)}%`;
}

/** The most ways of a split path printed one by one; the rest are counted. */
const MAX_BRANCHES = 6;

/** The explanation as text for a terminal. */
export function formatExplanation(e: Explanation): string {
  const lines: string[] = [];
  lines.push(wrap(`Packet:     ${e.packet}, ${e.origin}`, "", "            "));
  lines.push(
    wrap(`Service:    ${e.service === null ? "none" : `${e.service}, ${e.address}`}`, "", "            "),
  );
  lines.push(`Mode:       ${e.mode}`);
  lines.push("");
  lines.push("Path (traced through the rules the agent writes):");
  let n = 0;
  const step = (text: string) => lines.push(wrap(`${++n}. ${text}`, "  ", "     "));
  for (const s of e.path.prefix) step(s.text);
  // Ways that differ only in where they end (IPVS's pick, an nftables numgen map) are the Endpoints table.
  if (e.path.branches.some((b) => b.steps.length > 0)) {
    step(`Then one of ${e.path.branches.length} ways, by share of new connections:`);
    for (const b of e.path.branches.slice(0, MAX_BRANCHES)) {
      const o = b.outcome;
      const share = percent(o.probability);
      lines.push(
        wrap(
          `${share}: ${o.verdict === "dnat" ? `DNAT to ${o.endpoint}` : verdictWord(o.verdict)}` +
            (b.steps.length > 0 ? ":" : ""),
          "     ",
          "       ",
        ),
      );
      for (const s of b.steps) lines.push(wrap(s.text, "       ", "         "));
    }
    const more = e.path.branches.length - MAX_BRANCHES;
    if (more > 0) lines.push(`     ... and ${more} more ways alike (one per endpoint; see Endpoints)`);
  }
  for (const s of e.path.suffix) step(s.text);
  if (n === 0) step("no rule of the agent's matches it");
  lines.push("");
  lines.push(
    wrap(
      `Verdict:    ${verdictWord(e.verdict.kind)}${e.verdict.reason ? ": " + e.verdict.reason : ""}`,
      "",
      "            ",
    ),
  );
  if (e.endpoints.length > 0) {
    lines.push("Endpoints:");
    const w = Math.max(...e.endpoints.map((x) => x.endpoint.length));
    const overall = e.masquerade?.masqueraded ?? false;
    for (const x of e.endpoints) {
      const where = x.local ? "this node" : x.nodeName !== "" ? `node ${x.nodeName}` : "another node";
      const cells = [x.endpoint.padEnd(w)];
      if (x.probability !== null) cells.push(percent(x.probability).padStart(6));
      const masq = x.masqueraded === overall
        ? ""
        : x.masqueraded
        ? `; ${x.hairpin ? "the source itself: " : ""}masqueraded`
        : "; not masqueraded";
      cells.push(x.via, `(${where}${masq})`);
      lines.push("  " + cells.join("  "));
    }
  }
  if (e.masquerade !== null) {
    lines.push(
      wrap(
        `Masquerade: ${e.masquerade.masqueraded ? "yes" : "no"} - ${e.masquerade.reason}`,
        "",
        "            ",
      ),
    );
  }
  if (e.affinity !== null) lines.push(wrap(`Affinity:   ${e.affinity}`, "", "            "));
  for (const n of e.notes) lines.push(wrap(`Note:       ${n}`, "", "            "));
  for (const a of e.assumptions) lines.push(wrap(`Assumed:    ${a}`, "", "            "));
  return lines.join("\n") + "\n";
}

function verdictWord(k: VerdictKind): string {
  switch (k) {
    case "dnat":
      return "forwarded (DNAT)";
    case "reject":
      return "rejected";
    case "drop":
      return "dropped";
    case "untouched":
      return "not handled by kube-proxy";
  }
}

/** Wraps `text` at 110 columns; the first line starts with `first`, the others with `rest`. */
function wrap(text: string, first: string, rest: string): string {
  const width = 110;
  const words = text.split(" ");
  const out: string[] = [];
  let line = first;
  let empty = true;
  for (const w of words) {
    if (!empty && line.length + 1 + w.length > width) {
      out.push(line);
      line = rest + w;
    } else {
      line += (empty ? "" : " ") + w;
    }
    empty = false;
  }
  out.push(line);
  return out.join("\n");
}
