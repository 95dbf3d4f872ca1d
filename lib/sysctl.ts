/**
 * Kernel settings through the `sysctl` program (Deno needs --allow-all to touch /proc/sys directly), for
 * every part of the agent that sets one: conntrack tuning, route_localnet, the ipvs mode's settings.
 *
 * A write is verified by reading the value back: `sysctl -w` exits 0 on some failures (a key that is
 * read-only in a network namespace, for one), and a "Set sysctl" log line for a value that never took effect
 * misleads whoever reads it.
 * @module
 */
import type { CommandRunner } from "./exec.ts";
import { log as rootLog, type Logger } from "./log.ts";

/** Reads a sysctl as text (`sysctl -n`); null when it cannot be read (missing key, no sysctl). */
export async function readSysctl(runner: CommandRunner, key: string): Promise<string | null> {
  try {
    const r = await runner.tryRun({ cmd: "sysctl", args: ["-n", key] });
    return r.code === 0 ? r.stdout.trim() : null;
  } catch {
    return null;
  }
}

/** Reads an integer sysctl; null when it cannot be read or is not a number. */
export async function readIntSysctl(runner: CommandRunner, key: string): Promise<number | null> {
  const s = await readSysctl(runner, key);
  if (s === null || s === "") return null;
  const n = Number(s);
  return Number.isFinite(n) ? n : null;
}

/** What {@linkcode ensureSysctl} did. */
export type SysctlOutcome = "unchanged" | "set" | "failed";

/**
 * Sets an integer sysctl when its current value differs, then reads it back. Logs "Set sysctl" only for a
 * value that took effect, and an error naming the key, the wanted and the actual value otherwise. Never throws.
 */
export async function ensureSysctl(
  runner: CommandRunner,
  key: string,
  value: number,
  logger: Logger = rootLog,
): Promise<SysctlOutcome> {
  const current = await readIntSysctl(runner, key);
  if (current === value) {
    logger.v(2).info("Sysctl already set", { name: key, value });
    return "unchanged";
  }
  let stderr = "";
  try {
    const r = await runner.tryRun({ cmd: "sysctl", args: ["-w", `${key}=${value}`] });
    if (r.code !== 0) stderr = r.stderr.trim() || `exit ${r.code}`;
  } catch (err) {
    stderr = (err as Error).message;
  }
  if (stderr !== "") {
    logger.error("Failed to set sysctl", stderr, { name: key, value, current });
    return "failed";
  }
  const after = await readIntSysctl(runner, key);
  if (after !== value) {
    logger.error("Failed to set sysctl", "the value did not change (read-only here?)", {
      name: key,
      value,
      current: after,
    });
    return "failed";
  }
  logger.info("Set sysctl", { name: key, value, previous: current });
  return "set";
}
