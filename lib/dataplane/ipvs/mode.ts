/**
 * The ipvs mode's factory: the start-up probe (ipset version, IPVS in the kernel, the scheduler), the family
 * probe, the sysctls and IPVS timeouts upstream sets for this mode, the deprecation warning and Event of
 * v1.35, one {@linkcode IpvsDataplane} per family, and the removal of what the mode leaves behind: IPVS virtual
 * servers (when this mode's `kube-ipvs0` dummy interface says it ran here), the interface, the mode's iptables
 * chains and its `KUBE-*` ipsets.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import { ensureSysctl } from "../../sysctl.ts";
import {
  detectIptablesBackend,
  type IptablesBackend,
  iptablesTools,
  probeIptablesFamilies,
} from "../iptables_backend.ts";
import { removeIptablesLeftovers } from "../iptables_leftovers.ts";
import { iptablesLocalMatch } from "../iptables_local_detector.ts";
import { configuredLocalTraffic } from "../local_traffic.ts";
import {
  type CleanupReport,
  type DataplaneMode,
  type ModeContext,
  ModeUnavailableError,
  type ProxyModeName,
} from "../mode.ts";
import { DUMMY_INTERFACE } from "./addresses.ts";
import { IpvsDataplane } from "./dataplane.ts";
import { allSetNames } from "./ipsets.ts";
import { parseIpvsadmSave, PROBE_SERVICE } from "./ipvsadm.ts";

export { DUMMY_INTERFACE };

/** Upstream's `MinIPSetCheckVersion`. */
export const MIN_IPSET_VERSION = "6.0";

/** Upstream v1.35's deprecation message (logged as an error and recorded as a Warning Event). */
export const IPVS_DEPRECATION_MESSAGE =
  "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/** True when `version` ("X.Y", "vX.Y") is at least `min`. */
export function versionAtLeast(version: string, min: string): boolean {
  const parse = (v: string) => v.replace(/^v/, "").split(".").map((x) => parseInt(x, 10));
  const a = parse(version), b = parse(min);
  if (a.some((x) => !Number.isFinite(x))) return false;
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const x = a[i] ?? 0, y = b[i] ?? 0;
    if (x !== y) return x > y;
  }
  return true;
}

/**
 * The value upstream gives `net/ipv4/vs/conn_reuse_mode` for a kernel release: null (left as is) from 5.9 on
 * (kubernetes#93297) and before 4.1 (not supported: upstream logs an error), else 0.
 */
export function connReuseModeFor(release: string): 0 | null {
  const m = release.match(/^(\d+)\.(\d+)/);
  if (!m) return null;
  const v = `${m[1]}.${m[2]}`;
  if (!versionAtLeast(v, "4.1")) return null;
  return versionAtLeast(v, "5.9") ? null : 0;
}

/** Chains only the ipvs mode writes. */
const OWN_CHAINS = new Set([
  "KUBE-NODE-PORT",
  "KUBE-LOAD-BALANCER",
  "KUBE-SOURCE-RANGES-FIREWALL",
  "KUBE-IPVS-FILTER",
  "KUBE-IPVS-OUT-FILTER",
]);
/** Chains the ipvs mode shares with the iptables mode. */
const SHARED_CHAINS = new Set([
  "KUBE-SERVICES",
  "KUBE-POSTROUTING",
  "KUBE-MARK-MASQ",
  "KUBE-FORWARD",
  "KUBE-PROXY-FIREWALL",
]);

async function tryRun(runner: CommandRunner, cmd: string, args: string[]) {
  try {
    return await runner.tryRun({ cmd, args, timeoutMs: 120_000 });
  } catch {
    return { code: 127, stdout: "", stderr: `${cmd}: not found` };
  }
}

/**
 * Upstream's CanUseIPVSProxier: ipset ≥ 6.0, IPVS in the kernel, and the scheduler (a virtual server using it
 * exists, or a dummy one on 198.51.100.0:20000 can be added and removed). Resolves with the reason it cannot
 * be used, or null.
 */
