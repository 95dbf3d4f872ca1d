/**
 * The `process_*` families of Prometheus's Go client (client_golang's process collector, which upstream
 * kube-proxy serves), with its names, types and help, measured at each scrape.
 *
 * Deno 2.9.6 refuses every read under /proc without `--allow-all` (the start task does not grant it), so three
 * families come from what the runtime measures without a permission: CPU time from getrusage
 * (`process.cpuUsage()`, the kernel's user + system time, the same accounting as /proc/self/stat), resident
 * memory from `Deno.memoryUsage().rss` (read by the runtime from the kernel) and the start time from the
 * runtime's time origin (`performance.timeOrigin`, a few milliseconds after exec). The others are read from
 * /proc as client_golang reads them, and so only when the agent may (an operator adding `--allow-all` through
 * `DKP_EXTRA_PERMISSIONS`): `/proc/self/stat` (virtual memory), `/proc/self/fd` (open descriptors),
 * `/proc/self/limits` (limits) and `/proc/self/net/netstat` (IpExt octets: like upstream's, the counters of the
 * network namespace the process runs in, the node's for a hostNetwork pod).
 *
 * A family whose source cannot be read when {@linkcode registerProcessMetrics} runs is not registered, so it
 * is absent rather than zero (docs/operations.md lists them); a later failed read keeps the last value.
 * @module
 */
import process from "node:process";
import client from "prom-client";
import { COMPONENT_REGISTRIES } from "../metrics.ts";

/** USER_HZ, the unit of the times in /proc/<pid>/stat (100 on Linux; procfs assumes it as well). */
const USER_HZ = 100;

/** What one read of /proc gives. */
export interface ProcessSample {
  cpuSeconds?: number;
  virtualBytes?: number;
  startTimeSeconds?: number;
  residentBytes?: number;
  openFds?: number;
  maxFds?: number;
  virtualMaxBytes?: number;
  networkReceiveBytes?: number;
  networkTransmitBytes?: number;
}

/** Where the collector reads in /proc (tests point it at fixtures). */
export interface ProcPaths {
  stat: string;
  fdDir: string;
  limits: string;
  netstat: string;
}

/** The running process's files. */
export const SELF: ProcPaths = {
  stat: "/proc/self/stat",
  fdDir: "/proc/self/fd",
  limits: "/proc/self/limits",
  netstat: "/proc/self/net/netstat",
};

async function maybe<T>(f: () => Promise<T>): Promise<T | undefined> {
  try {
    return await f();
  } catch {
    return undefined;
  }
}

/** Parses /proc/<pid>/stat: utime+stime in seconds, vsize, starttime in ticks since boot. */
export function parseStat(text: string): { cpuSeconds: number; virtualBytes: number; startTicks: number } {
  // The command name (field 2) is in parentheses and may hold spaces: fields resume after the last ')'.
  const f = text.slice(text.lastIndexOf(")") + 2).trim().split(/\s+/);
  // f[0] is field 3 (state): field n is f[n - 3].
  return {
    cpuSeconds: (Number(f[14 - 3]) + Number(f[15 - 3])) / USER_HZ,
    startTicks: Number(f[22 - 3]),
    virtualBytes: Number(f[23 - 3]),
  };
}

/** The soft limits of /proc/<pid>/limits: open files and address space ("unlimited" as Go's max uint64). */
export function parseLimits(text: string): { maxFds?: number; virtualMaxBytes?: number } {
  const soft = (name: string): number | undefined => {
    const line = text.split("\n").find((l) => l.startsWith(name));
    if (!line) return undefined;
    const v = line.slice(name.length).trim().split(/\s+/)[0];
    return v === "unlimited" ? 18446744073709552000 : Number(v);
  };
  return { maxFds: soft("Max open files"), virtualMaxBytes: soft("Max address space") };
}

/** IpExt InOctets/OutOctets of a /proc/<pid>/net/netstat. */
export function parseNetstat(text: string): { receive?: number; transmit?: number } {
  const lines = text.split("\n").filter((l) => l.startsWith("IpExt:"));
  if (lines.length < 2) return {};
  const names = lines[0].split(/\s+/);
  const values = lines[1].split(/\s+/);
  const get = (n: string) => {
    const i = names.indexOf(n);
    return i < 0 ? undefined : Number(values[i]);
  };
  return { receive: get("InOctets"), transmit: get("OutOctets") };
}

