/**
 * The ipvs dataplane's sync cost on a real IPVS kernel, tool by tool (issue 11 must-show). Runs inside the
 * IPVS VM (the host kernel has no IPVS):
 *
 * ```sh
 * IPVS_VM_MEM=4096 bash scripts/ipvs_vm.sh run deno run -A --no-check bench/ipvs_kernel_bench.ts 1000 10000
 * ```
 *
 * For each size N: a fresh network namespace with a node address (veth), N Services × 10 endpoints in the
 * scale harness's mix (80 % ClusterIP, 10 % NodePort, 10 % LoadBalancer with an ingress IP; scripts/scale_objects.ts),
 * and an {@linkcode IpvsDataplane} exactly as the agent builds it, on a runner that times every program it
 * spawns. Measured: the first full sync on an empty kernel (its reads, then `ipset restore`, `ipvsadm -R`,
 * `iptables-restore`, `ip -batch`), a partial sync of one changed endpoint (median of 5), and a full resync
 * of the programmed kernel by a fresh dataplane (what an agent restart costs: everything read back, nothing
 * written). Prints one markdown row per sync kind and size; `--json FILE` writes the raw figures.
 * @module
 */
import { IpvsDataplane } from "../lib/dataplane/ipvs/dataplane.ts";
import { iptablesTools } from "../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../lib/dataplane/iptables_local_detector.ts";
import type { CommandResult, CommandRunner, CommandSpec } from "../lib/exec.ts";
import { configureLogging } from "../lib/log.ts";
import type { ServicePortState } from "../lib/proxy/types.ts";
import { FakeClock } from "../lib/proxy/clock.ts";
import { makeState, snapshot } from "../testkit/fixtures.ts";
import { NetnsRunner } from "../testkit/netns.ts";
import { serviceType, uniqueNodePort } from "../scripts/scale_objects.ts";

configureLogging({ sink: () => {} });

const NODE_IP = "10.250.0.2";

/** One program the dataplane ran. */
interface Call {
  tool: string;
  ms: number;
  stdinBytes: number;
}

/** Times every call of the inner runner. */
class TimingRunner implements CommandRunner {
  calls: Call[] = [];
  constructor(private readonly inner: CommandRunner) {}
  async tryRun(spec: CommandSpec): Promise<CommandResult> {
    const t0 = performance.now();
    let stdinBytes = 0;
    const { stdin } = spec;
    if (typeof stdin === "string" || stdin instanceof Uint8Array) stdinBytes = stdin.length;
    else if (stdin !== undefined) {
      // Chunks produced while the child reads: counted as they are written.
      spec = {
        ...spec,
        stdin: (function* () {
          for (const chunk of stdin) {
            stdinBytes += chunk.length;
            yield chunk;
          }
        })(),
      };
    }
    try {
      return await this.inner.tryRun(spec);
    } finally {
      // "ipvsadm -R", "ipset restore", "ip -force -batch", "iptables-save -t" (both tables), ...
      const tool = [spec.cmd, ...spec.args.slice(0, 2)].join(" ").replace(/^(iptables-save -t) \w+$/, "$1");
      this.calls.push({ tool, ms: performance.now() - t0, stdinBytes });
    }
  }
  async run(spec: CommandSpec): Promise<CommandResult> {
    const r = await this.tryRun(spec);
    if (r.code !== 0) throw new Error(`${spec.cmd} ${spec.args.join(" ")}: exit ${r.code}: ${r.stderr}`);
    return r;
  }
}

/** The scale mix: Service i with endpoints 10.128.x.y (fresh ones from `next` on change). */
function states(n: number, eps: number): ServicePortState[] {
  const out: ServicePortState[] = [];
  const ip = (a: number, b: number, k: number) => `${a}.${b + (k >> 16)}.${(k >> 8) & 255}.${k & 255}`;
  for (let i = 0; i < n; i++) {
    const type = serviceType(i);
    const e = [];
    for (let j = 0; j < eps; j++) e.push({ ip: ip(10, 128, i * eps + j + 1), port: 8080 });
    out.push(makeState({
      ns: "scale",
      name: `svc-${i}`,
      clusterIP: ip(10, 96, i + 1),
      nodePort: type === "ClusterIP" ? 0 : uniqueNodePort(i),
      lbVIPs: type === "LoadBalancer" ? [ip(198, 18, i + 1)] : [],
    }, e));
  }
  return out;
}

async function sh(args: string[]): Promise<void> {
  const out = await new Deno.Command("ip", { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) throw new Error(`ip ${args.join(" ")}: ${new TextDecoder().decode(out.stderr)}`);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor(s.length / 2)];
}

/** Per tool: total ms and bytes of one sync's calls. */
function byTool(calls: Call[]): Record<string, { ms: number; bytes: number; n: number }> {
  const out: Record<string, { ms: number; bytes: number; n: number }> = {};
  for (const c of calls) {
    const t = out[c.tool] ??= { ms: 0, bytes: 0, n: 0 };
    t.ms += c.ms;
    t.bytes += c.stdinBytes;
    t.n++;
  }
  return out;
}

interface SyncFigures {
  kind: string;
  n: number;
  wallMs: number;
  generateMs: number;
  tools: Record<string, { ms: number; bytes: number; n: number }>;
}

