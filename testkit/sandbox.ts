/**
 * A sandbox of network namespaces for the dataplane tests (DESIGN.md, testing layer 3).
 *
 * ```
 *   client ns                      node ns                               pod namespaces
 *  ┌──────────────┐ veth  ┌──────────────────────────────┐ veth   ┌────────────────────┐
 *  │ eth0         ├───────┤ eth0 192.168.77.1 (node IP)  │  ┌─────┤ eth0 10.244.0.2/32 │ pod-a
 *  │ 192.168.77.2 │       │ br0  10.244.0.1/24 ──────────┼──┤     └────────────────────┘
 *  │ default via  │       │ default via 192.168.77.2     │  └─────┤ eth0 10.244.0.3/32 │ pod-b
 *  │  node IP     │       │ ip_forward=1, agent runs here│        └────────────────────┘
 *  └──────────────┘       └──────────────────────────────┘
 * ```
 *
 * Everything lives in namespaces this module creates; the host (root) namespace is never touched:
 * veth pairs are created from inside the node namespace straight into their peer namespace, and
 * sysctls are set with `ip netns exec NODE sysctl -w ...`.
 *
 * **Why pods have /32 addresses.** The host kernel has no `br_netfilter` module (it is neither
 * loaded nor installed: there is no `/lib/modules`, and we must not load modules into the host), so
 * frames bridged between two pods would never reach iptables, and pod→ClusterIP→other-pod replies
 * would bypass conntrack's reverse NAT. Every pod therefore gets a /32 address and a default route
 * via the bridge IP (`onlink`): all pod traffic, even to a pod on the same bridge, is routed by the
 * node namespace and crosses its netfilter hooks, as in routed CNIs (Calico-style). ICMP redirects
 * are switched off in the node namespace so that pods keep sending through it. When the kernel does
 * have `net.bridge.bridge-nf-call-iptables`, it is also set to 1 inside the node namespace.
 *
 * **Known limit: hairpin.** A pod reaching itself through a Service (pod → ClusterIP → same pod) does
 * not work in this routed layout: after DNAT in nat PREROUTING the kernel drops the packet (source ==
 * destination, same interface) before the FORWARD hook, so kube-proxy's hairpin masquerade in POSTROUTING
 * never runs (traced with `nft monitor trace`; accept_local/rp_filter/send_redirects made no difference).
 * Real clusters hairpin at L2 (bridge `hairpin_mode` plus br_netfilter), which this host lacks. Tests
 * therefore use a pod that is not an endpoint as the in-cluster client.
 *
 * **Optional IPv6 (dual stack).** `Sandbox.create({ ipv6: true })` adds a second family on the same links:
 * br0 `fd00:10:244::1/64`, pods `fd00:10:244::<n>/128` (default route via the bridge IP, `onlink`, as for
 * IPv4), node eth0 `fd00:77::1/64`, client eth0 `fd00:77::2/64`, IPv6 forwarding in the node namespace,
 * and default routes both ways as for IPv4. Every IPv6 address is added with `nodad` so that it is usable at
 * once (no Duplicate Address Detection wait), and the node namespace has DAD off altogether (see
 * `#nodeIPv6Sysctls`). Pods do not accept ICMPv6 redirects: IPv6 has no
 * `send_redirects` switch, and a redirect would let pods talk to each other at L2 around the node's
 * netfilter (and its reverse NAT). Without `ipv6` nothing IPv6 is configured, as before.
 *
 * iptables in the sandbox uses a private lock file (`XTABLES_LOCKFILE`, ./xtables_lock.ts), not the host-wide
 * `/run/xtables.lock`.
 *
 * Namespace names are `dkp-<pid>-<n>-<role>`; {@linkcode cleanupStale} removes those whose creating
 * process is gone, and every live sandbox is removed from unload/SIGINT/SIGTERM handlers.
 * @module
 */

import { type CommandResult, DenoCommandRunner } from "../lib/exec.ts";
import { Probe } from "./probe.ts";
import { usePrivateXtablesLock } from "./xtables_lock.ts";

/** Prefix shared by every namespace a sandbox creates. */
export const NETNS_PREFIX = "dkp-";

