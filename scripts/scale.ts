/**
 * Scale harness (issues #6, #10 and #13): the API server simulator with N Services × M endpoints and an agent in
 * a throwaway node namespace with real iptables (legacy or nft backend) or real nftables, churned at a fixed rate
 * of EndpointSlice updates and Service additions. Runs this agent and upstream kube-proxy on the same generated
 * state in one invocation, alternating, and reports each figure for both and their ratio.
 *
 * ```sh
 * deno run -A scripts/scale.ts --agents ours,upstream --runs 3 --services 10000 --endpoints 10 --backend legacy
 * deno run -A scripts/scale.ts --agents ours,upstream --runs 3 --services 1000 --endpoints 10 --mode nftables
 * ```
 *
 * Every figure is measured from outside, the same way for both agents: iptables (and in the nftables mode `nft`)
 * wrapper scripts first in the agent's PATH log each invocation (ns timestamps, exit code) and keep each restore
 * payload or `nft -f -` transaction. What a mode's payloads look like is in scale_probe.ts; "restore" below is an
 * `nft -f -` transaction in the nftables mode.
 * - first full sync: agent spawn → exit of the first successful IPv4 restore that holds every Service's
 *   cluster-IP rule (nftables: its `service-ips` element); and the bare `iptables-restore` (`nft -f`) time of that
 *   same payload into a fresh namespace;
 * - RSS after settling (median over the last 2 s of `--settle` seconds after the first sync, default 40: V8 gives
 *   memory back about 30 s after a burst), during churn
 *   (median) and peak (VmHWM), from /proc; CPU seconds per second of churn (agent, and reaped children);
 * - event → kernel latency for endpoint changes (the restore that carries `--to-destination <new IP>:8080`,
 *   nftables `<new IP> . 8080` in a service chain's numgen map, or `dnat to <new IP>:8080`) and for added Services (the restore that carries the new cluster IP's
 *   `-j KUBE-SVC-` rule, nftables its `service-ips` element): handed to the kernel (restore start), in the kernel
 *   (restore exit), and beyond minSyncPeriod (`start − max(event, previous restore end + minSyncPeriod)`, the
 *   agent's own share; and the same up to the restore's exit, the agent's share plus the kernel tool's), with the
 *   time other calls of the agent's (listings) took within that share;
 * - partial restores during churn (count, size, duration).
 * This agent also logs its generation time per sync (-v=2), reported as an extra.
 *
 * Must run as root. Everything happens in `dkp-scale-<pid>[-k]` namespaces, deleted afterwards (also on
 * SIGINT/SIGTERM).
 * @module
 */
import { SimulatorProcess } from "../testkit/apiserver_process.ts";
import { readLines } from "../lib/exec.ts";
import { usePrivateXtablesLock } from "../testkit/xtables_lock.ts";
import type { KubeObject } from "../lib/kube/types.ts";
import { IpPool, makeNode, makeService, makeSlice, seededRandom } from "./scale_objects.ts";
import { type Call, NodeNamespace, parseCalls, sh, writeWrappers } from "./scale_netns.ts";
import { AGENT_NAMES, agentCommand, type AgentName, type Backend, type ScaleMode } from "./scale_agents.ts";
import { kernelProbe, type Prelude } from "./scale_probe.ts";

/** Options of {@linkcode runScale}. */
export interface ScaleOptions {
  services: number;
  endpoints: number;
  mode: ScaleMode;
  backend: Backend;
  /** Agents to run, in this order within each run. */
  agents: AgentName[];
  /** Runs of every agent (alternating). */
  runs: number;
  /** EndpointSlice updates per second. */
  churn: number;
  /** Services added per second during the churn. */
  serviceAdds: number;
  /** Seconds of churn. */
  duration: number;
  /** --iptables-min-sync-period in seconds. */
  minSync: number;
  /** Seconds to let the agent settle after its first sync before measuring RSS and churning. */
  settle: number;
  /** Seconds allowed for the first complete sync. */
  timeout: number;
  /** Measure the bare iptables-restore time of the first full payload. */
  bareRestore: boolean;
  /** Seed of the churn sequence (the same for every agent of a run). */
  seed: number;
  /** Keep the work directories (logs, payload copies). */
  keep: boolean;
  /**
   * nftables mode: time the changes by `nft monitor` in the agent's namespace (each committed transaction, when
   * its generation line arrives) instead of by the nft wrapper's log, for every agent of the run alike. Needed
   * for `ours-netlink`, whose changes run no nft; "handed to kernel" is then the same as "in kernel".
   */
  monitor: boolean;
  /** Progress on stderr. */
  verbose: boolean;
  upstreamBinary?: string;
}

