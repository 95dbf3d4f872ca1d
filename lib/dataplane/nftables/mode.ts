/**
 * The nftables mode's factory. Today it only cleans up: the `ip kube-proxy` and `ip6 kube-proxy` tables.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import {
  type CleanupReport,
  type DataplaneMode,
  type ModeContext,
  ModeUnavailableError,
  type ProxyModeName,
} from "../mode.ts";

/** The table name upstream's nftables mode uses in both families. */
export const KUBE_PROXY_TABLE = "kube-proxy";

async function tryRun(runner: CommandRunner, cmd: string, args: string[]) {
  try {
    return await runner.tryRun({ cmd, args, timeoutMs: 300_000 });
  } catch {
    return { code: 127, stdout: "", stderr: `${cmd}: not found` };
  }
}

/** A fresh nftables mode. */
export function newNftablesMode(): DataplaneMode {
  const notYet = () =>
    new ModeUnavailableError(
      "nftables",
      'proxy mode "nftables" is not implemented yet; use --proxy-mode=iptables',
    );
  return {
    name: "nftables",
    checkHost(_ctx: ModeContext): Promise<void> {
      return Promise.reject(notYet());
    },
    probeFamilies(_ctx: ModeContext): Promise<IPFamily[]> {
      return Promise.reject(notYet());
    },
    createDataplanes(_ctx: ModeContext, _families: readonly IPFamily[]): Promise<Map<IPFamily, Dataplane>> {
      return Promise.reject(notYet());
    },

    async cleanup(
      runner: CommandRunner,
      _next: ProxyModeName | null,
      logger: Logger,
    ): Promise<CleanupReport> {
      const removed: string[] = [];
      let failed = false;
      const tables = await tryRun(runner, "nft", ["list", "tables"]);
      if (tables.code !== 0) return { removed, failed }; // no nft, or no nf_tables in the kernel
      for (const family of ["ip", "ip6"]) {
        if (!new RegExp(`^table ${family} ${KUBE_PROXY_TABLE}$`, "m").test(tables.stdout)) continue;
        const r = await tryRun(runner, "nft", ["delete", "table", family, KUBE_PROXY_TABLE]);
        if (r.code === 0) removed.push(`nftables table ${family} ${KUBE_PROXY_TABLE}`);
        else {
          logger.error("Failed to delete nftables table", r.stderr.trim(), {
            table: `${family} ${KUBE_PROXY_TABLE}`,
          });
          failed = true;
        }
      }
      return { removed, failed };
    },
  };
}
