/**
 * What a proxy mode (iptables, nftables, ipvs) implements to plug into the agent. Each mode is one folder
 * under `lib/dataplane/` exporting one {@linkcode DataplaneMode} factory; the agent picks it by
 * `--proxy-mode` and holds no mode-specific code. `docs/adding-a-dataplane.md` walks through it.
 *
 * Start-up order (the agent's, as upstream's): the other modes' {@linkcode DataplaneMode.cleanup}, then this
 * mode's {@linkcode DataplaneMode.checkHost}, {@linkcode DataplaneMode.probeFamilies} and
 * {@linkcode DataplaneMode.createDataplanes}; from then on only `Dataplane.sync` runs.
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import type { CommandRunner } from "../exec.ts";
import type { Logger } from "../log.ts";
import type { Dataplane, IPFamily } from "../proxy/types.ts";

/** The modes, as `--proxy-mode` spells them. */
export type ProxyModeName = "iptables" | "nftables" | "ipvs";

/** Every mode, in the order `--cleanup` visits them. */
export const PROXY_MODES: readonly ProxyModeName[] = ["iptables", "ipvs", "nftables"];

/** What the agent knows when a mode starts. */
export interface ModeContext {
  readonly runner: CommandRunner;
  readonly options: ProxyOptions;
  /** The Node's IPs, primary first (upstream's NodeManager.NodeIPs). */
  readonly nodeIPs: readonly string[];
  /** The Node's `spec.podCIDRs` (for detectLocalMode NodeCIDR). */
  readonly podCIDRs: readonly string[];
  /** The primary IP family (upstream's detectNodeIPs: bindAddress, then the Node). */
  readonly primaryFamily: IPFamily;
  readonly logger: Logger;
  /** Records a Warning Event on this Node (e.g. the ipvs deprecation notice). */
  warningEvent(reason: string, note: string): void;
}

/** Raised when the host cannot run a mode; the message says what is missing and what to do. */
export class ModeUnavailableError extends Error {
  constructor(readonly mode: ProxyModeName, message: string) {
    super(message);
    this.name = "ModeUnavailableError";
  }
}

/** What a mode's cleanup found and removed. */
export interface CleanupReport {
  /** Human-readable items removed (empty when there was nothing to remove). */
  readonly removed: readonly string[];
  /** Something could not be removed (already logged). */
  readonly failed: boolean;
}

/** One proxy mode. A fresh object per agent run: a mode may keep what it learned in checkHost. */
export interface DataplaneMode {
  readonly name: ProxyModeName;
  /**
   * Checks the host at start: the programs the mode runs and the kernel features it needs.
   * @throws {ModeUnavailableError} With an actionable message when the mode cannot run here.
   */
  checkHost(ctx: ModeContext): Promise<void>;
  /**
   * The IP families the mode can serve on this host, the primary first. A secondary family that does not
   * work is left out (logged); the primary not working throws {@linkcode ModeUnavailableError}.
   */
  probeFamilies(ctx: ModeContext): Promise<IPFamily[]>;
  /** One dataplane per family, with whatever per-node helpers the families share. */
  createDataplanes(ctx: ModeContext, families: readonly IPFamily[]): Promise<Map<IPFamily, Dataplane>>;
  /**
   * Removes what this mode leaves in the kernel. `next` is the mode about to start on this node (objects it
   * shares with this one stay, so that its restart does not blackhole), or null for `--cleanup` (everything).
   * Idempotent; missing programs, tables or kernel modules are not errors.
   */
  cleanup(runner: CommandRunner, next: ProxyModeName | null, logger: Logger): Promise<CleanupReport>;
}

/**
 * The families a mode serves, as every mode probes them: the primary must work (else `unavailable(error)` is
 * thrown), the other family is added when it works too and logged as unsupported (`No <tool> support for
 * family`) when not. `works` resolves with null, or the reason the family cannot be used.
 */
export async function probeFamilyPair(
  ctx: ModeContext,
  tool: string,
  works: (family: IPFamily) => Promise<string | null>,
  unavailable: (error: string) => ModeUnavailableError,
): Promise<IPFamily[]> {
  const primary = ctx.primaryFamily;
  const secondary: IPFamily = primary === "IPv4" ? "IPv6" : "IPv4";
  const primaryErr = await works(primary);
  if (primaryErr !== null) throw unavailable(primaryErr);
  const err = await works(secondary);
  if (err === null) return [primary, secondary];
  ctx.logger.info(`No ${tool} support for family`, { ipFamily: secondary, error: err });
  return [primary];
}
