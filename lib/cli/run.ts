/**
 * `kube-proxy render` and `kube-proxy explain`: the agent's flags and configuration (its own flag set, with a
 * few flags of their own), manifests instead of an API server, the agent's first full sync run without a
 * kernel (engine.ts), then the rules (render) or a packet's path through them (explain).
 *
 * Exit codes: 0 when everything was used; 2 for flag errors and for input that is (partly) unusable (every
 * problem is printed to stderr with its file, line, object and field; everything else is still rendered);
 * 1 when the configuration is invalid (as the agent) or the sync fails.
 * @module
 */
import { type CommandIO, parseCommandLine, type ProxyOptions, type Subcommand } from "../config/command.ts";
import type { FlagSet } from "../config/flag_set.ts";
import { configureLogging } from "../log.ts";
import type { IPFamily } from "../proxy/types.ts";
import { type FirstSync, firstSync, RenderError } from "./engine.ts";
import { type CommandRunner, DenoCommandRunner } from "../exec.ts";
import {
  explainPacket,
  type Explanation,
  formatExplanation,
  type PacketOrigin,
  type PacketSpec,
  parsePacket,
  resolveOrigin,
} from "./explain.ts";
import { compareLiveIpvs, formatLiveIpvs } from "./explain_live_ipvs.ts";
import { compareLiveNftables, formatLiveNftables } from "./explain_live_nftables.ts";
import { compareLive, formatLive, readLiveIptables, renderedIptables, tracePacket } from "./explain_trace.ts";
import { checkObjects, formatProblem, type InputProblem, type ProxyInput } from "./inputs.ts";
import { readManifests, type ReadOptions } from "./manifests.ts";
import { NodeInputError, resolveNode } from "./node.ts";
import { formatCommands } from "./render_output.ts";
import { parseFieldPath } from "./schema.ts";

/** Where the subcommands write, how they read stdin and run programs (tests replace them). */
export interface SubcommandIO extends CommandIO, ReadOptions {
  /** Runs the programs `explain --live` reads the node with (default: the host's programs). */
  runner?: CommandRunner;
}

const encoder = new TextEncoder();
const defaultIO: SubcommandIO = {
  stdout: (s) => Deno.stdout.writeSync(encoder.encode(s)),
  stderr: (s) => Deno.stderr.writeSync(encoder.encode(s)),
};

/** The flags render adds to the agent's. */
interface RenderFlags {
  manifests: string[];
  nodeIPs: string[];
  ipFamily: string;
}

/** The flags explain adds to render's. */
interface ExplainFlags extends RenderFlags {
  source: string;
  destination: string;
  protocol: string;
  from: string;
  inInterface: string;
  live: boolean;
}

const RENDER_DESCRIPTION = `Prints the rules kube-proxy writes, without a cluster and without root: the
commands of the agent's first full sync in the chosen mode (iptables-restore payloads per IP family, the nft
transaction, the ipvsadm/ipset/ip batches), each after a comment line naming the program, its arguments and the
IP family. Give the Services and EndpointSlices (and the Node, or --node-ip) as manifests, with the same flags
or --config as the agent; --hostname-override names the node, as for the agent.`;

const EXPLAIN_DESCRIPTION =
  `Explains in plain words what kube-proxy does with one packet: the chain or map that
matches it (with the mode's own names), the endpoints it can reach and with what probability, whether it is
masqueraded and why, session affinity, and why it is rejected or dropped. Takes render's inputs plus the packet:
--source, --destination IP:PORT, --protocol, and where it enters the node (--from). With --live (on the node, as
root) it also reads this node's rules and says where they differ from what the agent would write now on the
packet's path: in the iptables mode it walks the packet through the rules iptables-save reads; in the nftables
mode it compares the objects of the path in nft list table; in the ipvs mode the packet's virtual server, ipset
entries and kube-ipvs0 address.`;

function addRenderFlags(fs: FlagSet, f: RenderFlags): void {
  fs.stringArray(
    "manifests",
    () => f.manifests,
    (v) => f.manifests = v,
    "Manifest files or directories (YAML or JSON, multi-document, kind List; directories are read " +
      "recursively for *.yaml, *.yml, *.json), or - for stdin. Repeatable.",
    { shorthand: "f" },
  );
  fs.stringSlice(
    "node-ip",
    () => f.nodeIPs,
    (v) => f.nodeIPs = v,
    "The node's IPs (comma-separated, primary first), for when no Node manifest is given; replaces the " +
      "addresses of a Node manifest.",
  );
  fs.string(
    "ip-family",
    () => f.ipFamily,
    (v) => f.ipFamily = v,
    "Only this family's commands (IPv4 or IPv6); both by default.",
  );
}