/** An event and when the kernel got it. */
interface Ev {
  t: number;
  handed?: number;
  inKernel?: number;
  overhead?: number;
  overheadInKernel?: number;
  applyMs?: number;
  otherCallsMs?: number;
}

/** What one run of one agent measured. */
export interface AgentRun {
  agent: AgentName;
  run: number;
  /** Spawn → exit of the first restore with every Service, in seconds. */
  firstSyncS: number | null;
  firstPayloadBytes: number | null;
  /** The same payload restored alone into a fresh namespace, in seconds. */
  bareRestoreS: number | null;
  rssSettledMiB: number | null;
  rssChurnMiB: number | null;
  hwmMiB: number | null;
  cpuPerS: number;
  childCpuPerS: number;
  endpointEvents: number;
  endpointResolved: number;
  endpointHandedMs: number[];
  endpointInKernelMs: number[];
  endpointOverheadMs: number[];
  serviceEvents: number;
  serviceResolved: number;
  serviceInKernelMs: number[];
  serviceOverheadMs: number[];
  /** Added Services: event (or previous restore end + minSync) → exit of the restore carrying it. */
  serviceOverheadInKernelMs: number[];
  /** Added Services: duration of the restore (nft -f) carrying it. */
  serviceApplyMs: number[];
  /** Added Services: time of the agent's other calls (listings) within its share before the restore started. */
  serviceOtherCallsMs: number[];
  /** Successful IPv4 restores that started during the churn: bytes and duration. */
  partialRestores: { bytes: number; ms: number }[];
  restoreFailures: number;
  /** Services with a KUBE-SERVICES rule after the churn (iptables-save, outside the measured window). */
  programmed: number;
  /** This agent only: generation ms of the first full sync and median of partial syncs (its -v=2 log). */
  oursFullGenerateMs: number | null;
  oursPartialGenerateMs: number[];
  /** This agent only: iptables calls other than the restore (and the per-syncPeriod poll) during its partial syncs. */
  oursCallsDuringPartial: string[];
  /** 1-minute load average of the machine when the run started and when it ended. */
  loadAvg: [number, number];
  errors: string[];
}

/** The machine's 1-minute load average. */
function loadAverage(): number {
  try {
    return Number(Deno.readTextFileSync("/proc/loadavg").split(" ")[0]);
  } catch {
    return NaN;
  }
}

