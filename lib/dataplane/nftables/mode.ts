/**
 * The nftables mode's factory: upstream's start-up checks (nft >= 1.0.1, kernel >= 5.13 unless
 * `KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK` is set), a family probe (`nft --check` of the family's
 * table), one {@linkcode NftablesDataplane} per family, and the removal of the `kube-proxy` tables.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { Dataplane, IPFamily } from "../../proxy/types.ts";
import { configuredLocalTraffic } from "../local_traffic.ts";
import { NftablesDataplane } from "./dataplane.ts";
import { localhostNodePortRejectedReader } from "./localhost_nodeport_counters.ts";
import { registerLocalhostNodePortMetrics, registerNftablesNetlinkMetrics } from "../../metrics.ts";
import {
  type CleanupReport,
  type DataplaneMode,
  type ModeContext,
  ModeUnavailableError,
  type ProxyModeName,
} from "../mode.ts";
import { TABLE } from "./names.ts";
import { NetlinkNftables } from "./netlink/nftables.ts";
import { NftablesRunner } from "./nft_runner.ts";
import { checkNftVersion, kernelVersionProblem, SKIP_KERNEL_CHECK_ENV } from "./versions.ts";

/** The table name upstream's nftables mode uses in both families. */
export const KUBE_PROXY_TABLE = TABLE;

async function tryRun(runner: CommandRunner, cmd: string, args: string[]) {
  try {
    return await runner.tryRun({ cmd, args, timeoutMs: 300_000 });
  } catch {
    return { code: 127, stdout: "", stderr: `${cmd}: not found` };
  }
}

/** Host facts the start-up checks read (tests replace them). */
export interface NftablesHost {
  /** The kernel release (`Deno.osRelease()`). */
  kernelRelease?: () => string;
  /** An environment variable (`Deno.env.get`). */
  env?: (name: string) => string | undefined;
}

/**
 * `--nftables-netlink`: the family's table access with partial syncs over the agent's own netlink socket, opened
 * now so that a missing `--allow-ffi` stops the start with the way out.
 */
function netlinkNftables(ctx: ModeContext, family: IPFamily): NetlinkNftables {
  const fam = family === "IPv6" ? "ip6" : "ip";
  const nl = new NetlinkNftables(new NftablesRunner({ family: fam, table: TABLE, runner: ctx.runner }));
  try {
    nl.open();
  } catch (err) {
    const hint = err instanceof Deno.errors.NotCapable
      ? " (it needs FFI: DKP_EXTRA_PERMISSIONS=--allow-ffi deno task start ..., or deno run --allow-ffi ...)"
      : "";
    throw new Error(`--nftables-netlink: cannot open a netlink socket: ${(err as Error).message}${hint}`);
  }
  registerNftablesNetlinkMetrics();
  ctx.logger.info("nftables partial syncs go over netlink (--nftables-netlink)", { ipFamily: family });
  return nl;
}

/** A fresh nftables mode. */
export function newNftablesMode(host: NftablesHost = {}): DataplaneMode {
  const kernelRelease = host.kernelRelease ?? (() => Deno.osRelease());
  const env = host.env ?? ((name: string) => Deno.env.get(name));
  return {
    name: "nftables",

    async checkHost(ctx: ModeContext): Promise<void> {
      ctx.logger.info("Using nftables Proxier");
      try {
        await checkNftVersion(ctx.runner);
      } catch (err) {
        throw new ModeUnavailableError(
          "nftables",
          `nftables mode needs nft >= 1.0.1: ${(err as Error).message}`,
        );
      }
      const release = kernelRelease();
      const problem = kernelVersionProblem(release, env(SKIP_KERNEL_CHECK_ENV));
      if (problem !== undefined) {
        throw new ModeUnavailableError(
          "nftables",
          `${problem} (this is ${release}; set ${SKIP_KERNEL_CHECK_ENV} to try anyway)`,
        );
      }
    },

    async probeFamilies(ctx: ModeContext): Promise<IPFamily[]> {
      const works = async (family: IPFamily) => {
        const fam = family === "IPv6" ? "ip6" : "ip";
        const r = await ctx.runner.tryRun({
          cmd: "nft",
          args: ["--check", "-f", "-"],
          stdin: `add table ${fam} ${KUBE_PROXY_TABLE}\n`,
        }).catch((err: Error) => ({ code: 1, stdout: "", stderr: err.message }));
        return r.code === 0 ? null : r.stderr.trim() || `exit ${r.code}`;
      };
      const primary = ctx.primaryFamily;
      const secondary: IPFamily = primary === "IPv4" ? "IPv6" : "IPv4";
      const err = await works(primary);
      if (err !== null) {
        throw new ModeUnavailableError(
          "nftables",
          `nftables is not usable for ${primary} on this host: ${err}`,
        );
      }
      const err2 = await works(secondary);
      if (err2 === null) return [primary, secondary];
      ctx.logger.info("No nftables support for family", { ipFamily: secondary, error: err2 });
      return [primary];
    },

    createDataplanes(ctx: ModeContext, families: readonly IPFamily[]): Promise<Map<IPFamily, Dataplane>> {
      const o = ctx.options;
      const cfg = o.config;
      const out = new Map<IPFamily, Dataplane>();
      const localhostNodePorts = o.featureGates["KubeProxyNFTablesLocalhostNodePorts"] ?? false;
      // Upstream registers these three only in nftables mode with the gate on.
      if (localhostNodePorts) {
        registerLocalhostNodePortMetrics(localhostNodePortRejectedReader(ctx.runner, families, ctx.logger));
      }
      for (const family of families) {
        const nftables = o.nftablesNetlink ? netlinkNftables(ctx, family) : undefined;
        out.set(
          family,
          new NftablesDataplane({
            family,
            runner: ctx.runner,
            ...(nftables !== undefined ? { nftables } : {}),
            masqueradeBit: o.masqueradeBit,
            masqueradeAll: o.masqueradeAll,
            localTraffic: configuredLocalTraffic(o, ctx.podCIDRs, family),
            nodePortAddresses: o.nodePortAddresses,
            nodeIP: cfg.bindAddress,
            logger: ctx.logger,
            localhostNodePorts,
          }),
        );
      }
      return Promise.resolve(out);
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
