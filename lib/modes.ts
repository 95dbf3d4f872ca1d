/**
 * The mode registry: `--proxy-mode` name → factory, and the cleanups that run across modes (the other modes'
 * leftovers at every start, as upstream's `platformCleanup`; every mode's for `--cleanup`).
 * @module
 */
import type { CommandRunner } from "./exec.ts";
import type { Logger } from "./log.ts";
import { newIptablesMode } from "./dataplane/iptables/mode.ts";
import { newIpvsMode } from "./dataplane/ipvs/mode.ts";
import type { DataplaneMode, ProxyModeName } from "./dataplane/mode.ts";
import { PROXY_MODES } from "./dataplane/mode.ts";
import { newNftablesMode } from "./dataplane/nftables/mode.ts";

const FACTORIES: Record<ProxyModeName, () => DataplaneMode> = {
  iptables: newIptablesMode,
  ipvs: newIpvsMode,
  nftables: newNftablesMode,
};

/** A fresh instance of the mode `--proxy-mode` names. */
export function newDataplaneMode(name: ProxyModeName): DataplaneMode {
  return FACTORIES[name]();
}

async function runCleanups(
  runner: CommandRunner,
  modes: readonly ProxyModeName[],
  next: ProxyModeName | null,
  logger: Logger,
): Promise<boolean> {
  let failed = false;
  for (const name of modes) {
    const r = await newDataplaneMode(name).cleanup(runner, next, logger);
    failed ||= r.failed;
    if (r.removed.length > 0) {
      logger.info(next === null ? "Removed kube-proxy rules" : "Removed leftovers of another proxy mode", {
        mode: name,
        removed: r.removed,
      });
    } else logger.v(2).info("No leftovers of proxy mode", { mode: name });
  }
  return failed;
}

/**
 * Removes every other mode's leftovers before `mode` starts (upstream `platformCleanup`, extended to the
 * ipvs ↔ iptables switch, which upstream leaves to the operator). Best effort: resolves true when something
 * could not be removed (logged), and the agent goes on.
 */
export function cleanupOtherModes(
  runner: CommandRunner,
  mode: ProxyModeName,
  logger: Logger,
): Promise<boolean> {
  return runCleanups(runner, PROXY_MODES.filter((m) => m !== mode), mode, logger);
}

/** `--cleanup`: every mode's rules; resolves true when something could not be removed. */
export function cleanupAllModes(runner: CommandRunner, logger: Logger): Promise<boolean> {
  return runCleanups(runner, PROXY_MODES, null, logger);
}
