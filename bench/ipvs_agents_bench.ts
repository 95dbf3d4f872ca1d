/**
 * The agent and upstream kube-proxy (the test kit's release, v1.37.2) in ipvs mode, end to end on a real IPVS
 * kernel, one after the other in the same VM run (issue 11 must-show). Runs inside the IPVS VM:
 *
 * ```sh
 * IPVS_VM_MEM=4096 IPVS_VM_TIMEOUT=5400 bash scripts/ipvs_vm.sh run \
 *   deno run -A --no-check bench/ipvs_agents_bench.ts --sizes 1000,10000 --agents ours,upstream --changes 5
 * ```
 *
 * For each size N and agent: a fresh node namespace (veth with the node IP 10.250.0.2, the nft backend hint)
 * holding the API server simulator with N Services × 10 endpoints (scripts/scale_objects.ts: 80 % ClusterIP,
 * 10 % NodePort, 10 % LoadBalancer, node ports unique) and the agent with its defaults for the ipvs mode
 * (`--ipvs-min-sync-period` 0, as upstream's default; sync period 30 s), JSON logs. Upstream runs with
 * `--kube-api-content-type=application/json --feature-gates=WatchListClient=false` (the simulator speaks JSON
 * and plain list+watch). Measured:
 *
 * - **start → all virtual servers in the kernel**: agent spawn to the first poll of `/proc/net/ip_vs` (every
 *   `--poll` s) that shows every virtual server and every real server.
 * - **start → first sync complete**: to the agent's first sync-complete log line: for upstream that is
 *   when its ipsets are filled too (it adds them one `ipset add` process per entry, after the virtual servers).
 * - **one endpoint changed → in the kernel**: the harness replaces one endpoint of one Service (fresh IP) and
 *   takes the time of the first sync-complete log line after which `ipvsadm -L -n -t VIP:80` shows the new
 *   real server (ours: the dataplane's `SyncProxyRules complete`, written once `ipvsadm -R` has exited;
 *   upstream: `syncProxyRules complete`, -v=4, written at the end of its full sync). The log line comes after
 *   the kernel write, so the figure is an upper bound, the same way for both.
 * - VmRSS / VmHWM of the agent at the end, and for ours the per-sync generate / apply / bytes of the log line.
 * - With `--memory-detail`: what that RSS is made of ({@linkcode rssComposition} of `/proc/PID/smaps`) and the
 *   runtime's own heap figures from the agent's `/metrics` (ours: V8 heap used / total; upstream: Go heap in
 *   use / from the OS), read at the end and again after 60 s without changes.
 *
 * Prints markdown rows; `--json FILE` writes the raw figures.
 * @module
 */
import { SimulatorProcess } from "../testkit/apiserver_process.ts";
import { agentCommand } from "../testkit/agent_command.ts";
import { k8sBinary } from "../testkit/kube_apiserver.ts";
import type { KubeObject } from "../lib/kube/types.ts";
import { IpPool, makeNode, makeService, makeSlice, serviceType } from "../scripts/scale_objects.ts";
import { NodeNamespace } from "../scripts/scale_netns.ts";

const NODE = "node1";
const NODE_IP = "10.250.0.2";
const EPS = 10;

interface Options {
  sizes: number[];
  agents: ("ours" | "upstream")[];
  changes: number;
  pollS: number;
  timeoutS: number;
  json?: string;
  /** Directory for each agent's log (`<agent>-<n>.log`, one JSON record per line). */
  logs?: string;
  /** Report what the RSS is made of (`--memory-detail`). */
  memoryDetail: boolean;
}

function parseArgs(args: string[]): Options {
  const o: Options = {
    sizes: [1000],
    agents: ["ours", "upstream"],
    changes: 5,
    pollS: 1,
    timeoutS: 3600,
    memoryDetail: false,
  };
  for (let i = 0; i < args.length; i++) {
    const v = args[i + 1];
    switch (args[i]) {
      case "--sizes":
        o.sizes = v.split(",").map(Number);
        i++;
        break;
      case "--agents":
        o.agents = v.split(",") as Options["agents"];
        i++;
        break;
      case "--changes":
        o.changes = Number(v);
        i++;
        break;
      case "--poll":
        o.pollS = Number(v);
        i++;
        break;
      case "--timeout":
        o.timeoutS = Number(v);
        i++;
        break;
      case "--json":
        o.json = v;
        i++;
        break;
      case "--logs":
        o.logs = v;
        i++;
        break;
      case "--memory-detail":
        o.memoryDetail = true;
        break;
      default:
        throw new Error(`unknown argument ${args[i]}`);
    }
  }
  return o;
}

