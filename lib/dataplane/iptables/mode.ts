/**
 * The iptables mode's factory: backend detection (legacy or nft, as upstream's image does), the family probe
 * (`iptables -t nat -S POSTROUTING` per family, as upstream's `Present()`), one {@linkcode IptablesDataplane}
 * per family, and the removal of this mode's chains.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import { detectIptablesBackend, type IptablesBackend, probeIptablesFamilies } from "../iptables_backend.ts";
import { KUBELET_CHAINS, removeIptablesLeftovers } from "../iptables_leftovers.ts";
import { configuredLocalTraffic } from "../local_traffic.ts";
import type { CleanupReport, DataplaneMode, ModeContext, ProxyModeName } from "../mode.ts";
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

/** A fresh iptables mode. */
export function newIptablesMode(): DataplaneMode {
  let backend: IptablesBackend = "system";
  return {
    name: "iptables",

    async checkHost(ctx: ModeContext): Promise<void> {
      ctx.logger.info("Using iptables Proxier");
      backend = (await detectIptablesBackend(ctx.runner)).backend; // logs its choice and why
    },

    probeFamilies(ctx: ModeContext): Promise<IPFamily[]> {
      return probeIptablesFamilies(
        ctx,
        backend,
        "iptables",
        "install iptables, or choose --proxy-mode=nftables",
      );
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
