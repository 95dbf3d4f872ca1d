/**
 * A private xtables lock for the iptables calls that tests, the demo and the scale harness make in their
 * own network namespaces. iptables-legacy serialises on `/run/xtables.lock`, which is host-wide: other
 * iptables users on the machine (another engineer's benchmark, the host's firewall) made `-w` waits time
 * out ("Can't lock /run/xtables.lock"). A namespace's tables are its own, so its lock can be too, as in
 * bench/iptables_bench.ts. The lock is handed down through the environment: `XTABLES_LOCKFILE` is read by
 * the iptables binaries, not by Deno, and children inherit the whole environment even when `--allow-env`
 * lists only a few names, so the agent needs no extra permission for it.
 * @module
 */

/** The variable iptables-legacy (1.6.2+) reads for its lock file. */
export const XTABLES_LOCKFILE_ENV = "XTABLES_LOCKFILE";

let created: string | undefined;

/**
 * Makes every program this process starts from now on use a private lock file (kept if the variable is
 * already set, e.g. by the developer's shell); returns its path. The file is removed at exit.
 */
export function usePrivateXtablesLock(): string {
  const existing = Deno.env.get(XTABLES_LOCKFILE_ENV);
  if (existing) return existing;
  created = Deno.makeTempFileSync({ prefix: "dkp-xtables-", suffix: ".lock" });
  Deno.env.set(XTABLES_LOCKFILE_ENV, created);
  globalThis.addEventListener("unload", () => {
    try {
      if (created) Deno.removeSync(created);
    } catch { /* gone */ }
  });
  return created;
}
