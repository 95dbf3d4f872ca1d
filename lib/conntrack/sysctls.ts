/**
 * Conntrack tuning at start-up (upstream v1.37 `pkg/proxy/conntrack/sysctls.go`) and the OOM score adjustment, both through programs run by the
 * {@linkcode CommandRunner} (`sysctl`, `choom`), since Deno needs --allow-all to touch /proc or /sys.
 * Each value is written only when it differs; each skipped step is logged with the reason.
 * @module
 */
import type { CommandRunner } from "../exec.ts";
import { log } from "../log.ts";
import { ensureSysctl, readIntSysctl } from "../sysctl.ts";

/** The `conntrack` section of KubeProxyConfiguration, durations in seconds (0 = leave as is). */
export interface ConntrackConfig {
  maxPerCore: number;
  min: number;
  tcpEstablishedTimeoutSeconds: number;
  tcpCloseWaitTimeoutSeconds: number;
  tcpBeLiberal: boolean;
  udpTimeoutSeconds: number;
  udpStreamTimeoutSeconds: number;
}

/** v1.37's cap on the scaled value (#137002). */
export const CONNTRACK_MAX_LIMIT = 1_048_576;

/**
 * Upstream v1.37 `getConntrackMax`, when maxPerCore > 0: maxPerCore × nCPU capped at 1,048,576 (the cap wins,
 * even over `min`), else max(scaled, min); 0 (leave as is) when maxPerCore is 0.
 */
export function conntrackMax(cfg: Pick<ConntrackConfig, "maxPerCore" | "min">, numCPU: number): number {
  if (cfg.maxPerCore <= 0) return 0;
  const scaled = cfg.maxPerCore * numCPU;
  if (scaled > CONNTRACK_MAX_LIMIT) return CONNTRACK_MAX_LIMIT;
  return Math.max(scaled, cfg.min);
}

/** The size of a kernel CPU list such as `0-3,6,8-9` (sysfs `online`); null when it does not parse. */
export function cpuListSize(list: string): number | null {
  const t = list.trim();
  if (t === "") return null;
  let n = 0;
  for (const part of t.split(",")) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) return null;
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo) return null;
    n += hi - lo + 1;
  }
  return n;
}

/** Where the node's online CPUs are listed. */
export const ONLINE_CPUS_PATH = "/sys/devices/system/cpu/online";

/**
 * The node's online CPUs (v1.37 #140021: cpuset.NumCPU, not the process's cpuset or quota), read from
 * `/sys/devices/system/cpu/online` (the agent runs with --allow-read); `navigator.hardwareConcurrency` when it
 * cannot be read, as upstream falls back to runtime.NumCPU.
 */
export function nodeOnlineCPUs(read: (path: string) => string = Deno.readTextFileSync): number {
  try {
    const n = cpuListSize(read(ONLINE_CPUS_PATH));
    if (n !== null && n > 0) return n;
  } catch { /* fall back */ }
  return navigator.hardwareConcurrency ?? 1;
}

/** Options of {@linkcode setupConntrack}. */
export interface SetupConntrackOptions {
  /** @default nodeOnlineCPUs() */
  numCPU?: number;
}

/**
 * Applies the conntrack configuration. Never throws: a value that cannot be written is logged (upstream
 * returns an error only for nf_conntrack_max; the caller decides, so this returns the failed keys).
 * @returns Keys that could not be written.
 */
export async function setupConntrack(
  runner: CommandRunner,
  cfg: ConntrackConfig,
  opts: SetupConntrackOptions = {},
): Promise<string[]> {
  const failed: string[] = [];
  const set = async (key: string, value: number) => {
    if ((await ensureSysctl(runner, key, value)) === "failed") failed.push(key);
  };
  const max = conntrackMax(cfg, opts.numCPU ?? nodeOnlineCPUs());
  if (max > 0) {
    // v1.37: only ever raised; a higher value (set by the operator or another agent) stays.
    const current = await readIntSysctl(runner, "net.netfilter.nf_conntrack_max");
    if (current !== null && current >= max) {
      log.v(2).info("Not lowering nf_conntrack_max", { current, wanted: max });
    } else await set("net.netfilter.nf_conntrack_max", max);
    // Upstream also raises /sys/module/nf_conntrack/parameters/hashsize to max/4; that is not a sysctl
    // and Deno cannot write /sys without --allow-all, so it is left to the kernel default.
    log.info("Not adjusting nf_conntrack hashsize (needs a write to /sys); the kernel default applies", {
      wantedAtLeast: Math.floor(max / 4),
    });
  } else log.info("Skipping nf_conntrack_max: conntrack.maxPerCore is 0");
  if (cfg.tcpEstablishedTimeoutSeconds > 0) {
    await set("net.netfilter.nf_conntrack_tcp_timeout_established", cfg.tcpEstablishedTimeoutSeconds);
  } else log.v(2).info("Skipping nf_conntrack_tcp_timeout_established: not configured");
  if (cfg.tcpCloseWaitTimeoutSeconds > 0) {
    await set("net.netfilter.nf_conntrack_tcp_timeout_close_wait", cfg.tcpCloseWaitTimeoutSeconds);
  } else log.v(2).info("Skipping nf_conntrack_tcp_timeout_close_wait: not configured");
  if (cfg.tcpBeLiberal) await set("net.netfilter.nf_conntrack_tcp_be_liberal", 1);
  else log.v(2).info("Skipping nf_conntrack_tcp_be_liberal: conntrack.tcpBeLiberal is false");
  if (cfg.udpTimeoutSeconds > 0) await set("net.netfilter.nf_conntrack_udp_timeout", cfg.udpTimeoutSeconds);
  else log.v(2).info("Skipping nf_conntrack_udp_timeout: not configured");
  if (cfg.udpStreamTimeoutSeconds > 0) {
    await set("net.netfilter.nf_conntrack_udp_timeout_stream", cfg.udpStreamTimeoutSeconds);
  } else log.v(2).info("Skipping nf_conntrack_udp_timeout_stream: not configured");
  return failed;
}

/**
 * Sets the OOM score adjustment of a process (default: this one) with `choom -n <adj> -p <pid>`
 * (util-linux). Failure is only logged, as upstream.
 * @returns True when applied.
 */
export async function applyOOMScoreAdj(
  runner: CommandRunner,
  adj: number,
  pid: number = Deno.pid,
): Promise<boolean> {
  try {
    const r = await runner.tryRun({ cmd: "choom", args: ["-n", String(adj), "-p", String(pid)] });
    if (r.code === 0) {
      log.v(2).info("Set OOM score adjustment", { oomScoreAdj: adj, pid });
      return true;
    }
    log.error("Failed to apply OOMScore", r.stderr.trim() || `exit ${r.code}`, { oomScoreAdj: adj });
  } catch (err) {
    log.error("Failed to apply OOMScore", err, { oomScoreAdj: adj });
  }
  return false;
}