function addExplainFlags(fs: FlagSet, f: ExplainFlags): void {
  addRenderFlags(fs, f);
  fs.string("source", () => f.source, (v) => f.source = v, "The packet's source IP.");
  fs.string(
    "destination",
    () => f.destination,
    (v) => f.destination = v,
    "The packet's destination, IP:PORT ([IPv6]:PORT).",
  );
  fs.string("protocol", () => f.protocol, (v) => f.protocol = v, "tcp, udp or sctp.");
  fs.string(
    "from",
    () => f.from,
    (v) => f.from = v,
    "Where the packet enters: pod (a pod on this node), node (a process on the node itself) or outside " +
      "(through a node interface: clients, other nodes and their pods). Default: node when --source is a node " +
      "IP, else pod when --source is local traffic by the detect-local mode, else outside.",
  );
  fs.string(
    "in-interface",
    () => f.inInterface,
    (v) => f.inInterface = v,
    "The interface the packet arrives on (matters for --detect-local-mode BridgeInterface and " +
      "InterfaceNamePrefix).",
  );
  fs.bool(
    "live",
    () => f.live,
    (v) => f.live = v,
    "Also read this node's rules (iptables: iptables-save, the packet traced through them; nftables: nft list " +
      "table, the path's objects compared; ipvs: ipvsadm -S -n, ipset save, kube-ipvs0; needs root) and report " +
      "drift from what the agent would write now.",
  );
}

/** Runs `argv` (`render ...` or `explain ...`, without the program name); resolves with the exit code. */
export async function runSubcommand(argv: readonly string[], io: SubcommandIO = defaultIO): Promise<number> {
  const name = argv[0];
  const render: RenderFlags = { manifests: [], nodeIPs: [], ipFamily: "" };
  const explain: ExplainFlags = {
    ...render,
    source: "",
    destination: "",
    protocol: "tcp",
    from: "",
    inInterface: "",
    live: false,
  };
  const flags = name === "explain" ? explain : render;
  const sub: Subcommand = name === "explain"
    ? { name, description: EXPLAIN_DESCRIPTION, addFlags: (fs) => addExplainFlags(fs, explain) }
    : { name: "render", description: RENDER_DESCRIPTION, addFlags: (fs) => addRenderFlags(fs, render) };
  const parsed = await parseCommandLine([...argv.slice(1)], io, sub);
  if ("exit" in parsed) return parsed.exit;
  const opts = parsed.options;
  const usage = (msg: string) => {
    io.stderr(`Error: ${msg}\n`);
    return 2;
  };
  if (opts.cleanup || opts.initOnly) {
    return usage(`--cleanup and --init-only are not for "kube-proxy ${name}"`);
  }
  if (flags.manifests.length === 0) return usage("no manifests: give -f FILE, -f DIR or -f - (stdin)");
  if (flags.ipFamily !== "" && flags.ipFamily !== "IPv4" && flags.ipFamily !== "IPv6") {
    return usage(`--ip-family must be IPv4 or IPv6, not "${flags.ipFamily}"`);
  }
  // The agent's logs are for the agent; here they would only repeat what is reported below. -v shows them.
  if (opts.config.logging.verbosity === 0) configureLogging({ sink: () => {} });

  let packet = null;
  if (name === "explain") {
    try {
      packet = parsePacket({
        source: explain.source,
        destination: explain.destination,
        protocol: explain.protocol,
        from: explain.from as PacketOrigin | "",
        inInterface: explain.inInterface,
      });
    } catch (err) {
      return usage((err as Error).message);
    }
  }

  const loaded = await readManifests(flags.manifests, io);
  const problems: InputProblem[] = loaded.problems.map((p) => ({
    severity: "error",
    at: p.at,
    message: p.message,
  }));
  const checked = checkObjects(loaded.objects);
  problems.push(...checked.problems);
  const input = checked.input;

  let sync: FirstSync;
  try {
    const node = resolveNode(opts.hostname, input.nodes, flags.nodeIPs, opts.detectLocalMode === "NodeCIDR");
    sync = await firstSync(opts, {
      node,
      services: input.services,
      slices: input.slices,
      serviceCIDRs: input.serviceCIDRs,
    });
  } catch (err) {
    report(io, problems);
    if (err instanceof NodeInputError) return usage(err.message);
    if (err instanceof RenderError) {
      io.stderr(`Error: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
  problems.push(...invalidServiceProblems(sync, input));
  if (sync.hostNote !== null) {
    problems.push({
      severity: "note",
      at: { file: "", line: 0, col: 0 },
      message:
        `this machine could not run the ${opts.mode} mode (${sync.hostNote}); the rules are rendered anyway`,
    });
  }
  report(io, problems);
  const family = flags.ipFamily === "" ? null : flags.ipFamily as IPFamily;

  if (name === "render") {
    io.stdout(formatCommands(sync.commands.filter((c) => family === null || c.family === family)));
  } else {
    let e;
    try {
      e = explainPacket(packet!, sync, opts);
    } catch (err) {
      return usage((err as Error).message);
    }
    io.stdout(formatExplanation(e));
    if (explain.live) {
      try {
        io.stdout("\n" + await explainLive(packet!, sync, opts, e, io.runner ?? new DenoCommandRunner()));
      } catch (err) {
        io.stderr(`Error: reading this node's rules: ${(err as Error).message}\n`);
        return 1;
      }
    }
  }
  return problems.some((p) => p.severity === "error") ? 2 : 0;
}