async function measure(n: number): Promise<SyncFigures[]> {
  const ns = `dkp-ipvsbench-${Deno.pid}-${n}`;
  await sh(["netns", "add", ns]);
  const figures: SyncFigures[] = [];
  try {
    await sh(["-n", ns, "link", "set", "lo", "up"]);
    await sh(["-n", ns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]);
    await sh(["-n", ns, "addr", "add", `${NODE_IP}/24`, "dev", "veth0"]);
    await sh(["-n", ns, "link", "set", "veth0", "up"]);
    const runner = new TimingRunner(new NetnsRunner(ns));
    const make = () =>
      new IpvsDataplane({
        family: "IPv4",
        runner,
        iptables: iptablesTools("system", "IPv4"),
        localDetector: detectLocalByCIDR("10.128.0.0/9"),
        // The drain checks run when the bench says (timed apart), not on a timer inside a measured sync.
        clock: new FakeClock(0),
        keepLastBatches: true,
      });
    const all = states(n, 10);
    const record = async (kind: string, dp: IpvsDataplane, st: ServicePortState[], changed?: string[]) => {
      runner.calls = [];
      const t0 = performance.now();
      const res = await dp.sync(snapshot(st, { nodeIPs: [NODE_IP], changed }));
      const f = {
        kind,
        n,
        wallMs: performance.now() - t0,
        generateMs: res.generateMs,
        tools: byTool(runner.calls),
      };
      figures.push(f);
      console.error(`[ipvs-bench] ${n} ${kind}: ${Math.round(f.wallMs)} ms ${JSON.stringify(f.tools)}`);
      return f;
    };
    const dp = make();
    await record("full (empty kernel)", dp, all);
    let cur = all;
    for (let k = 0; k < 5; k++) {
      // One endpoint of one Service replaced by a fresh address.
      const i = Math.floor((k + 1) * n / 7);
      const s = cur[i];
      const eps = [...s.endpoints.slice(1).map((e) => ({ ip: e.ip, port: 8080 })), {
        ip: `10.250.${k}.${i & 255}`,
        port: 8080,
      }];
      const next = cur.slice();
      next[i] = makeState({
        ns: "scale",
        name: s.info.name.name,
        clusterIP: s.info.clusterIP,
        nodePort: s.info.nodePort,
        lbVIPs: [...s.info.loadBalancerVIPs],
      }, eps);
      cur = next;
      await record("partial (one endpoint)", dp, cur, [`scale/${s.info.name.name}`]);
      // The drained real server has no connection: the drain check (-L -n of its virtual servers) deletes it.
      runner.calls = [];
      const t0 = performance.now();
      await dp.checkDraining();
      const f = {
        kind: "drain check",
        n,
        wallMs: performance.now() - t0,
        generateMs: 0,
        tools: byTool(runner.calls),
      };
      figures.push(f);
    }
    dp.stop();
    const fresh = make();
    await record("full resync (restart)", fresh, cur);
    fresh.stop();
    const wrote = fresh.lastBatches!;
    if (wrote.ipvsadm !== "" || wrote.ip !== "") {
      console.error(`[ipvs-bench] ${n}: the restart's full sync wrote:\n${wrote.ipvsadm}${wrote.ip}`);
    }
    const vs = await new NetnsRunner(ns).run({ cmd: "ipvsadm", args: ["-S", "-n"] });
    const lines = vs.stdout.split("\n");
    console.error(
      `[ipvs-bench] ${n}: kernel holds ${lines.filter((l) => l.startsWith("-A")).length} virtual servers, ` +
        `${lines.filter((l) => l.startsWith("-a")).length} real servers`,
    );
  } finally {
    await sh(["netns", "del", ns]).catch(() => {});
  }
  return figures;
}

function fmt(ms: number | undefined): string {
  if (ms === undefined || Number.isNaN(ms)) return "-";
  return ms >= 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

function kib(bytes: number | undefined): string {
  if (!bytes) return "-";
  return bytes >= 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`;
}

if (import.meta.main) {
  const args = Deno.args.filter((a) => !a.startsWith("--"));
  const jsonAt = Deno.args.indexOf("--json");
  const sizes = (args.length > 0 ? args : ["1000"]).map(Number).filter((x) => x > 0);
  const all: SyncFigures[] = [];
  for (const n of sizes) all.push(...await measure(n));
  const tools = ["ipset restore", "ipvsadm -R", "iptables-restore --noflush --counters", "ip -force -batch"];
  const reads = ["ip -j addr", "ipvsadm -S -n", "ipset save", "iptables-save -t", "ipvsadm -L -n"];
  console.log(
    "| services × 10 | sync | wall | generate | reads (ip -j addr, ipvsadm -S, ipset save, iptables-save, ipvsadm -L) | ipset restore | ipvsadm -R | iptables-restore | ip -batch |",
  );
  console.log("|---|---|---|---|---|---|---|---|---|");
  const kinds = ["full (empty kernel)", "partial (one endpoint)", "drain check", "full resync (restart)"];
  for (const n of sizes) {
    for (const kind of kinds) {
      const fs = all.filter((f) => f.n === n && f.kind === kind);
      const med = (get: (f: SyncFigures) => number | undefined) =>
        median(fs.map(get).filter((x): x is number => x !== undefined));
      const tool = (t: string) => {
        const ms = med((f) => f.tools[t]?.ms);
        return Number.isNaN(ms) ? "-" : `${fmt(ms)} (${kib(med((f) => f.tools[t]?.bytes))})`;
      };
      const readMs = reads.map((r) => fmt(med((f) => f.tools[r]?.ms))).join(", ");
      console.log(
        `| ${n} | ${kind}${fs.length > 1 ? ` (median of ${fs.length})` : ""} | ${
          fmt(med((f) => f.wallMs))
        } | ${fmt(med((f) => f.generateMs))} | ${readMs} | ${tools.map(tool).join(" | ")} |`,
      );
    }
  }
  if (jsonAt >= 0) await Deno.writeTextFile(Deno.args[jsonAt + 1], JSON.stringify(all, null, 1));
}