/** Options of {@linkcode Sandbox.create}. */
export interface SandboxOptions {
  /** Pods to create at once, by name (IPs are allocated from the pod subnet). */
  pods?: string[];
  /** First three octets of the node's /24 pod subnet; the bridge gets `.1`. Default `10.244.0`. */
  podNet?: string;
  /** The node's IP on the client link. Default `192.168.77.1`. */
  nodeIP?: string;
  /** The outside client's IP. Default `192.168.77.2`. */
  clientIP?: string;
  /** More client addresses on the same link (for source-range tests), in the node IP's /24. */
  extraClientIPs?: string[];
  /** Also configure IPv6 (dual stack) on every link; see the module doc. Default false. */
  ipv6?: boolean;
  /** With `ipv6`: the /64 prefix of the node's IPv6 pod subnet, ending in `::`. Default `fd00:10:244::`. */
  podNet6?: string;
  /** With `ipv6`: the node's IPv6 address on the client link (/64). Default `fd00:77::1`. */
  nodeIP6?: string;
  /** With `ipv6`: the outside client's IPv6 address. Default `fd00:77::2`. */
  clientIP6?: string;
}

/** One pod namespace. */
export interface PodInfo {
  /** The name given to addPod (also the pod-server name by default). */
  readonly name: string;
  /** Network namespace name. */
  readonly ns: string;
  readonly ip: string;
  /** The pod's IPv6 address (/128) in an `ipv6` sandbox; undefined otherwise. */
  readonly ip6?: string;
}

/** Options of {@linkcode Sandbox.spawn}. */
export interface SpawnOptions {
  /** Give the child a stdin pipe (default: no stdin). */
  stdin?: boolean;
  /** Hand stdout to the caller unread; otherwise stdout is collected into `output` with stderr. */
  rawStdout?: boolean;
}

/** A long-running process started inside a namespace; killed with its namespace or the sandbox. */
export class SandboxProcess {
  #output = "";
  #watchers: (() => void)[] = [];
  /** Resolves with the exit status. */
  readonly status: Promise<Deno.CommandStatus>;