/** What the kernel of the namespace holds: virtual and real servers (`/proc/net/ip_vs`). */
async function kernelCounts(ns: NodeNamespace): Promise<{ vs: number; rs: number }> {
  const text = await ns.exec("cat", ["/proc/net/ip_vs"]);
  let vs = 0, rs = 0;
  for (const line of text.split("\n")) {
    if (/^(TCP|UDP|SCTP) /.test(line)) vs++;
    else if (line.startsWith("  -> ") && !line.includes("RemoteAddress")) rs++;
  }
  return { vs, rs };
}

/** A running agent whose JSON log lines are collected with the time they arrived. */
class Agent {
  readonly lines: { at: number; rec: Record<string, unknown> }[] = [];
  readonly child: Deno.ChildProcess;
  readonly #done: Promise<void>;
  #waiters: (() => void)[] = [];

  constructor(ns: string, cmd: string[]) {
    this.child = new Deno.Command("ip", {
      args: ["netns", "exec", ns, ...cmd],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const pump = async (s: ReadableStream<Uint8Array>) => {
      let buf = "";
      for await (const text of s.pipeThrough(new TextDecoderStream())) {
        buf += text;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.startsWith("{")) continue;
          try {
            this.lines.push({ at: Date.now(), rec: JSON.parse(line) });
          } catch { /* not a log record */ }
          for (const w of this.#waiters.splice(0)) w();
        }
      }
    };
    this.#done = Promise.all([pump(this.child.stdout), pump(this.child.stderr)]).then(() => {});
  }

  /** The first record from index `from` on that matches, waiting up to `timeoutMs`. */
  async waitFor(
    match: (r: Record<string, unknown>) => boolean,
    from: number,
    timeoutMs: number,
  ): Promise<{ index: number; ts: number; rec: Record<string, unknown> }> {
    const deadline = Date.now() + timeoutMs;
    while (true) {
      for (let i = from; i < this.lines.length; i++) {
        const l = this.lines[i];
        // The agent's own timestamp: seconds (ours, as klog's JSON) or milliseconds (component-base's zap).
        const ts = Number(l.rec.ts);
        if (match(l.rec)) return { index: i, ts: !ts ? l.at : ts > 1e11 ? ts : ts * 1000, rec: l.rec };
      }
      from = Math.max(from, this.lines.length);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out waiting for a log line; last lines:\n${this.tail()}`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, Math.min(left, 1000));
        this.#waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
  }

  tail(n = 15): string {
    return this.lines.slice(-n).map((l) => JSON.stringify(l.rec)).join("\n");
  }

  /** VmRSS and VmHWM in MiB of the agent process (`ip netns exec` execs into it). */
  memory(): { rssMiB: number; hwmMiB: number } {
    const status = Deno.readTextFileSync(`/proc/${this.child.pid}/status`);
    const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
    return { rssMiB: kb("VmRSS") / 1024, hwmMiB: kb("VmHWM") / 1024 };
  }

  async stop(): Promise<void> {
    try {
      this.child.kill("SIGTERM");
    } catch { /* gone */ }
    const t = setTimeout(() => {
      try {
        this.child.kill("SIGKILL");
      } catch { /* gone */ }
    }, 15_000);
    await this.child.status;
    clearTimeout(t);
    await this.#done.catch(() => {});
  }
}

/** Resident MiB of one process by kind of mapping (`/proc/PID/smaps`). */
export interface RssComposition {
  /** File-backed pages: the executable, shared libraries, caches mapped from files. */
  file: number;
  /** `[heap]`: the main thread's malloc arena (brk). */
  brk: number;
  /**
   * Anonymous mappings of at most 256 KiB: V8 reserves its regular heap pages as 256 KiB chunks (most of the
   * V8 heap of ours; the Go runtime maps its heap in 64 MiB arenas, so upstream has few of these).
   */
  anonSmall: number;
  /** Larger anonymous mappings: other threads' malloc arenas, large objects, the Go heap's arenas, stacks. */
  anonLarge: number;
  /** The whole resident set (the sum of the four). */
  total: number;
}

/** Sums the `Rss:` lines of `/proc/PID/smaps` by {@linkcode RssComposition} kind. */
export function rssComposition(smaps: string): RssComposition {
  const c: RssComposition = { file: 0, brk: 0, anonSmall: 0, anonLarge: 0, total: 0 };
  let kind: keyof RssComposition | null = null;
  for (const line of smaps.split("\n")) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ (\d+)\s*(.*)$/.exec(line);
    if (head) {
      const kib = (parseInt(head[2], 16) - parseInt(head[1], 16)) / 1024;
      const name = head[4];
      kind = name === "[heap]"
        ? "brk"
        : head[3] !== "0" || name.startsWith("/")
        ? "file"
        : kib <= 256
        ? "anonSmall"
        : "anonLarge";
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss && kind) {
      c[kind] += Number(rss[1]) / 1024;
      c.total += Number(rss[1]) / 1024;
    }
  }
  return c;
}

/** The runtime's heap figures in MiB from the agent's `/metrics` (scraped inside its namespace). */
async function runtimeHeap(ns: NodeNamespace, agent: Options["agents"][number]): Promise<string> {
  const text = await ns.exec("busybox", ["wget", "-qO-", "http://127.0.0.1:10249/metrics"]).catch(() => "");
  const g = (name: string) => {
    const v = Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
    return (v / 1048576).toFixed(1);
  };
  return agent === "ours"
    ? `V8 heap used / total ${g("denokubeproxy_v8_heap_used_bytes")} / ${
      g("denokubeproxy_v8_heap_total_bytes")
    }`
    : `Go heap in use / from the OS ${g("go_memstats_heap_inuse_bytes")} / ${
      g("go_memstats_heap_sys_bytes")
    }`;
}

/** The log line that ends a sync, per agent. */
const SYNC_DONE: Record<Options["agents"][number], (r: Record<string, unknown>) => boolean> = {
  // The ipvs dataplane's line (after the kernel programs ran), IPv4.
  ours: (r) => r.msg === "SyncProxyRules complete" && r.ipFamily === "IPv4" && "virtualServers" in r,
  upstream: (r) => r.msg === "syncProxyRules complete" && r.ipFamily !== "IPv6",
};

/** The same for the IPv6 family. */
const SYNC_DONE_V6: Record<Options["agents"][number], (r: Record<string, unknown>) => boolean> = {
  ours: (r) => r.msg === "SyncProxyRules complete" && r.ipFamily === "IPv6" && "virtualServers" in r,
  upstream: (r) => r.msg === "syncProxyRules complete" && r.ipFamily === "IPv6",
};

function command(agent: Options["agents"][number], kubeconfig: string): string[] {
  if (agent === "ours") {
    return agentCommand([
      "--kubeconfig",
      kubeconfig,
      "--hostname-override",
      NODE,
      "--proxy-mode=ipvs",
      "--conntrack-max-per-core=0",
      "--logging-format=json",
      "-v=2",
    ]);
  }
  return [
    k8sBinary("kube-proxy"),
    `--kubeconfig=${kubeconfig}`,
    `--hostname-override=${NODE}`,
    "--proxy-mode=ipvs",
    "--conntrack-max-per-core=0",
    "--logging-format=json",
    "--kube-api-content-type=application/json",
    "--feature-gates=WatchListClient=false",
    "-v=4",
  ];
}

/** What one (size, agent) run measured. */
interface RunFigures {
  agent: string;
  n: number;
  expected: { vs: number; rs: number };
  /** Spawn → first /proc/net/ip_vs poll with everything, ms. */
  allProgrammedMs: number;
  /** Spawn → first sync-complete log line, ms. */
  firstSyncLogMs: number;
  /** Per change: write → sync-complete log line, ms; and whether ipvsadm -L -n showed the new real server. */
  changes: { ms: number; verified: boolean; generateMs?: number; applyMs?: number; bytes?: number }[];
  rssMiB: number;
  hwmMiB: number;
  /** With `--memory-detail`: the composition and heap figures at the end and 60 s later. */
  memory?: { label: string; rss: RssComposition; heap: string }[];
}

async function runOne(agent: Options["agents"][number], n: number, o: Options): Promise<RunFigures> {
  const ns = await NodeNamespace.create("nft", NODE_IP);
  let sim: SimulatorProcess | undefined;
  let proc: Agent | undefined;
  try {
    sim = await SimulatorProcess.start({ netns: ns.name });
    const pool = new IpPool();
    const endpoints: string[][] = [];
    const services: KubeObject[] = [];
    const slices: KubeObject[] = [];
    for (let i = 0; i < n; i++) {
      const ips = Array.from({ length: EPS }, () => pool.take());
      endpoints.push(ips);
      services.push(makeService(i, { uniqueNodePorts: true }));
      slices.push(makeSlice(i, ips, null));
    }
    await sim.upsert(makeNode(NODE, NODE_IP));
    await sim.upsertMany("services", services);
    await sim.upsertMany("endpointslices", slices);
    // One virtual server per ClusterIP, plus the node IP for NodePort/LB, plus the LB ingress IP.
    let vs = 0;
    for (let i = 0; i < n; i++) vs += { ClusterIP: 1, NodePort: 2, LoadBalancer: 3 }[serviceType(i)];
    const expected = { vs, rs: vs * EPS };
    const log = (m: string) => console.error(`[ipvs-agents ${agent} ${n}] ${m}`);

    const t0 = Date.now();
    proc = new Agent(ns.name, command(agent, sim.kubeconfig));
    const firstLog = proc.waitFor(SYNC_DONE[agent], 0, o.timeoutS * 1000);
    let allProgrammedMs = NaN;
    let exited = false;
    proc.child.status.then(() => exited = true);
    while (Date.now() - t0 < o.timeoutS * 1000) {
      if (exited) throw new Error(`${agent} exited:\n${proc.tail()}`);
      const c = await kernelCounts(ns);
      if (c.vs === expected.vs && c.rs === expected.rs) {
        allProgrammedMs = Date.now() - t0;
        break;
      }
      await new Promise((r) => setTimeout(r, o.pollS * 1000));
    }
    if (Number.isNaN(allProgrammedMs)) {
      throw new Error(`not all programmed in ${o.timeoutS} s:\n${proc.tail()}`);
    }
    const first = await firstLog;
    log(`all ${expected.vs} virtual / ${expected.rs} real servers after ${allProgrammedMs} ms`);
    // The node is dual-stack: the IPv6 family's first (full) sync follows the IPv4 one and reads the whole
    // IPVS table too. Changes start once it is done and the agent has been quiet for 3 s.
    const v6 = await proc.waitFor(SYNC_DONE_V6[agent], first.index + 1, o.timeoutS * 1000).catch(() => null);
    log(`IPv6 first sync ${v6 ? `after ${Math.round(v6.ts - t0)} ms` : "not seen"}`);
    let from = proc.lines.length;
    while (true) {
      await new Promise((r) => setTimeout(r, 3000));
      if (!proc.lines.slice(from).some((l) => SYNC_DONE[agent](l.rec) || SYNC_DONE_V6[agent](l.rec))) break;
      from = proc.lines.length;
    }

    const changes: RunFigures["changes"] = [];
    for (let k = 0; k < o.changes; k++) {
      const i = Math.floor((k + 0.5) * n / o.changes);
      const fresh = pool.take();
      endpoints[i] = [...endpoints[i].slice(1), fresh];
      from = proc.lines.length;
      const wrote = Date.now();
      await sim.upsert(makeSlice(i, endpoints[i], wrote));
      const vip = (services[i] as unknown as { spec: { clusterIP: string } }).spec.clusterIP;
      // The first sync-complete line after which the kernel shows the new real server (a sync that was
      // already running when the change arrived ends without it).
      let done;
      let verified = false;
      for (let tries = 0; tries < 5 && !verified; tries++) {
        done = await proc.waitFor(SYNC_DONE[agent], from, o.timeoutS * 1000);
        from = done.index + 1;
        const listed = await ns.exec("ipvsadm", ["-L", "-n", "-t", `${vip}:80`]);
        verified = listed.includes(` ${fresh}:8080 `);
      }
      const rec = done!.rec;
      changes.push({
        ms: done!.ts - wrote,
        verified,
        ...(agent === "ours"
          ? { generateMs: Number(rec.generateMs), applyMs: Number(rec.applyMs), bytes: Number(rec.bytes) }
          : {}),
      });
      log(`change ${k + 1}: ${Math.round(done!.ts - wrote)} ms${verified ? "" : " (NOT in ipvsadm -L -n)"}`);
      // Let a sync that the change may have queued behind finish before the next change.
      await new Promise((r) => setTimeout(r, agent === "ours" ? 1500 : 3000));
    }
    const mem = proc.memory();
    const memory: RunFigures["memory"] = [];
    for (const label of o.memoryDetail ? ["at the end", "60 s later"] : []) {
      if (label !== "at the end") await new Promise((r) => setTimeout(r, 60_000));
      const rss = rssComposition(Deno.readTextFileSync(`/proc/${proc.child.pid}/smaps`));
      memory.push({ label, rss, heap: await runtimeHeap(ns, agent) });
    }
    return {
      agent,
      n,
      expected,
      allProgrammedMs,
      firstSyncLogMs: first.ts - t0,
      changes,
      rssMiB: mem.rssMiB,
      hwmMiB: mem.hwmMiB,
      ...(o.memoryDetail ? { memory } : {}),
    };
  } finally {
    await proc?.stop();
    if (proc && o.logs) {
      const text = proc.lines.map((l) => JSON.stringify({ at: l.at, ...l.rec })).join("\n") + "\n";
      await Deno.writeTextFile(`${o.logs}/${agent}-${n}.log`, text).catch(() => {});
    }
    await sim?.close().catch(() => {});
    await ns.destroy();
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

function fmt(ms: number): string {
  if (Number.isNaN(ms)) return "-";
  return ms >= 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

if (import.meta.main) {
  const o = parseArgs(Deno.args);
  const all: RunFigures[] = [];
  for (const n of o.sizes) {
    for (const agent of o.agents) {
      try {
        all.push(await runOne(agent, n, o));
      } catch (err) {
        console.error(`[ipvs-agents ${agent} ${n}] failed: ${(err as Error).message}`);
      }
      if (o.json) await Deno.writeTextFile(o.json, JSON.stringify(all, null, 1));
    }
  }
  console.log(
    "| services × 10 | agent | virtual / real servers | start → all virtual and real servers in the kernel | start → first sync complete | endpoint change → in the kernel (median, max of n) | RSS / HWM (MiB) |",
  );
  console.log("|---|---|---|---|---|---|---|");
  for (const f of all) {
    const ms = f.changes.map((c) => c.ms);
    const unverified = f.changes.filter((c) => !c.verified).length;
    console.log(
      `| ${f.n} | ${f.agent} | ${f.expected.vs} / ${f.expected.rs} | ${fmt(f.allProgrammedMs)} | ${
        fmt(f.firstSyncLogMs)
      } | ${fmt(median(ms))}, ${fmt(Math.max(...ms))} (n=${ms.length}${
        unverified ? `, ${unverified} never visible` : ""
      }) | ${Math.round(f.rssMiB)} / ${Math.round(f.hwmMiB)} |`,
    );
  }
  if (o.memoryDetail) {
    console.log(
      "\n| services × 10 | agent | when | RSS | file-backed | [heap] (main malloc) | anonymous ≤ 256 KiB | larger anonymous | the runtime's heap (MiB) |",
    );
    console.log("|---|---|---|---|---|---|---|---|---|");
    for (const f of all) {
      for (const m of f.memory ?? []) {
        const r = m.rss;
        const x = (v: number) => v.toFixed(1);
        console.log(
          `| ${f.n} | ${f.agent} | ${m.label} | ${x(r.total)} | ${x(r.file)} | ${x(r.brk)} | ${
            x(r.anonSmall)
          } | ${x(r.anonLarge)} | ${m.heap} |`,
        );
      }
    }
  }
  for (const n of o.sizes) {
    const ours = all.find((f) => f.n === n && f.agent === "ours");
    const up = all.find((f) => f.n === n && f.agent === "upstream");
    if (!ours || !up) continue;
    const r = (a: number, b: number) => (b / a).toFixed(1);
    console.log(
      `ratios at ${n} (upstream / ours): start → all in the kernel ${
        r(ours.allProgrammedMs, up.allProgrammedMs)
      }×, ` +
        `endpoint change ${r(median(ours.changes.map((c) => c.ms)), median(up.changes.map((c) => c.ms)))}×`,
    );
  }
  for (const f of all.filter((f) => f.agent === "ours")) {
    console.log(
      `ours at ${f.n}, per change: generate ${f.changes.map((c) => c.generateMs).join(", ")} ms; apply ${
        f.changes.map((c) => c.applyMs).join(", ")
      } ms; bytes ${f.changes.map((c) => c.bytes).join(", ")}`,
    );
    // The agent's own share of a change, as the scale harness reports it for the other modes (the ipvs mode's
    // minSyncPeriod is 0): from the change written to the API to the sync-complete line, less the tools' time.
    const share = f.changes.map((c) => Math.round(c.ms - (c.applyMs ?? 0)));
    console.log(
      `ours at ${f.n}, the agent's share per change (change → sync complete, less the tools): ${
        share.join(", ")
      } ms (median ${fmt(median(share))}, max ${fmt(Math.max(...share))})`,
    );
  }
}
