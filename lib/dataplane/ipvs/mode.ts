/**
 * The ipvs mode's factory. Today it only cleans up: IPVS virtual servers (when this mode's `kube-ipvs0`
 * dummy interface says it ran here), the interface, the mode's iptables chains and its `KUBE-*` ipsets.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import { removeIptablesLeftovers } from "../iptables_leftovers.ts";
import {
  type CleanupReport,
  type DataplaneMode,
  type ModeContext,
  ModeUnavailableError,
  type ProxyModeName,
} from "../mode.ts";

/** The dummy interface holding every service IP in ipvs mode. */
export const DUMMY_INTERFACE = "kube-ipvs0";

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

/** A fresh ipvs mode. */
export function newIpvsMode(): DataplaneMode {
  const notYet = () =>
    new ModeUnavailableError("ipvs", 'proxy mode "ipvs" is not implemented yet; use --proxy-mode=iptables');
  return {
    name: "ipvs",
    checkHost(_ctx: ModeContext): Promise<void> {
      return Promise.reject(notYet());
    },
    probeFamilies(_ctx: ModeContext): Promise<IPFamily[]> {
      return Promise.reject(notYet());
    },
    createDataplanes(_ctx: ModeContext, _families: readonly IPFamily[]): Promise<Map<IPFamily, Dataplane>> {
      return Promise.reject(notYet());
    },

    async cleanup(runner: CommandRunner, next: ProxyModeName | null, logger: Logger): Promise<CleanupReport> {
      const removed: string[] = [];
      let failed = false;
      const hasLink = (await tryRun(runner, "ip", ["link", "show", DUMMY_INTERFACE])).code === 0;
      const sets = await tryRun(runner, "ipset", ["list", "-n"]);
      const kubeSets = sets.code === 0
        ? sets.stdout.split("\n").map((s) => s.trim()).filter((s) => s.startsWith("KUBE-"))
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