/** Percentile (nearest rank) of an unsorted list; null when empty. */
export function percentile(xs: readonly number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
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

/** One run of one agent on a fresh namespace, simulator and copy of the generated state. */
async function runAgent(o: ScaleOptions, agent: AgentName, run: number): Promise<AgentRun> {
  const say = (m: string) =>
    o.verbose && console.error(`[scale ${new Date().toISOString()} ${agent}#${run}] ${m}`);
  const workdir = await Deno.makeTempDir({ prefix: `dkp-scale-${agent}-` });
  const ns = await NodeNamespace.create(o.backend);
  let sim: SimulatorProcess | null = null;
  let child: Deno.ChildProcess | null = null;
  let monitor: Monitor | undefined;
  const res: AgentRun = {
    agent,
    run,
    firstSyncS: null,
    firstPayloadBytes: null,
    bareRestoreS: null,
    rssSettledMiB: null,
    rssChurnMiB: null,
    hwmMiB: null,
    cpuPerS: 0,
    childCpuPerS: 0,
    endpointEvents: 0,
    endpointResolved: 0,
    endpointHandedMs: [],
    endpointInKernelMs: [],
    endpointOverheadMs: [],
    serviceEvents: 0,
    serviceResolved: 0,
    serviceInKernelMs: [],
    serviceOverheadMs: [],
    serviceOverheadInKernelMs: [],
    serviceApplyMs: [],
    serviceOtherCallsMs: [],
    partialRestores: [],
    restoreFailures: 0,
    programmed: 0,
    oursFullGenerateMs: null,
    oursPartialGenerateMs: [],
    oursCallsDuringPartial: [],
    loadAvg: [loadAverage(), NaN],
    errors: [],
  };
  const probe = kernelProbe(o.mode, o.backend);
  let firstPayload: string | null = null;
  let prelude: Prelude | null = null;
  try {
    say(`namespace ${ns.name}, workdir ${workdir}`);
    const wr = await writeWrappers(workdir, o.backend, { nft: o.mode === "nftables" });

    // 1. Simulator and objects (the same for every agent and run).
    sim = await SimulatorProcess.start({ netns: ns.name, watchCache: true });
    await sim.upsert(makeNode("node1", ns.nodeIP));
    const pool = new IpPool();
    const ips: string[][] = [];
    const CHUNK = 2000;
    for (let i = 0; i < o.services; i += CHUNK) {
      const svcs: KubeObject[] = [];
      for (let k = i; k < Math.min(o.services, i + CHUNK); k++) svcs.push(makeService(k));
      await sim.upsertMany("services", svcs);
    }
    for (let i = 0; i < o.services; i += CHUNK) {
      const slices: KubeObject[] = [];
      for (let k = i; k < Math.min(o.services, i + CHUNK); k++) {
        ips[k] = Array.from({ length: o.endpoints }, () => pool.take());
        slices.push(makeSlice(k, ips[k], null));
      }
      await sim.upsertMany("endpointslices", slices);
    }
    say(`loaded ${o.services} services × ${o.endpoints} endpoints`);

    // 2. Agent.
    const cmd = await agentCommand(agent, {
      kubeconfig: sim.kubeconfig,
      nodeName: "node1",
      mode: o.mode,
      minSyncS: o.minSync,
      metricsAddress: "127.0.0.1:10249",
      upstreamBinary: o.upstreamBinary,
    });
    const spawnedAt = Date.now();
    child = new Deno.Command("ip", {
      args: ["netns", "exec", ns.name, ...cmd],
      env: { PATH: `${wr.bin}:${Deno.env.get("PATH")}`, NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const pid = child.pid;
    const logFile = await Deno.open(`${workdir}/agent.log`, { write: true, create: true });
    const oursSyncs: { ts: number; full: boolean; generateMs: number }[] = [];
    const oursProxierSyncs: { ts: number; elapsedMs: number; full: boolean }[] = [];
    const logDone = (async () => {
      let buf = "";
      const enc = new TextEncoder();
      for await (const chunk of child!.stderr.pipeThrough(new TextDecoderStream())) {
        await logFile.write(enc.encode(chunk));
        if (!agent.startsWith("ours")) continue;
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
          if (r.msg !== "SyncProxyRules complete" || r.ipFamily !== "IPv4") continue;
          const ts = (r.ts as number) * 1000;
          if ("generateMs" in r) {
            oursSyncs.push({ ts, full: r.full as boolean, generateMs: r.generateMs as number });
          } else {oursProxierSyncs.push({
              ts,
              full: r.full as boolean,
              elapsedMs: parseFloat(String(r.elapsed)) * 1000,
            });}
        }
      }
      logFile.close();
    })();
    let exited = false;
    void child.status.then(() => (exited = true));
    const rss: { t: number; kib: number }[] = [];
    const sampler = setInterval(() => {
      const p = readProc(pid);
      if (p) rss.push({ t: Date.now(), kib: p.rssKiB });
    }, 250);

    const payloadText = async (c: Call) => c.file ? await Deno.readTextFile(c.file).catch(() => "") : "";
    try {
      // 3. First full sync, seen in the kernel-side log.
      const deadline = spawnedAt + o.timeout * 1000;
      const checked = new Set<string>();
      while (res.firstSyncS === null && Date.now() < deadline && !exited) {
        await sleep(250);
        const calls = parseCalls(await Deno.readTextFile(wr.log), wr.payloads);
        for (const c of calls) {
          if (c.file === null || c.end === null || c.rc !== 0 || checked.has(c.file)) continue;
          checked.add(c.file);
          const text = await payloadText(c);
          if (probe.isV4Success(c, text) && probe.servicesIn(text) >= o.services) {
            res.firstSyncS = (c.end! - spawnedAt) / 1000;
            res.firstPayloadBytes = new TextEncoder().encode(text).length;
            firstPayload = `${workdir}/first-payload`;
            await Deno.copyFile(c.file!, firstPayload);
            // What the agent set up before that restore (upstream creates iptables chains and jumps one by one),
            // replayed before the bare restore so that the payload applies the same way.
            prelude = await probe.capturePrelude(calls, c, workdir);
            break;
          }
        }
      }
      if (res.firstSyncS === null) {
        throw new Error(`no complete first sync within ${o.timeout}s (exited=${exited})`);
      }
      say(`first complete sync after ${res.firstSyncS.toFixed(2)} s`);
      await sleep(o.settle * 1000);
      const settled = rss.filter((s) => s.t > Date.now() - 2000).map((s) => s.kib);
      res.rssSettledMiB = settled.length ? percentile(settled, 50)! / 1024 : null;

      // The monitor, when asked: every committed transaction with its arrival time, from before the churn.
      if (o.monitor) monitor = await startMonitor(ns.name);

      // 4. Churn: endpoint replacements and added Services, the same sequence for every agent of a run.
      const rand = seededRandom(o.seed + run);
      const epEvents: (Ev & { ip: string; slot: string })[] = [];
      const svcEvents: (Ev & { needle: string })[] = [];
      const total = Math.round(o.churn * o.duration);
      const adds = Math.round(o.serviceAdds * o.duration);
      const steps: ("ep" | "svc")[] = [];
      for (let k = 0; k < total; k++) steps.push("ep");
      for (let k = 0; k < adds; k++) steps.splice(Math.floor(((k + 0.5) * total) / adds) + k, 0, "svc");
      const cpu0 = readProc(pid)!;
      const churnStart = Date.now();
      const stepMs = (o.duration * 1000) / Math.max(1, steps.length);
      let nextService = o.services;
      say(`churn: ${total} endpoint updates, ${adds} added Services over ${o.duration} s`);
      for (let k = 0; k < steps.length; k++) {
        const wait = churnStart + k * stepMs - Date.now();
        if (wait > 0) await sleep(wait);
        if (steps[k] === "ep") {
          const i = Math.floor(rand() * o.services);
          const j = Math.floor(rand() * o.endpoints);
          const ip = pool.take();
          ips[i][j] = ip;
          const t = Date.now();
          epEvents.push({ t, ip, slot: `${i}/${j}` });
          await sim.upsert(makeSlice(i, ips[i], t));
        } else {
          const i = nextService++;
          ips[i] = Array.from({ length: o.endpoints }, () => pool.take());
          await sim.upsert(makeService(i));
          await sim.upsert(makeSlice(i, ips[i], null));
          svcEvents.push({ t: Date.now(), needle: probe.serviceNeedle(i) });
        }
      }
      const churnEnd = Date.now();
      const cpu1 = readProc(pid)!;
      const churnRss = rss.filter((s) => s.t >= churnStart && s.t <= churnEnd).map((s) => s.kib);
      res.rssChurnMiB = churnRss.length ? percentile(churnRss, 50)! / 1024 : null;
      const churnS = (churnEnd - churnStart) / 1000;
      res.cpuPerS = (cpu1.cpuTicks - cpu0.cpuTicks) / 100 / churnS;
      res.childCpuPerS = (cpu1.childTicks - cpu0.childTicks) / 100 / churnS;
      say(`churn done in ${churnS.toFixed(1)} s; waiting for the last updates`);

      // 5. Match events to restore payloads.
      const scanned = new Set<string>();
      const drainDeadline = Date.now() + Math.max(60_000, (o.timeout * 1000) / 4);
      const minSyncMs = o.minSync * 1000;
      let calls: Call[] = [];
      const housekeeping = new Set<string>();
      const settle = (e: Ev, c: Call, prevEnd: number) => {
        const from = Math.max(e.t, prevEnd + minSyncMs);
        e.handed = c.start - e.t;
        e.inKernel = c.end! - e.t;
        e.overhead = c.start - from;
        e.overheadInKernel = c.end! - from;
        e.applyMs = c.end! - c.start;
        // The agent's other calls (listing the table, deleting stale chains) within its own share.
        e.otherCallsMs = 0;
        for (const other of calls) {
          if (other === c || other.end === null) continue;
          e.otherCallsMs += Math.max(0, Math.min(other.end, c.start) - Math.max(other.start, from));
        }
      };
      // An endpoint event is resolved by a payload when it, or a later update of the same slot, is in it.
      const resolve = (
        text: string,
        c: Call,
        prevEnd: number,
        hasEndpoint: (text: string, ip: string) => boolean,
      ) => {
        const upto = new Map<string, number>();
        for (const e of epEvents) {
          if (e.handed !== undefined || e.t > c.start) continue;
          if (hasEndpoint(text, e.ip)) upto.set(e.slot, e.t);
        }
        for (const e of epEvents) {
          if (e.handed !== undefined || e.t > c.start) continue;
          const u = upto.get(e.slot);
          if (u !== undefined && e.t <= u) settle(e, c, prevEnd);
        }
        for (const e of svcEvents) {
          if (e.handed === undefined && e.t <= c.start && text.includes(e.needle)) settle(e, c, prevEnd);
        }
      };
      let monitorScanned = 0;
      let monitorPrevEnd = -Infinity;
      while (true) {
        calls = parseCalls(await Deno.readTextFile(wr.log), wr.payloads);
        if (monitor !== undefined) {
          // Each IPv4 transaction the kernel committed during the churn, at its arrival.
          for (; monitorScanned < monitor.txs.length; monitorScanned++) {
            const m = monitor.txs[monitorScanned];
            if (m.t < churnStart || !/^\w+ \w+ ip kube-proxy\b/m.test(m.text)) continue;
            if (/^(delete [^\n]*\n)+$/.test(m.text)) continue; // stale chains going
            const c: Call = {
              pid: 0,
              name: "monitor",
              args: "",
              argv: [],
              start: m.t,
              end: m.t,
              rc: 0,
              file: null,
            };
            res.partialRestores.push({ bytes: m.text.length, ms: 0 });
            resolve(m.text, c, monitorPrevEnd, monitorHasEndpoint);
            monitorPrevEnd = m.t;
          }
        } else {
          const restores = calls.filter((c) => probe.isApply(c));
          for (const c of restores) {
            if (scanned.has(c.file!)) continue;
            scanned.add(c.file!);
            if (c.rc !== 0) res.restoreFailures++;
            const text = c.rc === 0 && (c.start >= churnStart - 1 || probe.isHousekeeping)
              ? await payloadText(c)
              : "";
            if (probe.isHousekeeping?.(text)) housekeeping.add(c.file!);
            if (!probe.isV4Success(c, text) || c.start < churnStart - 1 || housekeeping.has(c.file!)) {
              if (!o.keep && c.file !== null) await Deno.remove(c.file).catch(() => {});
              continue;
            }
            res.partialRestores.push({ bytes: text.length, ms: c.end! - c.start });
            const prevEnd = Math.max(
              -Infinity,
              ...restores.filter((r) => r.end! <= c.start && !housekeeping.has(r.file!)).map((r) => r.end!),
            );
            resolve(text, c, prevEnd, probe.hasEndpoint);
            if (!o.keep) await Deno.remove(c.file!).catch(() => {});
          }
        }
        const done = epEvents.every((e) => e.handed !== undefined) &&
          svcEvents.every((e) => e.handed !== undefined);
        if (done || Date.now() > drainDeadline || exited) break;
        await sleep(500);
      }
      const epDone = epEvents.filter((e) => e.handed !== undefined);
      const svcDone = svcEvents.filter((e) => e.handed !== undefined);
      Object.assign(res, {
        endpointEvents: epEvents.length,
        endpointResolved: epDone.length,
        endpointHandedMs: epDone.map((e) => e.handed!),
        endpointInKernelMs: epDone.map((e) => e.inKernel!),
        endpointOverheadMs: epDone.map((e) => e.overhead!),
        serviceEvents: svcEvents.length,
        serviceResolved: svcDone.length,
        serviceInKernelMs: svcDone.map((e) => e.inKernel!),
        serviceOverheadMs: svcDone.map((e) => e.overhead!),
        serviceOverheadInKernelMs: svcDone.map((e) => e.overheadInKernel!),
        serviceApplyMs: svcDone.map((e) => e.applyMs!),
        serviceOtherCallsMs: svcDone.map((e) => e.otherCallsMs!),
      });
      say(
        `${epDone.length}/${epEvents.length} endpoint updates, ${svcDone.length}/${svcEvents.length} Services seen`,
      );

      // 6. Kernel state, this agent's own log.
      res.programmed = await probe.programmed(ns);
      res.hwmMiB = (readProc(pid)?.hwmKiB ?? 0) / 1024 || null;
      if (agent.startsWith("ours")) {
        const full = oursSyncs.find((s) => s.full);
        res.oursFullGenerateMs = full?.generateMs ?? null;
        res.oursPartialGenerateMs = oursSyncs.filter((s) => !s.full && s.ts >= churnStart).map((s) =>
          s.generateMs
        );
        const windows = oursProxierSyncs.filter((s) => !s.full).map((s) => [s.ts - s.elapsedMs, s.ts]);
        res.oursCallsDuringPartial = parseCalls(await Deno.readTextFile(wr.log), wr.payloads)
          .filter((c) => c.file === null && !probe.isPoll(c))
          .filter((c) => windows.some(([a, b]) => c.start >= a && c.start <= b))
          .map((c) => `${c.name} ${c.args}`);
      }
    } finally {
      clearInterval(sampler);
      await monitor?.stop();
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      const killer = setTimeout(() => {
        try {
          child?.kill("SIGKILL");
        } catch { /* gone */ }
      }, 10_000);
      await child.status;
      clearTimeout(killer);
      await logDone.catch(() => {});
    }
  } catch (err) {
    res.errors.push(String(err));
  } finally {
    await sim?.close().catch(() => {});
    await ns.destroy();
  }
  // 7. The kernel's own time for the same first payload, alone, into empty tables.
  if (o.bareRestore && firstPayload !== null && prelude !== null) {
    const bare = await NodeNamespace.create(o.backend);
    try {
      say("bare apply of the first full payload");
      res.bareRestoreS = await probe.bareApply(bare, firstPayload, prelude);
    } catch (err) {
      res.errors.push(`bare restore: ${err}`);
    } finally {
      await bare.destroy();
    }
  }
  if (!o.keep) await Deno.remove(workdir, { recursive: true }).catch(() => {});
  res.loadAvg[1] = loadAverage();
  return res;
}

/** `nft monitor` in a namespace: each committed transaction's lines and when its generation line arrived. */
interface Monitor {
  readonly txs: { t: number; text: string }[];
  stop(): Promise<void>;
}

/**
 * Starts `nft monitor` in namespace `ns` and returns once it reports (a throwaway table created and deleted
 * there shows up in its output), so that no transaction after this is missed.
 */
async function startMonitor(ns: string): Promise<Monitor> {
  const child = new Deno.Command("ip", {
    args: ["netns", "exec", ns, "nft", "monitor"],
    stdin: "null",
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const txs: { t: number; text: string }[] = [];
  let cur = "";
  const done = readLines(child.stdout, (line) => {
    if (line.startsWith("# new generation")) {
      txs.push({ t: Date.now(), text: cur });
      cur = "";
    } else cur += line + "\n";
  });
  // nft monitor first reads the table into its cache (about 4 s of CPU at 10k), and starts that over whenever
  // the ruleset changes meanwhile: probe rarely, waiting longer each time.
  const deadline = Date.now() + 180_000;
  for (let wait = 2_000; !txs.some((t) => t.text.includes("dkp-monitor-ready")); wait *= 2) {
    if (Date.now() > deadline) throw new Error("nft monitor did not report within 180 s");
    await sh("ip", [
      "netns",
      "exec",
      ns,
      "nft",
      "add table ip dkp-monitor-ready ; delete table ip dkp-monitor-ready",
    ]);
    const until = Date.now() + wait;
    while (Date.now() < until && !txs.some((t) => t.text.includes("dkp-monitor-ready"))) await sleep(100);
  }
  return {
    txs,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch { /* gone */ }
      await child.status;
      await done.catch(() => {});
    },
  };
}

/** An endpoint `ip` (port 8080) in a rule as `nft monitor` prints it (map elements joined by ", "). */
export function monitorHasEndpoint(text: string, ip: string): boolean {
  return text.includes(`dnat to ${ip}:8080\n`) || text.includes(` : ${ip} . 8080,`) ||
    text.includes(` : ${ip} . 8080 }`);
}

/** Runs every agent `runs` times, alternating, and returns every run's figures. */
export async function runScale(o: ScaleOptions): Promise<AgentRun[]> {
  if (Deno.uid() !== 0) throw new Error("the scale harness needs root (network namespaces, iptables)");
  usePrivateXtablesLock(); // its namespaces' tables are its own: so is their lock
  const out: AgentRun[] = [];
  const onSignal = () => {
    // Namespaces are named after this process; delete what is left and stop.
    void (async () => {
      const list = await sh("ip", ["netns", "list"]).catch(() => "");
      for (const m of list.matchAll(new RegExp(`dkp-scale-${Deno.pid}(?:-\\d+)?`, "g"))) {
        await sh("ip", ["netns", "del", m[0]]).catch(() => {});
      }
      Deno.exit(130);
    })();
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  try {
    for (let run = 1; run <= o.runs; run++) {
      for (const agent of o.agents) out.push(await runAgent(o, agent, run));
    }
  } finally {
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- reporting

const f = (v: number | null | undefined, d = 0) => (v === null || v === undefined ? "–" : v.toFixed(d));

/** One reported figure: how to get it from a run, and its number format. */
interface Figure {
  label: string;
  get: (r: AgentRun) => number | null;
  digits: number;
}

/** The figures of the side-by-side table; `tool` names what applies a payload (`restore`, `nft -f`). */
export function figures(tool = "restore"): Figure[] {
  const bare = tool === "restore" ? "iptables-restore" : tool;
  const p = (label: string, get: (r: AgentRun) => number[], q: number): Figure => ({
    label,
    get: (r) => percentile(get(r), q),
    digits: 0,
  });
  return [
    { label: "first full sync s (spawn → every Service in the kernel)", get: (r) => r.firstSyncS, digits: 1 },
    { label: `bare ${bare} of that payload s`, get: (r) => r.bareRestoreS, digits: 1 },
    {
      label: `first sync / bare ${tool === "restore" ? "restore" : tool}`,
      get: (r) => r.firstSyncS !== null && r.bareRestoreS ? r.firstSyncS / r.bareRestoreS : null,
      digits: 2,
    },
    {
      label: "full payload MiB",
      get: (r) => r.firstPayloadBytes === null ? null : r.firstPayloadBytes / 2 ** 20,
      digits: 1,
    },
    { label: "RSS settled MiB", get: (r) => r.rssSettledMiB, digits: 0 },
    { label: "RSS during churn MiB (median)", get: (r) => r.rssChurnMiB, digits: 0 },
    { label: "RSS peak (VmHWM) MiB", get: (r) => r.hwmMiB, digits: 0 },
    { label: "CPU s/s under churn, agent", get: (r) => r.cpuPerS, digits: 2 },
    {
      label: `CPU s/s under churn, reaped children (${tool === "restore" ? "restores" : "nft"}, wrappers)`,
      get: (r) => r.childCpuPerS,
      digits: 2,
    },
    p("endpoint change → in kernel p50 ms", (r) => r.endpointInKernelMs, 50),
    p("endpoint change → in kernel p99 ms", (r) => r.endpointInKernelMs, 99),
    p("endpoint change → handed to kernel p50 ms", (r) => r.endpointHandedMs, 50),
    p("endpoint change → handed to kernel p99 ms", (r) => r.endpointHandedMs, 99),
    p("endpoint change: beyond minSync p50 ms", (r) => r.endpointOverheadMs, 50),
    p("endpoint change: beyond minSync p99 ms", (r) => r.endpointOverheadMs, 99),
    p("added Service → in kernel p50 ms", (r) => r.serviceInKernelMs, 50),
    p("added Service → in kernel p99 ms", (r) => r.serviceInKernelMs, 99),
    p("added Service: beyond minSync p99 ms", (r) => r.serviceOverheadMs, 99),
    p("added Service: in kernel beyond minSync p50 ms", (r) => r.serviceOverheadInKernelMs, 50),
    p("added Service: in kernel beyond minSync p99 ms", (r) => r.serviceOverheadInKernelMs, 99),
    p(`added Service: its ${tool} p50 ms`, (r) => r.serviceApplyMs, 50),
    p("added Service: other calls within beyond minSync p50 ms", (r) => r.serviceOtherCallsMs, 50),
    {
      label: `${tool === "restore" ? "restores" : "nft -f transactions"} during churn (n)`,
      get: (r) => r.partialRestores.length,
      digits: 0,
    },
    p(`${tool} during churn, median ms`, (r) => r.partialRestores.map((x) => x.ms), 50),
    p(`${tool} during churn, median KiB`, (r) => r.partialRestores.map((x) => x.bytes / 1024), 50),
  ];
}

/** The figures of the iptables mode's table. */
export const FIGURES: Figure[] = figures();

/** Median, and [min-max] when there are several runs. */
function summary(xs: number[], d: number): string {
  if (xs.length === 0) return "–";
  const m = f(percentile(xs, 50), d);
  return xs.length === 1 ? m : `${m} [${f(Math.min(...xs), d)}-${f(Math.max(...xs), d)}]`;
}

/** The side-by-side markdown table: each figure's median [range] per agent and the ratio of the medians. */
export function sideBySide(o: ScaleOptions, runs: AgentRun[]): string {
  const agents = o.agents;
  const setup = o.mode === "nftables" ? "nftables" : `${o.mode} ${o.backend}`;
  const head = `| ${o.services} × ${o.endpoints}, ${setup}, ${o.runs} run(s) | ${agents.join(" | ")} |${
    agents.length === 2 ? ` ${agents[0]} / ${agents[1]} |` : ""
  }`;
  const sep = `|---|${agents.map(() => "---|").join("")}${agents.length === 2 ? "---|" : ""}`;
  const rows = [head, sep];
  for (const fig of figures(kernelProbe(o.mode, o.backend).tool)) {
    const per = agents.map((a) =>
      runs.filter((r) => r.agent === a).map(fig.get).filter((v): v is number =>
        v !== null && Number.isFinite(v)
      )
    );
    const cells = per.map((xs) => summary(xs, fig.digits));
    let ratio = "";
    if (agents.length === 2) {
      const a = percentile(per[0], 50), b = percentile(per[1], 50);
      ratio = ` ${a !== null && b ? f(a / b, 2) : "–"} |`;
    }
    rows.push(`| ${fig.label} | ${cells.join(" | ")} |${ratio}`);
  }
  const seen = agents.map((a) => {
    const rs = runs.filter((r) => r.agent === a);
    return `${a}: ${
      rs.map((r) =>
        `${r.endpointResolved}/${r.endpointEvents} updates, ${r.serviceResolved}/${r.serviceEvents} Services, ${r.programmed} programmed, ${r.restoreFailures} failed ${
          o.mode === "nftables" ? "transactions" : "restores"
        }, load ${f(r.loadAvg[0], 1)}-${f(r.loadAvg[1], 1)}`
      ).join("; ")
    }`;
  });
  return `${rows.join("\n")}\n\n${seen.join("\n")}\n`;
}

function parseArgs(args: string[]): ScaleOptions & { json: string } {
  const o: ScaleOptions & { json: string } = {
    services: 1000,
    endpoints: 10,
    mode: "iptables",
    backend: "legacy",
    agents: ["ours"],
    runs: 1,
    churn: 20,
    serviceAdds: 1,
    duration: 30,
    minSync: 1,
    settle: 40,
    timeout: 900,
    bareRestore: true,
    monitor: false,
    seed: 13,
    keep: false,
    verbose: true,
    json: "",
  };
  const num = (k: string, v: string) => {
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0) throw new Error(`--${k} needs a number, not ${v}`);
    return n;
  };
  for (let i = 0; i < args.length; i++) {
    const [k, inline] = args[i].replace(/^--/, "").split("=", 2);
    const val = () => inline ?? args[++i];
    switch (k) {
      case "services":
      case "endpoints":
      case "churn":
      case "duration":
      case "timeout":
      case "runs":
      case "settle":
      case "seed":
        o[k] = num(k, val());
        break;
      case "min-sync":
        o.minSync = num(k, val());
        break;
      case "service-adds":
        o.serviceAdds = num(k, val());
        break;
      case "mode": {
        const m = val();
        if (m !== "iptables" && m !== "nftables") {
          throw new Error(`--mode must be iptables or nftables, not ${m}`);
        }
        o.mode = m;
        break;
      }
      case "backend": {
        const b = val();
        if (b !== "legacy" && b !== "nft") throw new Error(`--backend must be legacy or nft, not ${b}`);
        o.backend = b;
        break;
      }
      case "agents": {
        const list = val().split(",");
        for (const a of list) {
          if (!(AGENT_NAMES as readonly string[]).includes(a)) throw new Error(`unknown agent ${a}`);
        }
        o.agents = list as AgentName[];
        break;
      }
      case "upstream-binary":
        o.upstreamBinary = val();
        break;
      case "no-bare-restore":
        o.bareRestore = false;
        break;
      case "keep":
        o.keep = true;
        break;
      case "monitor":
        o.monitor = true;
        break;
      case "quiet":
        o.verbose = false;
        break;
      case "json":
        o.json = val();
        break;
      default:
        throw new Error(
          `unknown flag ${args[i]}; flags: --agents ${
            AGENT_NAMES.join(",")
          } --runs N --services N --endpoints M ` +
            `--mode iptables|nftables --backend legacy|nft --churn R --service-adds R --duration S --min-sync S --settle S ` +
            `--timeout S --seed N --upstream-binary PATH --no-bare-restore --keep --monitor --quiet --json FILE`,
        );
    }
  }
  return o;
}

if (import.meta.main) {
  const o = parseArgs(Deno.args);
  const runs = await runScale(o);
  if (o.json) await Deno.writeTextFile(o.json, JSON.stringify({ options: o, runs }, null, 1));
  for (const r of runs) {
    if (r.errors.length) console.error(`${r.agent}#${r.run} errors:\n  ${r.errors.join("\n  ")}`);
    if (r.oursCallsDuringPartial.length) {
      console.error(`${r.agent}#${r.run} other calls during partial syncs:`, r.oursCallsDuringPartial);
    }
  }
  console.log(sideBySide(o, runs));
  const ours = runs.filter((r) => r.agent === "ours");
  if (ours.length) {
    console.log(
      `ours, generation (its log): first full ${
        summary(ours.map((r) => r.oursFullGenerateMs ?? NaN).filter(Number.isFinite), 0)
      } ms; ` +
        `partial median ${
          summary(ours.map((r) => percentile(r.oursPartialGenerateMs, 50) ?? NaN).filter(Number.isFinite), 1)
        } ms`,
    );
  }
}