/** Reads every figure it can; one that cannot be read is undefined. */
export async function readProcess(paths: ProcPaths = SELF): Promise<ProcessSample> {
  const cpu = process.cpuUsage();
  const out: ProcessSample = {
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    residentBytes: Deno.memoryUsage().rss,
    startTimeSeconds: performance.timeOrigin / 1000,
  };
  const stat = await maybe(async () => parseStat(await Deno.readTextFile(paths.stat)));
  out.virtualBytes = stat?.virtualBytes;
  out.openFds = await maybe(async () => {
    let n = 0;
    for await (const _ of Deno.readDir(paths.fdDir)) n++;
    return n;
  });
  const limits = await maybe(async () => parseLimits(await Deno.readTextFile(paths.limits)));
  out.maxFds = limits?.maxFds;
  out.virtualMaxBytes = limits?.virtualMaxBytes;
  const net = await maybe(async () => parseNetstat(await Deno.readTextFile(paths.netstat)));
  out.networkReceiveBytes = net?.receive;
  out.networkTransmitBytes = net?.transmit;
  return out;
}

/** One scrape reads /proc once for all families: the sample is shared for this long (ms). */
const SAMPLE_TTL_MS = 100;

type Family = {
  name: string;
  help: string;
  counter: boolean;
  pick: (s: ProcessSample) => number | undefined;
};

/** client_golang's process collector families (names and help as it exports them). */
const FAMILIES: Family[] = [
  {
    name: "process_cpu_seconds_total",
    help: "Total user and system CPU time spent in seconds.",
    counter: true,
    pick: (s) => s.cpuSeconds,
  },
  {
    name: "process_open_fds",
    help: "Number of open file descriptors.",
    counter: false,
    pick: (s) => s.openFds,
  },
  {
    name: "process_max_fds",
    help: "Maximum number of open file descriptors.",
    counter: false,
    pick: (s) => s.maxFds,
  },
  {
    name: "process_virtual_memory_bytes",
    help: "Virtual memory size in bytes.",
    counter: false,
    pick: (s) => s.virtualBytes,
  },
  {
    name: "process_virtual_memory_max_bytes",
    help: "Maximum amount of virtual memory available in bytes.",
    counter: false,
    pick: (s) => s.virtualMaxBytes,
  },
  {
    name: "process_resident_memory_bytes",
    help: "Resident memory size in bytes.",
    counter: false,
    pick: (s) => s.residentBytes,
  },
  {
    name: "process_start_time_seconds",
    help: "Start time of the process since unix epoch in seconds.",
    counter: false,
    pick: (s) => s.startTimeSeconds,
  },
  {
    name: "process_network_receive_bytes_total",
    help: "Number of bytes received by the process over the network.",
    counter: true,
    pick: (s) => s.networkReceiveBytes,
  },
  {
    name: "process_network_transmit_bytes_total",
    help: "Number of bytes sent by the process over the network.",
    counter: true,
    pick: (s) => s.networkTransmitBytes,
  },
];

/**
 * Registers the `process_*` families whose source is readable now (on `registers`, default the served
 * registry and the tests'); each scrape re-reads /proc. Returns the names registered. Registering a name
 * again is a no-op.
 */
export async function registerProcessMetrics(
  paths: ProcPaths = SELF,
  registers: client.Registry[] = COMPONENT_REGISTRIES,
): Promise<string[]> {
  let cached: { at: number; sample: Promise<ProcessSample> } | undefined;
  const sample = () => {
    const now = performance.now();
    if (!cached || now - cached.at > SAMPLE_TTL_MS) cached = { at: now, sample: readProcess(paths) };
    return cached.sample;
  };
  const first = await sample();
  const names: string[] = [];
  for (const f of FAMILIES) {
    if (f.pick(first) === undefined || registers.some((r) => r.getSingleMetric(f.name))) continue;
    names.push(f.name);
    if (f.counter) {
      let last = 0;
      new client.Counter({
        name: f.name,
        help: f.help,
        registers,
        async collect() {
          const v = f.pick(await sample());
          // A kernel counter read as it is: the counter moves to the reading (never below its last one).
          if (v === undefined || v <= last) return;
          this.inc(v - last);
          last = v;
        },
      });
    } else {
      new client.Gauge({
        name: f.name,
        help: f.help,
        registers,
        async collect() {
          const v = f.pick(await sample());
          if (v !== undefined) this.set(v);
        },
      });
    }
  }
  return names;
}
