/**
 * The iptables mode's factory: backend detection (legacy or nft, as upstream's image does), the family probe
 * (`iptables -t nat -S POSTROUTING` per family, as upstream's `Present()`), one {@linkcode IptablesDataplane}
 * per family, and the removal of this mode's chains.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import { detectIptablesBackend, type IptablesBackend, iptablesTools } from "../iptables_backend.ts";
import { KUBELET_CHAINS, removeIptablesLeftovers } from "../iptables_leftovers.ts";
import { configuredLocalTraffic } from "../local_traffic.ts";
import {
  type CleanupReport,
  type DataplaneMode,
  type ModeContext,
  ModeUnavailableError,
  type ProxyModeName,
} from "../mode.ts";
import { IptablesDataplane } from "./dataplane.ts";
import { iptablesLocalMatch } from "./local_detector.ts";
import { NfacctCounters } from "./nfacct.ts";
import { registerNfacctMetrics } from "../../metrics.ts";

/** Chains only the iptables mode writes (the ipvs mode shares KUBE-SERVICES, KUBE-POSTROUTING, ...). */
const OWN_CHAIN_PREFIXES = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];
const OWN_CHAINS = new Set(["KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY"]);

/** True for a chain that only the iptables mode creates. */
export function isIptablesModeChain(chain: string): boolean {
  return OWN_CHAINS.has(chain) || OWN_CHAIN_PREFIXES.some((p) => chain.startsWith(p));
}

/** True for any kube-proxy chain of an iptables-based mode (not kubelet's). */
export function isKubeProxyChain(chain: string): boolean {
  return chain.startsWith("KUBE-") && !KUBELET_CHAINS.has(chain);
}

async function familyWorks(runner: CommandRunner, backend: IptablesBackend, family: IPFamily) {
  const cmd = iptablesTools(backend, family).iptables;
  try {
    const r = await runner.tryRun({ cmd, args: ["-w", "5", "-t", "nat", "-S", "POSTROUTING"] });
    return r.code === 0 ? null : r.stderr.trim() || `${cmd} exited ${r.code}`;
  } catch (err) {
    return `${cmd}: ${(err as Error).message}`;
  }
}

/** A fresh iptables mode. */
export function newIptablesMode(): DataplaneMode {
  let backend: IptablesBackend = "system";
  return {
    name: "iptables",

    async checkHost(ctx: ModeContext): Promise<void> {
      ctx.logger.info("Using iptables Proxier");
      backend = (await detectIptablesBackend(ctx.runner)).backend; // logs its choice and why
    },

    async probeFamilies(ctx: ModeContext): Promise<IPFamily[]> {
      const primary = ctx.primaryFamily;
      const secondary: IPFamily = primary === "IPv4" ? "IPv6" : "IPv4";
      const primaryErr = await familyWorks(ctx.runner, backend, primary);
      if (primaryErr !== null) {
        throw new ModeUnavailableError(
          "iptables",
          `iptables is not available on this host for ${primary}: ${primaryErr}` +
            ` (install iptables, or choose --proxy-mode=nftables)`,
        );
      }
      const err = await familyWorks(ctx.runner, backend, secondary);
      if (err === null) return [primary, secondary];
      ctx.logger.info("No iptables support for family", { ipFamily: secondary, error: err });
      return [primary];
    },

    createDataplanes(ctx: ModeContext, families: readonly IPFamily[]): Promise<Map<IPFamily, Dataplane>> {
      const o = ctx.options;
      const cfg = o.config;
      const out = new Map<IPFamily, Dataplane>();
      // nfacct counters belong to the node (network namespace), not to a family: one set for both.
      const nfacct = new NfacctCounters(ctx.runner, ctx.logger);
      registerNfacctMetrics((counter) => nfacct.packets(counter));
      for (const family of families) {
        const localTraffic = configuredLocalTraffic(o, ctx.podCIDRs, family);
        out.set(
          family,
          new IptablesDataplane({
            family,
            runner: ctx.runner,
            backend,
            masqueradeBit: o.masqueradeBit,
            masqueradeAll: o.masqueradeAll,
            localDetector: iptablesLocalMatch(localTraffic),
            nodePortAddresses: o.nodePortAddresses,
            localhostNodePorts: cfg.iptables.localhostNodePorts,
            // A specific bindAddress overrides the Node's IP of its family (upstream detectNodeIPs).
            nodeIP: cfg.bindAddress,
            syncPeriodMs: o.syncPeriod,
            nfacct,
          }),
        );
      }
      return Promise.resolve(out);
    },

    async cleanup(runner: CommandRunner, next: ProxyModeName | null, logger: Logger): Promise<CleanupReport> {
      // Before the ipvs mode, only what ipvs does not share; before nftables or for --cleanup, every chain.
      const ownsChain = next === "ipvs" ? isIptablesModeChain : isKubeProxyChain;
      const r = await removeIptablesLeftovers(runner, { ownsChain }, logger);
      return { removed: r.removed, failed: r.failed };
    },
  };
}