  constructor(readonly ns: string, readonly child: Deno.ChildProcess, rawStdout: boolean) {
    this.status = child.status;
    const pump = async (stream: ReadableStream<Uint8Array>) => {
      try {
        for await (const text of stream.pipeThrough(new TextDecoderStream())) {
          this.#output += text;
          // Keep the last 4 MiB: the agent may log a lot at -v=4.
          if (this.#output.length > 4 << 20) this.#output = this.#output.slice(-(2 << 20));
          for (const w of this.#watchers.splice(0)) w();
        }
      } catch { /* process killed */ }
    };
    pump(child.stderr);
    if (!rawStdout) pump(child.stdout);
  }

  /** Collected stdout (unless raw) and stderr so far. */
  get output(): string {
    return this.#output;
  }

  /** The process id (the program itself: `ip netns exec` execs into it). */
  get pid(): number {
    return this.child.pid;
  }

  /**
   * Resolves when the collected output matches `pattern` (searched from `fromOffset`, e.g. a
   * previous `output.length`); rejects after `timeoutMs` or when the process exits first.
   */
  waitForOutput(pattern: RegExp | string, timeoutMs = 10_000, fromOffset = 0): Promise<string> {
    const test = (): string | undefined => {
      const text = this.#output.slice(fromOffset);
      if (typeof pattern === "string") return text.includes(pattern) ? pattern : undefined;
      return pattern.exec(text)?.[0];
    };
    return new Promise((resolve, reject) => {
      let done = false;
      const timer = setTimeout(() => {
        done = true;
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${pattern}; output:\n${this.tail()}`));
      }, timeoutMs);
      const check = () => {
        if (done) return;
        const m = test();
        if (m !== undefined) {
          done = true;
          clearTimeout(timer);
          resolve(m);
        } else this.#watchers.push(check);
      };
      this.status.then((s) => {
        if (done) return;
        // Give the pumps a moment to deliver the last output.
        setTimeout(() => {
          if (done) return;
          const m = test();
          done = true;
          clearTimeout(timer);
          if (m !== undefined) resolve(m);
          else {reject(
              new Error(`process exited (code ${s.code}) before ${pattern}; output:\n${this.tail()}`),
            );}
        }, 50);
      });
      check();
    });
  }

  /** The last `chars` characters of output, for failure messages. */
  tail(chars = 3000): string {
    return this.#output.slice(-chars);
  }

  /** Sends a signal (default SIGTERM); ignores a process that is already gone. */
  kill(signal: Deno.Signal = "SIGTERM"): void {
    try {
      this.child.kill(signal);
    } catch { /* gone */ }
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status. */
  async stop(graceMs = 3000): Promise<Deno.CommandStatus> {
    this.kill("SIGTERM");
    const timer = setTimeout(() => this.kill("SIGKILL"), graceMs);
    try {
      return await this.status;
    } finally {
      clearTimeout(timer);
    }
  }
}

let sandboxCounter = 0;
const liveSandboxes = new Set<Sandbox>();
let handlersInstalled = false;

function onSignal(signal: "SIGINT" | "SIGTERM"): () => void {
  return () => {
    destroyAllSync();
    Deno.exit(signal === "SIGINT" ? 130 : 143);
  };
}
const sigint = onSignal("SIGINT");
const sigterm = onSignal("SIGTERM");
const onUnload = () => destroyAllSync();

function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  globalThis.addEventListener("unload", onUnload);
  Deno.addSignalListener("SIGINT", sigint);
  Deno.addSignalListener("SIGTERM", sigterm);
}

function removeHandlers(): void {
  if (!handlersInstalled || liveSandboxes.size > 0) return;
  handlersInstalled = false;
  globalThis.removeEventListener("unload", onUnload);
  Deno.removeSignalListener("SIGINT", sigint);
  Deno.removeSignalListener("SIGTERM", sigterm);
}

function destroyAllSync(): void {
  for (const sb of [...liveSandboxes]) sb.destroySync();
}

function runSync(cmd: string, args: string[]): { code: number; stdout: string } {
  try {
    const out = new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "null" }).outputSync();
    return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
  } catch {
    return { code: 127, stdout: "" };
  }
}

/** Kills every process still inside namespace `ns`, then deletes it (synchronously, best effort). */
function deleteNetnsSync(ns: string): void {
  const pids = runSync("ip", ["netns", "pids", ns]).stdout.split(/\s+/).filter(Boolean).map(Number);
  for (const pid of pids) {
    try {
      Deno.kill(pid, "SIGKILL");
    } catch { /* gone */ }
  }
  runSync("ip", ["netns", "del", ns]);
}

/** Names of all network namespaces, from `ip netns list`. */
export function listNetns(): string[] {
  return runSync("ip", ["netns", "list"]).stdout.split("\n").map((l) => l.split(" ")[0]).filter(Boolean);
}

function pidAlive(pid: number): boolean {
  try {
    Deno.statSync(`/proc/${pid}`);
    return true;
  } catch {
    return false;
  }
}

/**
 * Removes namespaces left by crashed runs: every `dkp-<pid>-...` namespace whose creating process is
 * gone (processes inside are killed first). Returns the names removed.
 */
export function cleanupStale(): string[] {
  const removed: string[] = [];
  for (const ns of listNetns()) {
    const m = /^dkp-(\d+)-/.exec(ns);
    if (!m) continue;
    const pid = Number(m[1]);
    if (pid === Deno.pid || pidAlive(pid)) continue;
    deleteNetnsSync(ns);
    removed.push(ns);
  }
  return removed;
}

/**
 * Why the sandbox cannot run here (not root, or a required tool is missing), or undefined when it
 * can. Tests pass this to `Deno.test({ ignore })` so that a skip is explicit, never a silent pass.
 */
export function sandboxUnavailableReason(
  tools: string[] = ["ip", "iptables", "conntrack", "sysctl"],
): string | undefined {
  if (Deno.build.os !== "linux") return "network namespaces need Linux";
  try {
    if (Deno.uid() !== 0) return "network namespace tests need root";
  } catch {
    return "cannot read the uid (run with --allow-sys)";
  }
  for (const tool of tools) {
    const { code } = runSync(tool, tool === "ip" ? ["-V"] : ["--version"]);
    if (code === 127) return `${tool} is not installed`;
  }
  return undefined;
}

/** The sandbox: a node namespace with a bridge, pod namespaces, and an outside client namespace. */
export class Sandbox {
  /** `dkp-<pid>-<n>-`: the prefix of every namespace of this sandbox. */
  readonly prefix: string;
  /** The node namespace (where the agent and its iptables rules live). */
  readonly node: string;
  /** The outside client namespace. */
  readonly client: string;
  /** The node's IP on the client link (the node's InternalIP). */
  readonly nodeIP: string;
  /** The client's main IP. */
  readonly clientIP: string;
  /** Extra client IPs (same namespace, same link). */
  readonly extraClientIPs: readonly string[];
  /** The bridge's IP in the node namespace: every pod's gateway. */
  readonly bridgeIP: string;
  /** The node's pod subnet, e.g. `10.244.0.0/24`. */
  readonly podCIDR: string;
  /** Live pods by name. */
  readonly pods = new Map<string, PodInfo>();
  /** True when net.bridge.bridge-nf-call-iptables exists (br_netfilter loaded) and was set to 1. */
  bridgeNetfilter = false;
  /** True when the sandbox was created with `ipv6: true`. */
  readonly ipv6: boolean;
  /** The node's IPv6 address on the client link (its IPv6 InternalIP); undefined without `ipv6`. */
  readonly nodeIP6: string | undefined;
  /** The client's IPv6 address; undefined without `ipv6`. */
  readonly clientIP6: string | undefined;
  /** The bridge's IPv6 address: every pod's IPv6 gateway; undefined without `ipv6`. */
  readonly bridgeIP6: string | undefined;
  /** The node's IPv6 pod subnet, e.g. `fd00:10:244::/64`; undefined without `ipv6`. */
  readonly podCIDR6: string | undefined;

  #runner = new DenoCommandRunner();
  #podNet: string;
  #podNet6: string;
  #namespaces: string[] = [];
  #processes = new Set<SandboxProcess>();
  #probes = new Map<string, Probe>();
  #nextPodIndex = 2;
  #vethIndex = 0;
  #destroyed = false;

  private constructor(opts: SandboxOptions) {
    this.prefix = `${NETNS_PREFIX}${Deno.pid}-${sandboxCounter++}-`;
    this.node = this.prefix + "node";
    this.client = this.prefix + "client";
    this.nodeIP = opts.nodeIP ?? "192.168.77.1";
    this.clientIP = opts.clientIP ?? "192.168.77.2";
    this.extraClientIPs = opts.extraClientIPs ?? [];
    this.#podNet = opts.podNet ?? "10.244.0";
    this.bridgeIP = `${this.#podNet}.1`;
    this.podCIDR = `${this.#podNet}.0/24`;
    this.ipv6 = opts.ipv6 ?? false;
    this.#podNet6 = opts.podNet6 ?? "fd00:10:244::";
    this.nodeIP6 = this.ipv6 ? opts.nodeIP6 ?? "fd00:77::1" : undefined;
    this.clientIP6 = this.ipv6 ? opts.clientIP6 ?? "fd00:77::2" : undefined;
    this.bridgeIP6 = this.ipv6 ? `${this.#podNet6}1` : undefined;
    this.podCIDR6 = this.ipv6 ? `${this.#podNet6}/64` : undefined;
  }

  /** Creates the node and client namespaces (and `opts.pods`). Removes stale sandboxes first. */
  static async create(opts: SandboxOptions = {}): Promise<Sandbox> {
    // Every iptables call in the sandbox (the agent's, the tests') uses a private lock, inherited.
    usePrivateXtablesLock();
    cleanupStale();
    const sb = new Sandbox(opts);
    liveSandboxes.add(sb);
    installHandlers();
    try {
      await sb.#setup();
      for (const name of opts.pods ?? []) await sb.addPod(name);
    } catch (err) {
      await sb.destroy();
      throw err;
    }
    return sb;
  }

  async #addNetns(ns: string): Promise<void> {
    await this.#runner.run({ cmd: "ip", args: ["netns", "add", ns] });
    this.#namespaces.push(ns);
    await this.ip(ns, "link", "set", "lo", "up");
  }

  async #setup(): Promise<void> {
    await this.#addNetns(this.node);
    await this.#addNetns(this.client);
    // Redirects off before br0 exists so that br0 inherits "default".
    await this.exec(this.node, "sysctl", [
      "-q",
      "-w",
      "net.ipv4.ip_forward=1",
      "net.ipv4.conf.all.send_redirects=0",
      "net.ipv4.conf.default.send_redirects=0",
      "net.ipv4.conf.all.rp_filter=0",
      "net.ipv4.conf.default.rp_filter=0",
    ]);
    const bnf = await this.tryExec(this.node, "sysctl", ["-q", "-w", "net.bridge.bridge-nf-call-iptables=1"]);
    this.bridgeNetfilter = bnf.code === 0;
    if (this.ipv6) await this.#nodeIPv6Sysctls();

    // A fixed MAC: otherwise the bridge takes its lowest port's MAC, which changes when pods come and
    // go, and pods would keep sending to the stale gateway MAC from their neighbour cache.
    await this.ip(this.node, "link", "add", "br0", "address", "02:00:0a:f4:00:01", "type", "bridge");
    await this.ip(this.node, "addr", "add", `${this.bridgeIP}/24`, "dev", "br0");
    await this.ip(this.node, "link", "set", "br0", "up");

    // The client link: node eth0 <-> client eth0, created from inside the node namespace.
    await this.ip(
      this.node,
      "link",
      "add",
      "eth0",
      "type",
      "veth",
      "peer",
      "name",
      "eth0",
      "netns",
      this.client,
    );
    await this.ip(this.node, "addr", "add", `${this.nodeIP}/24`, "dev", "eth0");
    await this.ip(this.node, "link", "set", "eth0", "up");
    await this.ip(this.client, "addr", "add", `${this.clientIP}/24`, "dev", "eth0");
    for (const extra of this.extraClientIPs) {
      await this.ip(this.client, "addr", "add", `${extra}/24`, "dev", "eth0");
    }
    await this.ip(this.client, "link", "set", "eth0", "up");
    // The client sends everything (service, pod, LB and external IPs) to the node; the node's
    // default route points back at the client, which does not forward (ip_forward stays 0).
    await this.ip(this.client, "route", "add", "default", "via", this.nodeIP, "dev", "eth0");
    await this.ip(this.node, "route", "add", "default", "via", this.clientIP, "dev", "eth0");
    if (this.ipv6) await this.#setupIPv6();
  }

  /**
   * IPv6 sysctls of the node namespace, set before its links exist so that they inherit "default": no
   * DAD at all (also for the link-local addresses: while br0's was tentative, the first packet forwarded to
   * a pod waited ~2 s for neighbour discovery), and forwarding.
   */
  async #nodeIPv6Sysctls(): Promise<void> {
    await this.exec(this.node, "sysctl", [
      "-q",
      "-w",
      "net.ipv6.conf.all.disable_ipv6=0",
      "net.ipv6.conf.default.disable_ipv6=0",
      "net.ipv6.conf.all.accept_dad=0",
      "net.ipv6.conf.default.accept_dad=0",
      "net.ipv6.conf.all.forwarding=1",
    ]);
    await this.tryExec(this.node, "sysctl", ["-q", "-w", "net.bridge.bridge-nf-call-ip6tables=1"]);
  }

  /** The IPv6 half of {@linkcode #setup}, on the links it created (see the module doc). */
  async #setupIPv6(): Promise<void> {
    await this.ip(this.node, "-6", "addr", "add", `${this.bridgeIP6}/64`, "dev", "br0", "nodad");
    await this.ip(this.node, "-6", "addr", "add", `${this.nodeIP6}/64`, "dev", "eth0", "nodad");
    await this.ip(this.client, "-6", "addr", "add", `${this.clientIP6}/64`, "dev", "eth0", "nodad");
    await this.ip(this.client, "-6", "route", "add", "default", "via", this.nodeIP6!, "dev", "eth0");
    await this.ip(this.node, "-6", "route", "add", "default", "via", this.clientIP6!, "dev", "eth0");
  }

  /** Runs `ip <args>` inside `ns` (`ip -n`). Rejects on failure. */
  async ip(ns: string, ...args: string[]): Promise<CommandResult> {
    return await this.#runner.run({ cmd: "ip", args: ["-n", ns, ...args], timeoutMs: 10_000 });
  }

  /** Runs a program inside `ns` (`ip netns exec`); rejects with CommandError on a non-zero exit. */
  async exec(
    ns: string,
    cmd: string,
    args: string[] = [],
    stdin?: string,
    timeoutMs = 30_000,
  ): Promise<CommandResult> {
    return await this.#runner.run({ cmd: "ip", args: ["netns", "exec", ns, cmd, ...args], stdin, timeoutMs });
  }

  /** Like {@linkcode exec} but resolves whatever the exit code. */
  async tryExec(
    ns: string,
    cmd: string,
    args: string[] = [],
    stdin?: string,
    timeoutMs = 30_000,
  ): Promise<CommandResult> {
    return await this.#runner.tryRun({
      cmd: "ip",
      args: ["netns", "exec", ns, cmd, ...args],
      stdin,
      timeoutMs,
    });
  }

  /** Starts a long-running program inside `ns`; it is killed by removePod (for its ns) and destroy. */
  spawn(ns: string, cmd: string, args: string[], opts: SpawnOptions = {}): SandboxProcess {
    if (this.#destroyed) throw new Error("sandbox destroyed");
    const child = new Deno.Command("ip", {
      args: ["netns", "exec", ns, cmd, ...args],
      stdin: opts.stdin ? "piped" : "null",
      stdout: "piped",
      stderr: "piped",
      // No update check: Deno would try DNS from inside the namespaces.
      env: { NO_COLOR: "1", DENO_NO_UPDATE_CHECK: "1" },
    }).spawn();
    const proc = new SandboxProcess(ns, child, opts.rawStdout ?? false);
    this.#processes.add(proc);
    proc.status.finally(() => this.#processes.delete(proc));
    return proc;
  }

  /** Runs a Deno program inside `ns` with `-A` (test helpers, not the agent). */
  spawnDeno(ns: string, script: string, args: string[], opts: SpawnOptions = {}): SandboxProcess {
    return this.spawn(ns, Deno.execPath(), ["run", "-A", "--no-check", script, ...args], opts);
  }

  /**
   * Starts testkit/pod_server.ts in `ns` (a pod's namespace, or `node` for hostNetwork) and
   * waits until it listens. `name` defaults to the pod's name.
   */
  async startServer(
    ns: string,
    opts: { name?: string; tcp?: number[]; udp?: number[]; bind?: string } = {},
  ): Promise<SandboxProcess> {
    const pod = [...this.pods.values()].find((p) => p.ns === ns);
    const name = opts.name ?? pod?.name ?? ns;
    const args = ["--name", name];
    for (const p of opts.tcp ?? []) args.push("--tcp", String(p));
    for (const p of opts.udp ?? []) args.push("--udp", String(p));
    if (opts.bind) args.push("--bind", opts.bind);
    const script = new URL("./pod_server.ts", import.meta.url).pathname;
    const proc = this.spawnDeno(ns, script, args);
    // A bound on a hang, not a speed check: a Deno process's start took ~30 s in the emulated IPVS VM beside a
    // CPU hog (issue 20), and a pod server that never starts fails here after 2 minutes.
    await proc.waitForOutput(/^ready$/m, 120_000);
    return proc;
  }

  /** The traffic probe of namespace `ns` (started on first use, reused afterwards). */
  async probe(ns: string): Promise<Probe> {
    let probe = this.#probes.get(ns);
    if (!probe) {
      probe = new Probe((cmd, args) => this.spawn(ns, cmd, args, { stdin: true, rawStdout: true }).child);
      this.#probes.set(ns, probe);
    }
    await probe.ready();
    return probe;
  }

  /**
   * Adds a pod namespace attached to the bridge; `ip` defaults to the next free address. In an `ipv6`
   * sandbox the pod also gets an IPv6 address: `ip6`, or `<podNet6><n>` with `n` the IPv4 address's last
   * octet in hex (e.g. 10.244.0.3 and fd00:10:244::3, 10.244.0.10 and fd00:10:244::a).
   */
  async addPod(name: string, ip?: string, ip6?: string): Promise<PodInfo> {
    if (this.pods.has(name)) throw new Error(`pod ${name} exists`);
    if (!/^[a-z0-9][a-z0-9-]{0,30}$/.test(name)) throw new Error(`bad pod name ${name}`);
    const addr = ip ?? `${this.#podNet}.${this.#nextPodIndex++}`;
    const hostNumber = Number(addr.split(".").at(-1));
    const addr6 = this.ipv6 ? ip6 ?? `${this.#podNet6}${hostNumber.toString(16)}` : undefined;
    const ns = this.prefix + name;
    await this.#addNetns(ns);
    const veth = `vp${this.#vethIndex++}`;
    await this.ip(this.node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns);
    await this.ip(this.node, "link", "set", veth, "master", "br0", "up");
    await this.ip(ns, "addr", "add", `${addr}/32`, "dev", "eth0");
    await this.ip(ns, "link", "set", "eth0", "up");
    await this.ip(ns, "route", "add", "default", "via", this.bridgeIP, "dev", "eth0", "onlink");
    if (addr6 !== undefined) {
      await this.exec(ns, "sysctl", [
        "-q",
        "-w",
        "net.ipv6.conf.all.disable_ipv6=0",
        "net.ipv6.conf.all.accept_redirects=0",
        "net.ipv6.conf.eth0.accept_redirects=0",
      ]);
      await this.ip(ns, "-6", "addr", "add", `${addr6}/128`, "dev", "eth0", "nodad");
      await this.ip(ns, "-6", "route", "add", "default", "via", this.bridgeIP6!, "dev", "eth0", "onlink");
    }
    const pod: PodInfo = addr6 === undefined ? { name, ns, ip: addr } : { name, ns, ip: addr, ip6: addr6 };
    this.pods.set(name, pod);
    return pod;
  }

  /** The pod named `name`; throws when unknown. */
  pod(name: string): PodInfo {
    const p = this.pods.get(name);
    if (!p) throw new Error(`no pod ${name}`);
    return p;
  }

  /** Kills the pod's processes and deletes its namespace (its veth goes with it). */
  async removePod(name: string): Promise<void> {
    const pod = this.pods.get(name);
    if (!pod) return;
    this.pods.delete(name);
    await this.#killIn(pod.ns);
    // Delete the veth pair first, synchronously: `ip netns del` only drops the name, and the kernel tears
    // the namespace down later, so for a moment its stack (server gone) still answered SYNs with RST.
    await this.#runner.tryRun({ cmd: "ip", args: ["-n", pod.ns, "link", "del", "eth0"] });
    await this.#runner.tryRun({ cmd: "ip", args: ["netns", "del", pod.ns] });
    this.#namespaces = this.#namespaces.filter((n) => n !== pod.ns);
  }

  async #killIn(ns: string | undefined): Promise<void> {
    const probes = [...this.#probes].filter(([n]) => ns === undefined || n === ns);
    for (const [n, probe] of probes) {
      this.#probes.delete(n);
      await probe.close();
    }
    const procs = [...this.#processes].filter((p) => ns === undefined || p.ns === ns);
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.status.catch(() => {})));
  }

  /** Kills every process and deletes every namespace of this sandbox. Idempotent. */
  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    this.#destroyed = true;
    await this.#killIn(undefined);
    for (const ns of this.#namespaces.reverse()) deleteNetnsSync(ns);
    this.#namespaces = [];
    this.pods.clear();
    liveSandboxes.delete(this);
    removeHandlers();
  }

  /** Synchronous destroy for unload and signal handlers. Idempotent. */
  destroySync(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    for (const p of this.#processes) p.kill("SIGKILL");
    for (const ns of this.#namespaces.reverse()) deleteNetnsSync(ns);
    this.#namespaces = [];
    this.pods.clear();
    liveSandboxes.delete(this);
  }

  /** Lets `await using sb = await Sandbox.create()` destroy the sandbox at scope exit. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.destroy();
  }
}
