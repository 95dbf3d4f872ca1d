/**
 * Scale harness (issue #6): the API server simulator with N Services × M endpoints and the real agent
 * (started with the `start` task's exact permission flags) in a throwaway node namespace with real
 * iptables (legacy or nft), churned at a fixed rate of EndpointSlice updates.
 *
 * ```sh
 * deno run -A scripts/scale.ts --services 10000 --endpoints 10 --backend legacy --churn 20 --duration 30
 * ```
 *
 * Measures, and prints as markdown table rows:
 * - start to first complete sync (agent spawn → first IPv4 "SyncProxyRules complete" with every Service);
 * - event latency from the harness's EndpointSlice write (the last-change-trigger-time it stamps) to the
 *   restore that carries the new endpoint IP being started ("handed to the kernel") and finished ("in the
 *   kernel"), found in the payload copies kept by iptables wrapper scripts; and the part of "handed" that is
 *   not the bounded-frequency wait (`start − max(event, previous restore end + minSyncPeriod)`);
 * - the agent's own kubeproxy_network_programming_duration_seconds p50/p99 (bucket upper bounds) as a
 *   cross-check;
 * - generation vs restore time and payload bytes per sync (the dataplane's -v=2 "SyncProxyRules complete"
 *   log line: generateMs, applyMs, bytes);
 * - agent VmRSS (idle after the first sync, median during churn) and VmHWM, CPU seconds per second of churn
 *   (agent utime+stime, and reaped children — iptables-restore and the wrappers — separately);
 * - iptables invocations other than the restore that start during a partial sync (should be 0).
 *
 * Must run as root. Everything happens in `dkp-scale-<pid>`, deleted afterwards, also on SIGINT/SIGTERM.
 * @module
 */
import { agentCommand } from "../testkit/agent_command.ts";
import { SimulatorProcess } from "../testkit/apiserver_process.ts";
import { usePrivateXtablesLock } from "../testkit/xtables_lock.ts";
import type { KubeObject } from "../lib/kube/types.ts";
import { IpPool, makeNode, makeService, makeSlice, TARGET_PORT } from "./scale_objects.ts";
import { type Call, NodeNamespace, parseCalls, writeWrappers } from "./scale_netns.ts";

const REPO = new URL("..", import.meta.url).pathname.replace(/\/$/, "");

/** Options of {@linkcode runScale}. */
export interface ScaleOptions {
  services: number;
  endpoints: number;
  backend: "legacy" | "nft";
  /** EndpointSlice updates per second. */
  churn: number;
  /** Seconds of churn. */
  duration: number;
  /** --iptables-min-sync-period in seconds (agent default 1). */
  minSync: number;
  /** Seconds allowed for the first complete sync. */
  timeout: number;
  /** Keep the work directory (logs, payload copies). */
  keep: boolean;
  /** Progress on stderr. */
  verbose: boolean;
}

/** A sync as logged by the dataplane (-v=2). */
export interface SyncLog {
  ts: number;
  family: string;
  full: boolean;
  bytes: number;
  generateMs: number;
  applyMs: number;
}

/** Everything one run measured. */
export interface ScaleResult {
  opts: ScaleOptions;
  namespace: string;
  workdir: string;
  firstSyncS: number | null;
  fullSyncs: SyncLog[];
  partialSyncs: SyncLog[];
  events: number;
  resolved: number;
  handedMs: number[];
  inKernelMs: number[];
  overheadMs: number[];
  metricP50: number | null;
  metricP99: number | null;
  metricCount: number;
  rssIdleMiB: number | null;
  rssChurnMiB: number | null;
  hwmMiB: number | null;
  cpuPerS: number;
  childCpuPerS: number;
  /** iptables calls other than the restore (and the canary poll) that started during a partial sync. */
  callsDuringPartial: Call[];
  /** Canary polls that happened to start during a partial sync. */
  canaryDuringPartial: number;
  callsDuringChurn: Record<string, number>;
  programmedServices: number;
  restoreFailures: number;
  syncErrors: string[];
}