/**
 * `explain --live`: the node's rules for the packet, traced (iptables: with the chains of either path compared;
 * nftables: with the path's objects compared; ipvs: with its virtual server, ipset entries and kube-ipvs0
 * address compared).
 */
async function explainLive(
  packet: PacketSpec,
  sync: FirstSync,
  opts: ProxyOptions,
  e: Explanation,
  runner: CommandRunner,
): Promise<string> {
  if (opts.mode === "nftables") {
    const tx = sync.commands.find((c) => c.cmd === "nft" && c.family === packet.family)?.stdin ?? "";
    const names = e.objects;
    const origin = resolveOrigin(packet, sync, opts);
    const cmp = await compareLiveNftables(
      runner,
      packet.family,
      tx,
      names,
      { dst: packet.destination, port: packet.port, proto: packet.protocol.toLowerCase() },
      tracePacket(packet, origin.src, origin.from, origin.nodeIPs),
    );
    return formatLiveNftables(cmp, packet.family);
  }
  if (opts.mode === "ipvs") {
    const names = e.objects;
    const origin = resolveOrigin(packet, sync, opts);
    const cmp = await compareLiveIpvs(
      runner,
      sync,
      packet.family,
      names,
      { dst: packet.destination, port: packet.port, proto: packet.protocol.toLowerCase() },
      tracePacket(packet, origin.src, origin.from, origin.nodeIPs),
    );
    return formatLiveIpvs(cmp);
  }
  const origin = resolveOrigin(packet, sync, opts);
  const live = await readLiveIptables(runner, packet.family);
  const cmp = compareLive(
    live.tables,
    renderedIptables(sync, packet.family),
    tracePacket(packet, origin.src, origin.from, origin.nodeIPs),
  );
  return formatLive(cmp, live.source);
}

function report(io: CommandIO, problems: readonly InputProblem[]): void {
  for (const p of problems) io.stderr(formatProblem(p) + "\n");
}

/** The model's reports of unusable Service fields, placed at their file and line. */
function invalidServiceProblems(sync: FirstSync, input: ProxyInput): InputProblem[] {
  const out: InputProblem[] = [];
  const seen = new Set<string>();
  for (const { service, reason, field } of sync.invalid) {
    const from = input.origin.get(service);
    const key = `${service.metadata?.namespace}/${service.metadata?.name}|${reason}|${field}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const consequence = /skipping it/.test(reason)
      ? "nothing is rendered for this Service"
      : /skipping the port/.test(reason)
      ? "nothing is rendered for this port"
      : "the agent ignores this value and renders the rest";
    out.push({
      severity: "error",
      at: from ? from.position(field ? parseFieldPath(field) : []) : { file: "", line: 0, col: 0 },
      object: `Service ${service.metadata?.namespace}/${service.metadata?.name}`,
      field,
      message: `${reason.replace(/; (skipping|ignoring) (it|the port)$/, "")}: ${consequence}`,
    });
  }
  return out;
}
