/**
 * `kube-proxy explain`: one packet's path through the rules of the chosen mode, in plain words. The decisions
 * come from the model the rules are rendered from (each port's {@linkcode ServicePortState}: its info, endpoint
 * selection and plan, from the same first sync render prints) and the names from each mode's own naming
 * helpers, so that explain and the rules cannot disagree; every name explain cites is also looked up in the
 * rendered rules (a name that is missing is reported as a bug).
 *
 * What explain assumes about the node: its addresses are the Node's InternalIP/ExternalIP addresses (or
 * `--node-ip`) plus loopback, as render's simulated node has them.
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import { configuredLocalTraffic, type LocalTraffic } from "../dataplane/local_traffic.ts";
import { cidrContains, familyOf, type IPFamily, isLoopback, parseIP } from "../net/ip.ts";
import type { Protocol } from "../proxy/types.ts";
import type { FirstSync } from "./engine.ts";
import {
  type ExplainContext,
  type Explanation,
  hostPort,
  type PacketOrigin,
  type VerdictKind,
} from "./explain_common.ts";
import { explainIptables } from "./explain_iptables.ts";
import { explainIpvs } from "./explain_ipvs.ts";
import { explainNftables } from "./explain_nftables.ts";
import { formatCommands } from "./render_output.ts";

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
 * Explains `packet` with the snapshots and rules of a first sync.
 * @throws {Error} When the sync served no family of the packet.
 */
export function explainPacket(packet: PacketSpec, sync: FirstSync, opts: ProxyOptions): Explanation {
  const family = packet.family;
  const { src, from, fromWhy, nodeIPs, localTraffic } = resolveOrigin(packet, sync, opts);
  const snapshot = sync.snapshots.get(family)!;
  const [isLocalTraffic, localWhy] = describeLocal(localTraffic, src, from, packet.inInterface);
  const ctx: ExplainContext = {
    opts,
    snapshot,
    family,
    src,
    dst: packet.destination,
    port: packet.port,
    protocol: packet.protocol,
    proto: packet.protocol.toLowerCase(),
    from,
    inInterface: packet.inInterface,
    nodeIPs,
    localTraffic,
    isLocalTraffic,
    localWhy,
  };
  const e = opts.mode === "nftables"
    ? explainNftables(ctx)
    : opts.mode === "ipvs"
    ? explainIpvs(ctx)
    : explainIptables(ctx);
  const rendered = formatCommands(sync.commands.filter((c) => c.family === family));
  const unknownNames = [...new Set(e.steps.flatMap((s) => s.names))].filter((n) => !rendered.includes(n));
  const where = from === "pod"
    ? `from a pod on ${opts.hostname}`
    : from === "node"
    ? `from ${opts.hostname} itself`
    : `from outside ${opts.hostname}${packet.inInterface ? ` through ${packet.inInterface}` : ""}`;
  return {
    mode: opts.mode,
    family,
    packet: `${packet.protocol} ${src} -> ${hostPort(packet.destination, packet.port)} (${family})`,
    origin: where + fromWhy,
    unknownNames,
    ...e,
  };
}

function percent(p: number): string {
  const v = p * 100;
  return Number.isInteger(v) ? `${v}%` : `${v.toFixed(1)}%`;
}

/** The explanation as text for a terminal. */
export function formatExplanation(e: Explanation): string {
  const lines: string[] = [];
  lines.push(wrap(`Packet:     ${e.packet}, ${e.origin}`, "", "            "));
  lines.push(
    wrap(`Service:    ${e.service === null ? "none" : `${e.service}, ${e.address}`}`, "", "            "),
  );
  lines.push(`Mode:       ${e.mode}`);
  lines.push("");
  lines.push("Path:");
  e.steps.forEach((s, i) => lines.push(wrap(`${i + 1}. ${s.text}`, "  ", "     ")));
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
    for (const x of e.endpoints) {
      const where = x.local ? "this node" : x.nodeName !== "" ? `node ${x.nodeName}` : "another node";
      const cells = [x.endpoint.padEnd(w)];
      if (x.probability !== null) cells.push(percent(x.probability).padStart(6));
      cells.push(x.via, `(${where}${x.hairpin ? "; the source itself: masqueraded" : ""})`);
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
  for (const n of e.unknownNames) {
    lines.push(`Warning:    "${n}" is not in the rendered rules (a bug in explain: please report it)`);
  }
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