/** Percentile (nearest rank) of an unsorted list; null when empty. */
export function percentile(xs: readonly number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

/** Quantile of a Prometheus histogram as the upper bound of the bucket it falls in. */
export function histogramQuantile(metrics: string, name: string, q: number): { v: number | null; n: number } {
  const buckets: [number, number][] = [];
  const re = new RegExp(`^${name}_bucket\\{[^}]*le="([^"]+)"[^}]*\\} (\\S+)$`, "gm");
  for (const m of metrics.matchAll(re)) {
    if (!m[0].includes('ip_family="IPv4"')) continue;
    buckets.push([m[1] === "+Inf" ? Infinity : Number(m[1]), Number(m[2])]);
  }
  buckets.sort((a, b) => a[0] - b[0]);
  const n = buckets.at(-1)?.[1] ?? 0;
  if (n === 0) return { v: null, n };
  for (const [le, c] of buckets) if (c >= q * n) return { v: le, n };
  return { v: Infinity, n };
}

function readProc(
  pid: number,
): { rssKiB: number; hwmKiB: number; cpuTicks: number; childTicks: number } | null {
  try {
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // Fields after the comm: state(3) ... utime(14) stime(15) cutime(16) cstime(17) → indexes 11..14 here.
    return {
      rssKiB: Number(status.match(/VmRSS:\s+(\d+)/)?.[1] ?? 0),
      hwmKiB: Number(status.match(/VmHWM:\s+(\d+)/)?.[1] ?? 0),
      cpuTicks: Number(f[11]) + Number(f[12]),
      childTicks: Number(f[13]) + Number(f[14]),
    };
  } catch {
    return null;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const MiB = 1024 * 1024;

/** Runs one scale scenario and tears everything down. */
export async function runScale(opts: ScaleOptions): Promise<ScaleResult> {
  const say = (m: string) => opts.verbose && console.error(`[scale ${new Date().toISOString()}] ${m}`);
  if (Deno.uid() !== 0) throw new Error("the scale harness needs root (network namespaces, iptables)");
  usePrivateXtablesLock(); // its namespace's tables are its own: so is their lock
  const workdir = await Deno.makeTempDir({ prefix: "dkp-scale-" });
  const ns = await NodeNamespace.create(opts.backend);
  let sim: SimulatorProcess | null = null;
  let agent: Deno.ChildProcess | null = null;
  const onSignal = () => {
    void (async () => {
      try {
        agent?.kill("SIGKILL");
      } catch { /* gone */ }
      await sim?.close().catch(() => {});
      await ns.destroy();
      Deno.exit(130);
    })();
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  try {
    say(`namespace ${ns.name}, workdir ${workdir}`);
    const wr = await writeWrappers(workdir);

    // 1. Simulator and objects.
    sim = await SimulatorProcess.start({ netns: ns.name });
    await sim.upsert(makeNode("node1", ns.nodeIP));
    const pool = new IpPool();
    const ips: string[][] = [];
    const t0 = Date.now();
    const CHUNK = 2000;
    for (let i = 0; i < opts.services; i += CHUNK) {
      const svcs: KubeObject[] = [];
      for (let k = i; k < Math.min(opts.services, i + CHUNK); k++) svcs.push(makeService(k));
      await sim.upsertMany("services", svcs);
    }
    for (let i = 0; i < opts.services; i += CHUNK) {
      const slices: KubeObject[] = [];
      for (let k = i; k < Math.min(opts.services, i + CHUNK); k++) {
        ips[k] = Array.from({ length: opts.endpoints }, () => pool.take());
        slices.push(makeSlice(k, ips[k], null));
      }
      await sim.upsertMany("endpointslices", slices);
    }
    say(`loaded ${opts.services} services × ${opts.endpoints} endpoints in ${Date.now() - t0} ms`);

    // 2. Agent.
    const cmd = agentCommand([
      "--kubeconfig",
      sim.kubeconfig,
      "--hostname-override",
      "node1",
      "--v=2",
      "--logging-format=json",
      "--conntrack-max-per-core=0",
      "--metrics-bind-address=127.0.0.1:10249",
      `--iptables-min-sync-period=${opts.minSync}s`,
    ]);
    const spawnedAt = Date.now();
    agent = new Deno.Command("ip", {
      args: ["netns", "exec", ns.name, ...cmd],
      cwd: REPO,
      env: { PATH: `${wr.bin}:${Deno.env.get("PATH")}`, NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const pid = agent.pid;
    const syncs: SyncLog[] = [];
    const proxierSyncs: { ts: number; elapsedMs: number; full: boolean; numServices: number }[] = [];
    const syncErrors: string[] = [];
    const logFile = await Deno.open(`${workdir}/agent.log`, { write: true, create: true });
    const logDone = (async () => {
      let buf = "";
      const enc = new TextEncoder();
      for await (const chunk of agent!.stderr.pipeThrough(new TextDecoderStream())) {
        await logFile.write(enc.encode(chunk));
        buf += chunk;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.startsWith("{")) continue;
          let r: Record<string, unknown>;
          try {
            r = JSON.parse(line);
          } catch {
            continue;
          }
          const ts = (r.ts as number) * 1000;
          if (r.msg === "SyncProxyRules complete" && "bytes" in r) {
            syncs.push({
              ts,
              family: String(r.ipFamily),
              full: r.full as boolean,
              bytes: r.bytes as number,
              generateMs: r.generateMs as number,
              applyMs: r.applyMs as number,
            });
          } else if (r.msg === "SyncProxyRules complete" && "numServices" in r && r.ipFamily === "IPv4") {
            proxierSyncs.push({
              ts,
              elapsedMs: parseFloat(String(r.elapsed)) * 1000,
              full: r.full as boolean,
              numServices: r.numServices as number,
            });
          } else if (r.err !== undefined) {
            syncErrors.push(`${r.msg}: ${r.err ?? ""}`.slice(0, 300));
          }
        }
      }
      logFile.close();
    })();
    let exited = false;
    void agent.status.then(() => (exited = true));

    // 3. Sampler.
    const rss: { t: number; kib: number }[] = [];
    const sampler = setInterval(() => {
      const p = readProc(pid);
      if (p) rss.push({ t: Date.now(), kib: p.rssKiB });
    }, 250);

    try {
      // 4. First complete sync.
      let firstSyncS: number | null = null;
      const deadline = spawnedAt + opts.timeout * 1000;
      while (Date.now() < deadline && !exited) {
        const s = proxierSyncs.find((s) => s.numServices >= opts.services);
        if (s) {
          firstSyncS = (s.ts - spawnedAt) / 1000;
          break;
        }
        await sleep(200);
      }
      if (firstSyncS === null) {
        throw new Error(`no complete first sync within ${opts.timeout}s (exited=${exited})`);
      }
      say(`first complete sync after ${firstSyncS.toFixed(2)} s`);
      await sleep(3000);
      const idle = rss.filter((s) => s.t > Date.now() - 2000).map((s) => s.kib);

      // 5. Churn.
      interface Ev {
        t: number;
        ip: string;
        slot: string;
        handed?: number;
        inKernel?: number;
        overhead?: number;
      }
      const events: Ev[] = [];
      const total = Math.round(opts.churn * opts.duration);
      const cpu0 = readProc(pid)!;
      const churnStart = Date.now();
      say(`churn: ${total} updates at ${opts.churn}/s`);
      for (let k = 0; k < total; k++) {
        const due = churnStart + (k * 1000) / opts.churn;
        const wait = due - Date.now();
        if (wait > 0) await sleep(wait);
        const i = Math.floor(Math.random() * opts.services);
        const j = Math.floor(Math.random() * opts.endpoints);
        const ip = pool.take();
        ips[i][j] = ip;
        const t = Date.now();
        events.push({ t, ip, slot: `${i}/${j}` });
        await sim.upsert(makeSlice(i, ips[i], t));
      }
      const churnEnd = Date.now();
      const cpu1 = readProc(pid)!;
      const churnRss = rss.filter((s) => s.t >= churnStart && s.t <= churnEnd).map((s) => s.kib);
      say(`churn done in ${((churnEnd - churnStart) / 1000).toFixed(1)} s; waiting for the last updates`);

      // 6. Match events to restore payloads.
      const scanned = new Set<string>();
      const restoreEnds: number[] = [];
      const drainDeadline = Date.now() + Math.max(60_000, opts.timeout * 1000 / 4);
      const minSyncMs = opts.minSync * 1000;
      while (true) {
        const calls = parseCalls(await Deno.readTextFile(wr.log), wr.payloads);
        const restores = calls.filter((c) => c.file !== null && c.end !== null);
        for (const c of restores) {
          if (scanned.has(c.file!)) continue;
          scanned.add(c.file!);
          if (!c.name.startsWith("iptables") || c.rc !== 0) continue;
          const text = await Deno.readTextFile(c.file!).catch(() => "");
          const prevEnd = Math.max(
            -Infinity,
            ...restores.filter((r) => r.end! <= c.start).map((r) => r.end!),
          );
          const resolvedSlots = new Map<string, number>();
          for (const e of events) {
            if (e.handed !== undefined || e.t > c.start) continue;
            if (text.includes(`--to-destination ${e.ip}:${TARGET_PORT}`)) resolvedSlots.set(e.slot, e.t);
          }
          // An event is resolved by this payload when it, or a later update of the same endpoint, is in it.
          for (const e of events) {
            if (e.handed !== undefined || e.t > c.start) continue;
            const upto = resolvedSlots.get(e.slot);
            if (upto === undefined || e.t > upto) continue;
            e.handed = c.start - e.t;
            e.inKernel = c.end! - e.t;
            e.overhead = c.start - Math.max(e.t, prevEnd + minSyncMs);
          }
          if (!opts.keep) await Deno.remove(c.file!).catch(() => {});
        }
        for (const c of restores) restoreEnds.push(c.end!);
        if (events.every((e) => e.handed !== undefined) || Date.now() > drainDeadline || exited) break;
        await sleep(500);
      }
      const resolved = events.filter((e) => e.handed !== undefined);
      say(`${resolved.length}/${events.length} updates found in restore payloads`);

      // 7. Metrics, kernel state and call log.
      const metrics = await ns.exec("curl", ["-s", "http://127.0.0.1:10249/metrics"]).catch(() => "");
      const p50 = histogramQuantile(metrics, "kubeproxy_network_programming_duration_seconds", 0.5);
      const p99 = histogramQuantile(metrics, "kubeproxy_network_programming_duration_seconds", 0.99);
      const restoreFailures = Number(
        metrics.match(/^kubeproxy_sync_proxy_rules_iptables_restore_failures_total\{[^}]*IPv4[^}]*\} (\S+)/m)
          ?.[1] ?? 0,
      );
      const nat = await ns.exec(`iptables-${opts.backend}-save`, ["-t", "nat"]);
      const programmed = new Set<string>();
      for (const m of nat.matchAll(/^-A KUBE-SERVICES .*--comment "?scale\/(svc-\d+):? cluster IP/gm)) {
        programmed.add(m[1]);
      }
      if (programmed.size === 0) {
        // Large-cluster mode drops comments: count the ClusterIP dispatch rules instead.
        for (const m of nat.matchAll(/^-A KUBE-SERVICES -d (10\.(?:9[6-9]|1[01]\d)\.\d+\.\d+)\/32 /gm)) {
          programmed.add(m[1]);
        }
      }
      const calls = parseCalls(await Deno.readTextFile(wr.log), wr.payloads);
      const partialWindows = proxierSyncs.filter((s) => !s.full).map((s) => [s.ts - s.elapsedMs, s.ts]);
      const inPartial = (c: Call) =>
        !c.name.endsWith("-restore") && partialWindows.some(([a, b]) => c.start >= a && c.start <= b);
      // The external-flush poll (`-t mangle -S KUBE-PROXY-CANARY`, every syncPeriod on its own timer, as
      // upstream's iptables Monitor) is not part of a sync; it is reported apart when it overlaps one.
      const isCanary = (c: Call) => c.args.includes("KUBE-PROXY-CANARY");
      const callsDuringPartial = calls.filter((c) => inPartial(c) && !isCanary(c));
      const canaryDuringPartial = calls.filter((c) => inPartial(c) && isCanary(c)).length;
      const callsDuringChurn: Record<string, number> = {};
      for (const c of calls) {
        if (c.start < churnStart || c.start > churnEnd) continue;
        callsDuringChurn[c.name] = (callsDuringChurn[c.name] ?? 0) + 1;
      }
      const hwm = readProc(pid)?.hwmKiB ?? null;
      const med = (xs: number[]) => percentile(xs, 50);
      const churnS = (churnEnd - churnStart) / 1000;
      const ticks = 100; // CLK_TCK
      const v4 = syncs.filter((s) => s.family === "IPv4");
      return {
        opts,
        namespace: ns.name,
        workdir,
        firstSyncS,
        fullSyncs: v4.filter((s) => s.full),
        partialSyncs: v4.filter((s) => !s.full && s.ts >= churnStart),
        events: events.length,
        resolved: resolved.length,
        handedMs: resolved.map((e) => e.handed!),
        inKernelMs: resolved.map((e) => e.inKernel!),
        overheadMs: resolved.map((e) => e.overhead!),
        metricP50: p50.v,
        metricP99: p99.v,
        metricCount: p99.n,
        rssIdleMiB: idle.length ? med(idle)! / 1024 : null,
        rssChurnMiB: churnRss.length ? med(churnRss)! / 1024 : null,
        hwmMiB: hwm === null ? null : hwm / 1024,
        cpuPerS: (cpu1.cpuTicks - cpu0.cpuTicks) / ticks / churnS,
        childCpuPerS: (cpu1.childTicks - cpu0.childTicks) / ticks / churnS,
        callsDuringPartial,
        canaryDuringPartial,
        callsDuringChurn,
        programmedServices: programmed.size,
        restoreFailures,
        syncErrors,
      };
    } finally {
      clearInterval(sampler);
      try {
        agent.kill("SIGTERM");
      } catch { /* gone */ }
      const killer = setTimeout(() => {
        try {
          agent?.kill("SIGKILL");
        } catch { /* gone */ }
      }, 10_000);
      await agent.status;
      clearTimeout(killer);
      await logDone.catch(() => {});
    }
  } finally {
    await sim?.close().catch(() => {});
    await ns.destroy();
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    if (!opts.keep) await Deno.remove(workdir, { recursive: true }).catch(() => {});
  }
}

const f = (v: number | null | undefined, d = 0) => (v === null || v === undefined ? "–" : v.toFixed(d));

/** Header of the markdown table written by {@linkcode markdownRow}. */
export const TABLE_HEADER = [
  "| svc × eps | backend | churn/s × s | first sync s | full: MiB / gen ms / apply ms | partial syncs: n / KiB med / gen ms med (max) / apply ms med (p99) | handed p50 / p99 ms | in kernel p50 / p99 ms | beyond minSync p50 / p99 ms | metric p50 / p99 s | RSS idle / churn / HWM MiB | CPU s/s agent + children | other iptables calls in partial syncs (+ canary poll overlaps) | programmed |",
  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
].join("\n");

/** One markdown table row for a result. */
export function markdownRow(r: ScaleResult): string {
  const o = r.opts;
  const full = r.fullSyncs[0];
  const ps = r.partialSyncs;
  const gens = ps.map((s) => s.generateMs);
  const cells = [
    `${o.services} × ${o.endpoints}`,
    o.backend,
    `${o.churn} × ${o.duration}`,
    f(r.firstSyncS, 1),
    full ? `${f(full.bytes / MiB, 1)} / ${f(full.generateMs)} / ${f(full.applyMs)}` : "–",
    `${ps.length} / ${f(percentile(ps.map((s) => s.bytes / 1024), 50))} / ${f(percentile(gens, 50), 1)} (${
      f(gens.length ? Math.max(...gens) : null, 1)
    }) / ${f(percentile(ps.map((s) => s.applyMs), 50))} (${f(percentile(ps.map((s) => s.applyMs), 99))})`,
    `${f(percentile(r.handedMs, 50))} / ${f(percentile(r.handedMs, 99))}`,
    `${f(percentile(r.inKernelMs, 50))} / ${f(percentile(r.inKernelMs, 99))}`,
    `${f(percentile(r.overheadMs, 50))} / ${f(percentile(r.overheadMs, 99))}`,
    `≤${f(r.metricP50, 2)} / ≤${f(r.metricP99, 2)}`,
    `${f(r.rssIdleMiB)} / ${f(r.rssChurnMiB)} / ${f(r.hwmMiB)}`,
    `${f(r.cpuPerS, 2)} + ${f(r.childCpuPerS, 2)}`,
    `${r.callsDuringPartial.length} (+${r.canaryDuringPartial} canary poll)`,
    `${r.programmedServices}/${o.services} (${r.resolved}/${r.events} updates seen)`,
  ];
  return `| ${cells.join(" | ")} |`;
}

function parseArgs(args: string[]): ScaleOptions & { json: string } {
  const o = {
    services: 1000,
    endpoints: 10,
    backend: "legacy" as "legacy" | "nft",
    churn: 20,
    duration: 30,
    minSync: 1,
    timeout: 900,
    keep: false,
    verbose: true,
    json: "",
  };
  for (let i = 0; i < args.length; i++) {
    const [k, inline] = args[i].replace(/^--/, "").split("=", 2);
    const val = () => inline ?? args[++i];
    switch (k) {
      case "services":
      case "endpoints":
      case "churn":
      case "duration":
      case "min-sync":
      case "timeout":
        o[k === "min-sync" ? "minSync" : k] = Number(val());
        break;
      case "backend": {
        const b = val();
        if (b !== "legacy" && b !== "nft") throw new Error(`--backend must be legacy or nft, not ${b}`);
        o.backend = b;
        break;
      }
      case "keep":
        o.keep = true;
        break;
      case "quiet":
        o.verbose = false;
        break;
      case "json":
        o.json = val();
        break;
      default:
        throw new Error(
          `unknown flag ${
            args[i]
          }; flags: --services N --endpoints M --backend legacy|nft --churn R --duration S --min-sync S --timeout S --keep --quiet --json FILE`,
        );
    }
  }
  return o;
}

if (import.meta.main) {
  const o = parseArgs(Deno.args);
  const r = await runScale(o);
  if (o.json) {
    await Deno.writeTextFile(
      o.json,
      JSON.stringify({ ...r, callsDuringPartial: r.callsDuringPartial }, null, 1),
    );
  }
  if (r.syncErrors.length) console.error(`agent errors/failures logged:\n  ${r.syncErrors.join("\n  ")}`);
  if (r.callsDuringPartial.length) {
    console.error(
      "iptables calls during partial syncs:",
      r.callsDuringPartial.map((c) => `${c.name} ${c.args}`),
    );
  }
  console.error("calls during churn:", JSON.stringify(r.callsDuringChurn));
  console.log(TABLE_HEADER);
  console.log(markdownRow(r));
}