export async function canUseIpvs(runner: CommandRunner, scheduler: string): Promise<string | null> {
  const sched = scheduler || "rr";
  const run = async (cmd: string, args: string[], stdin?: string) => {
    try {
      return await runner.tryRun({ cmd, args, stdin, timeoutMs: 60_000 });
    } catch (err) {
      return { code: 127, stdout: "", stderr: (err as Error).message };
    }
  };
  const v = await run("ipset", ["--version"]);
  const ver = `${v.stdout}${v.stderr}`.match(/v[0-9]+\.[0-9]+/);
  if (v.code !== 0 || !ver) {
    return `error getting ipset version, error: ${(v.stderr || v.stdout).trim() || `exit ${v.code}`}`;
  }
  if (!versionAtLeast(ver[0], MIN_IPSET_VERSION)) {
    return `ipset version: ${ver[0]} is less than min required version: ${MIN_IPSET_VERSION}`;
  }
  const saved = await run("ipvsadm", ["-S", "-n"]);
  if (saved.code !== 0) {
    const err = saved.stderr.trim().split("\n")[0] || `exit ${saved.code}`;
    return `IPVS is not available in this kernel (ipvsadm: ${err}); load the ip_vs kernel module ` +
      `(modprobe ip_vs ip_vs_${sched}) or choose another --proxy-mode`;
  }
  for (const vs of parseIpvsadmSave(saved.stdout).values()) if (vs.def.scheduler === sched) return null;
  const add = await run("ipvsadm", ["-A", ...PROBE_SERVICE.split(" "), "-s", sched]);
  if (add.code !== 0) {
    return `could not create a dummy virtual server with scheduler "${sched}": ${add.stderr.trim()} ` +
      `(load the ip_vs_${sched} kernel module or choose another --ipvs-scheduler)`;
  }
  const del = await run("ipvsadm", ["-D", ...PROBE_SERVICE.split(" ")]);
  if (del.code !== 0) return `could not delete the dummy virtual server: ${del.stderr.trim()}`;
  return null;
}

/** Upstream's sysctls and IPVS timeouts for this mode (NewProxier); failures are logged, as upstream errors. */
export async function setupIpvsKernel(ctx: ModeContext, kernelRelease: string): Promise<void> {
  const { runner, logger } = ctx;
  const cfg = ctx.options.config.ipvs;
  const set = (key: string, value: number) => ensureSysctl(runner, key, value, logger);
  await set("net.ipv4.vs.conntrack", 1);
  const reuse = connReuseModeFor(kernelRelease);
  if (reuse !== null) await set("net.ipv4.vs.conn_reuse_mode", reuse);
  else if (!versionAtLeast(kernelRelease.match(/^\d+\.\d+/)?.[0] ?? "0", "4.1")) {
    logger.error(
      "Can't set sysctl, kernel version doesn't satisfy minimum version requirements",
      undefined,
      { sysctl: "net/ipv4/vs/conn_reuse_mode", minimumKernelVersion: "4.1" },
    );
  } else logger.v(2).info("Left as-is", { sysctl: "net/ipv4/vs/conn_reuse_mode" });
  await set("net.ipv4.vs.expire_nodest_conn", 1);
  await set("net.ipv4.vs.expire_quiescent_template", 1);
  await set("net.ipv4.ip_forward", 1);
  if (cfg.strictARP) {
    await set("net.ipv4.conf.all.arp_ignore", 1);
    await set("net.ipv4.conf.all.arp_announce", 2);
  }
  const sec = (ms: number) => Math.floor(ms / 1000);
  if (cfg.tcpTimeout > 0 || cfg.tcpFinTimeout > 0 || cfg.udpTimeout > 0) {
    const args = [
      "--set",
      String(sec(cfg.tcpTimeout)),
      String(sec(cfg.tcpFinTimeout)),
      String(sec(cfg.udpTimeout)),
    ];
    const r = await runner.tryRun({ cmd: "ipvsadm", args }).catch((err) => ({
      code: 127,
      stdout: "",
      stderr: (err as Error).message,
    }));
    if (r.code !== 0) logger.error("Failed to configure IPVS timeouts", r.stderr.trim());
  }
}

/** Options of {@linkcode newIpvsMode} (tests). */
export interface IpvsModeOptions {
  /** The kernel release (default `Deno.osRelease()`). */
  kernelRelease?: () => string;
}

