/**
 * `explain --live` in the ipvs mode: the node's IPVS virtual server for the packet (`ipvsadm -S -n`), its
 * entries in the ipsets the path names (`ipset save`) and its address on kube-ipvs0 (`ip -o addr`), compared
 * with what the agent would write now (the rendered `ipvsadm -R`, `ipset restore` and `ip -batch` input,
 * which use the same line forms the tools print); and the packet traced through the node's objects (iptables
 * rules, ipsets, virtual servers, kube-ipvs0) beside the trace through the agent's.
 * @module
 */
import type { Trace, TracePacket } from "../dataplane/iptables/trace.ts";
import type { CommandRunner } from "../exec.ts";
import { type IPFamily, joinHostPort } from "../net/ip.ts";
import type { FirstSync } from "./engine.ts";
import { diffLines, type DriftLine, formatDrift } from "./explain_drift.ts";
import { formatTrace, sameOutcome } from "./explain_trace.ts";
import { readLiveIpvs, renderedIpvs, traceIpvs } from "./explain_trace_ipvs.ts";

/** The comparison `explain --live` prints in the ipvs mode. */
export interface IpvsLiveComparison {
  /** The virtual server as the kernel has it (its `-A` and `-a` lines), empty when there is none. */
  readonly virtualServer: readonly string[];
  readonly drift: readonly DriftLine[];
  /** The packet traced through the node's objects, and through the agent's. */
  readonly live: Trace;
  readonly rendered: Trace;
}

const PROTO_FLAG: Readonly<Record<string, string>> = { tcp: "-t", udp: "-u", sctp: "--sctp-service" };

/** `ipvsadm -S -n` / `-R` lines of the virtual server `key` (`-t 10.96.0.1:443`), defaults spelled out removed. */
function virtualServerLines(text: string, key: string): string[] {
  return text.split("\n")
    .map((l) => l.trim().replace(/ -M 255\.255\.255\.255| -M 128/, ""))
    .filter((l) => l.startsWith(`-A ${key} `) || l.startsWith(`-a ${key} `));
}

/** `ipset save` / `ipset restore` `add` lines of `sets` that name the packet's destination. */
function setLines(text: string, sets: ReadonlySet<string>, dst: string): string[] {
  return text.split("\n")
    .map((l) => l.trim().replace(/ -exist$/, ""))
    .filter((l) => {
      const [op, set, entry] = l.split(" ");
      return op === "add" && sets.has(set) && entry !== undefined && entry.split(",").includes(dst);
    });
}

async function read(runner: CommandRunner, cmd: string, args: string[]): Promise<string> {
  const r = await runner.tryRun({ cmd, args, timeoutMs: 60_000 });
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(" ")} failed: ${r.stderr.trim()}`);
  return r.stdout;
}

/**
 * Compares the node's IPVS state for the packet to `dst`:`port`/`proto` with the first sync's batches of
 * `family`; `names` are the objects explain's path cites (the ipsets among them are compared).
 * @throws {Error} When a tool fails.
 */
export async function compareLiveIpvs(
  runner: CommandRunner,
  sync: FirstSync,
  family: IPFamily,
  names: readonly string[],
  packet: { dst: string; port: number; proto: string },
  traced: TracePacket,
): Promise<IpvsLiveComparison> {
  const input = (cmd: string) =>
    sync.commands.filter((c) => c.family === family && c.cmd === cmd).map((c) => c.stdin).join("\n");
  const key = `${PROTO_FLAG[packet.proto]} ${joinHostPort(packet.dst, packet.port)}`;
  const drift: DriftLine[] = [];

  const liveVS = virtualServerLines(await read(runner, "ipvsadm", ["-S", "-n"]), key);
  diffLines(`virtual server ${key}`, virtualServerLines(input("ipvsadm"), key), liveVS, drift, String);

  const sets = new Set(names.filter((n) => /^KUBE-/.test(n)));
  if (sets.size > 0) {
    const live = setLines(await read(runner, "ipset", ["save"]), sets, packet.dst);
    diffLines("ipset", setLines(input("ipset"), sets, packet.dst), live, drift, String);
  }

  const prefix = family === "IPv6" ? 128 : 32;
  const wantsAddr = input("ip").split("\n").some((l) =>
    l.trim() === `addr replace ${packet.dst}/${prefix} dev kube-ipvs0`
  );
  const addrs = await runner.tryRun({ cmd: "ip", args: ["-o", "addr", "show", "dev", "kube-ipvs0"] });
  const hasAddr = addrs.code === 0 && addrs.stdout.split(/\s+/).includes(`${packet.dst}/${prefix}`);
  if (wantsAddr !== hasAddr) {
    drift.push({
      object: "kube-ipvs0",
      kind: wantsAddr ? "missing" : "extra",
      line: `${packet.dst}/${prefix}`,
    });
  }
  const live = traceIpvs(await readLiveIpvs(runner, family), traced);
  return { virtualServer: liveVS, drift, live, rendered: traceIpvs(renderedIpvs(sync, family), traced) };
}

/** The comparison as text for a terminal. */
export function formatLiveIpvs(c: IpvsLiveComparison): string {
  const lines = ["Live:       the kernel's IPVS virtual server for this packet (ipvsadm -S -n):"];
  if (c.virtualServer.length === 0) lines.push("              none");
  for (const l of c.virtualServer) lines.push(`              ${l}`);
  lines.push(...formatDrift(c.drift));
  lines.push(
    "Traced:     the kernel's objects (rules, ipsets, virtual servers, kube-ipvs0) take this packet to:",
  );
  lines.push(...formatTrace(c.live));
  if (sameOutcome(c.live, c.rendered)) lines.push("  as the agent's objects would.");
  else {
    lines.push("  the agent's objects would take it to:");
    lines.push(...formatTrace(c.rendered, "    "));
  }
  return lines.join("\n") + "\n";
}