/** A fresh ipvs mode. */
export function newIpvsMode(modeOpts: IpvsModeOptions = {}): DataplaneMode {
  let backend: IptablesBackend = "system";
  const dataplanes: IpvsDataplane[] = [];
  return {
    name: "ipvs",

    async checkHost(ctx: ModeContext): Promise<void> {
      const why = await canUseIpvs(ctx.runner, ctx.options.config.ipvs.scheduler);
      if (why !== null) throw new ModeUnavailableError("ipvs", `can't use the IPVS proxier: ${why}`);
      ctx.logger.info("Using ipvs Proxier");
      ctx.logger.error(IPVS_DEPRECATION_MESSAGE);
      ctx.warningEvent("IPVSDeprecation", IPVS_DEPRECATION_MESSAGE);
      backend = (await detectIptablesBackend(ctx.runner)).backend;
    },

    probeFamilies(ctx: ModeContext): Promise<IPFamily[]> {
      return probeIptablesFamilies(ctx, backend, "ipvs", "the ipvs mode needs iptables");
    },

    async createDataplanes(
      ctx: ModeContext,
      families: readonly IPFamily[],
    ): Promise<Map<IPFamily, Dataplane>> {
      const o = ctx.options;
      const cfg = o.config;
      await setupIpvsKernel(ctx, (modeOpts.kernelRelease ?? (() => Deno.osRelease()))());
      if (!cfg.ipvs.scheduler) ctx.logger.info("IPVS scheduler not specified, use rr by default");
      const out = new Map<IPFamily, Dataplane>();
      for (const family of families) {
        const localTraffic = configuredLocalTraffic(o, ctx.podCIDRs, family);
        const dp = new IpvsDataplane({
          family,
          runner: ctx.runner,
          iptables: iptablesTools(backend, family),
          scheduler: cfg.ipvs.scheduler,
          masqueradeBit: o.masqueradeBit,
          masqueradeAll: o.masqueradeAll,
          localDetector: iptablesLocalMatch(localTraffic),
          nodePortAddresses: o.nodePortAddresses,
          excludeCIDRs: cfg.ipvs.excludeCIDRs,
          nodeIP: cfg.bindAddress,
          logger: ctx.logger,
        });
        dataplanes.push(dp);
        out.set(family, dp);
      }
      return out;
    },

    async cleanup(runner: CommandRunner, next: ProxyModeName | null, logger: Logger): Promise<CleanupReport> {
      const removed: string[] = [];
      let failed = false;
      const hasLink = (await tryRun(runner, "ip", ["link", "show", DUMMY_INTERFACE])).code === 0;
      const sets = await tryRun(runner, "ipset", ["list", "-n"]);
      // Only this mode's sets (both families): other tools use the KUBE- prefix too.
      const ours = new Set(allSetNames());
      const kubeSets = sets.code === 0
        ? sets.stdout.split("\n").map((s) => s.trim()).filter((s) => ours.has(s))
        : [];
      // This mode always creates both: without either it never ran here, and another mode's start need not
      // pay for four iptables-save listings (seconds each at 10k Services). --cleanup looks anyway.
      if (next !== null && !hasLink && kubeSets.length === 0) return { removed, failed };
      // Virtual servers only when our dummy link says this mode ran here (upstream flushes every virtual
      // server whenever ip_vs loads, which would also remove IPVS services that are not kube-proxy's).
      if (hasLink) {
        const flush = await tryRun(runner, "ipvsadm", ["-C"]);
        if (flush.code === 0) removed.push("IPVS virtual servers");
        else if (flush.code !== 127) {
          logger.info("Could not flush IPVS virtual servers (no IPVS in the kernel?)", {
            stderr: flush.stderr.trim(),
          });
        }
        const del = await tryRun(runner, "ip", ["link", "del", DUMMY_INTERFACE]);
        if (del.code === 0) removed.push(`interface ${DUMMY_INTERFACE}`);
        else {
          logger.error("Error deleting dummy device created by ipvs proxier", del.stderr.trim(), {
            device: DUMMY_INTERFACE,
          });
          failed = true;
        }
      }
      // iptables: before the iptables mode, only what it does not share (and the set matches in what it
      // shares, which would keep the ipsets busy); otherwise every chain of this mode.
      const ipt = await removeIptablesLeftovers(runner, {
        ownsChain: (c) => OWN_CHAINS.has(c) || (next !== "iptables" && SHARED_CHAINS.has(c)),
        dropsRule: (rule) => rule.includes("--match-set KUBE-"),
      }, logger);
      removed.push(...ipt.removed);
      failed ||= ipt.failed;
      // ipsets last: a set still referenced by an iptables rule cannot be destroyed.
      for (const name of kubeSets) {
        const r = await tryRun(runner, "ipset", ["destroy", name]);
        if (r.code === 0) removed.push(`ipset ${name}`);
        else {
          logger.error("Error removing ipset", r.stderr.trim(), { ipset: name });
          failed = true;
        }
      }
      return { removed, failed };
    },
  };
}
