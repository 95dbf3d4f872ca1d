/**
 * Which iptables backend (legacy or nft) the host already uses, detected the way upstream's
 * kubernetes-sigs/iptables-wrappers does, and the program names that go with it.
 * @module
 */

import type { CommandRunner } from "../exec.ts";
import type { IPFamily } from "../proxy/types.ts";
import { log } from "../log.ts";
import { type ModeContext, ModeUnavailableError, probeFamilyPair, type ProxyModeName } from "./mode.ts";

/** `legacy` / `nft` select `iptables-legacy*` / `iptables-nft*`; `system` uses plain `iptables*`. */
export type IptablesBackend = "legacy" | "nft" | "system";

/** The programs of one backend and family. */
export interface IptablesTools {
  readonly backend: IptablesBackend;
  readonly family: IPFamily;
  readonly iptables: string;
  readonly save: string;
  readonly restore: string;
}

/** Program names for a backend and family, e.g. `ip6tables-nft-restore`. */
export function iptablesTools(backend: IptablesBackend, family: IPFamily): IptablesTools {
  const base = family === "IPv6" ? "ip6tables" : "iptables";
  const mid = backend === "system" ? "" : `-${backend}`;
  return {
    backend,
    family,
    iptables: base + mid,
    save: `${base}${mid}-save`,
    restore: `${base}${mid}-restore`,
  };
}

/**
 * Whether iptables works for `family` on this host (`iptables -t nat -S POSTROUTING`, as upstream's
 * `Present()`): null, or the reason it does not.
 */
export async function iptablesFamilyWorks(
  runner: CommandRunner,
  backend: IptablesBackend,
  family: IPFamily,
): Promise<string | null> {
  const cmd = iptablesTools(backend, family).iptables;
  try {
    const r = await runner.tryRun({ cmd, args: ["-w", "5", "-t", "nat", "-S", "POSTROUTING"] });
    return r.code === 0 ? null : r.stderr.trim() || `${cmd} exited ${r.code}`;
  } catch (err) {
    return `${cmd}: ${(err as Error).message}`;
  }
}

/**
 * The families an iptables-based mode serves ({@linkcode probeFamilyPair} with {@linkcode iptablesFamilyWorks}):
 * the primary failing makes `mode` unavailable, with `advice` (what to do) after the reason.
 */
export function probeIptablesFamilies(
  ctx: ModeContext,
  backend: IptablesBackend,
  mode: ProxyModeName,
  advice: string,
): Promise<IPFamily[]> {
  return probeFamilyPair(
    ctx,
    "iptables",
    (family) => iptablesFamilyWorks(ctx.runner, backend, family),
    (err) =>
      new ModeUnavailableError(
        mode,
        `iptables is not available on this host for ${ctx.primaryFamily}: ${err} (${advice})`,
      ),
  );
}

/** The outcome of {@linkcode detectIptablesBackend}. */
export interface BackendDetection {
  readonly backend: "legacy" | "nft";
  /** Human-readable reason, logged at startup. */
  readonly reason: string;
}

const KUBELET_CHAINS = /^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\b/m;

async function save(runner: CommandRunner, cmd: string, args: string[]): Promise<string | null> {
  try {
    const r = await runner.tryRun({ cmd, args, timeoutMs: 30_000 });
    return r.code === 0 ? r.stdout : null;
  } catch {
    return null; // not installed
  }
}

function countRules(out: string | null): number {
  if (!out) return 0;
  let n = 0;
  for (const line of out.split("\n")) if (line.startsWith("-")) n++;
  return n;
}

/**
 * Detects the host's backend as iptables-wrappers does:
 * 1. kubelet's `KUBE-IPTABLES-HINT` / `KUBE-KUBELET-CANARY` in `iptables-nft-save -t mangle` (then ip6) → nft;
 * 2. the same chains in a full `iptables-legacy-save` (then ip6; no `-t mangle`, which would create the
 *    legacy table) → legacy;
 * 3. otherwise the older script's rule: more `-A` rules under legacy than under nft → legacy;
 * 4. otherwise nft. Missing binaries count as "no rules". Logs the choice and why.
 */
export async function detectIptablesBackend(runner: CommandRunner): Promise<BackendDetection> {
  let result: BackendDetection | null = null;
  for (const cmd of ["iptables-nft-save", "ip6tables-nft-save"]) {
    const out = await save(runner, cmd, ["-t", "mangle"]);
    if (out && KUBELET_CHAINS.test(out)) {
      result = {
        backend: "nft",
        reason: `kubelet chains (KUBE-IPTABLES-HINT/KUBE-KUBELET-CANARY) found by ${cmd}`,
      };
      break;
    }
  }
  const legacyOut: (string | null)[] = [];
  if (!result) {
    for (const cmd of ["iptables-legacy-save", "ip6tables-legacy-save"]) {
      const out = await save(runner, cmd, []);
      legacyOut.push(out);
      if (out && KUBELET_CHAINS.test(out)) {
        result = {
          backend: "legacy",
          reason: `kubelet chains (KUBE-IPTABLES-HINT/KUBE-KUBELET-CANARY) found by ${cmd}`,
        };
        break;
      }
    }
  }
  if (!result) {
    const legacy = countRules(legacyOut[0] ?? null) + countRules(legacyOut[1] ?? null);
    const nft = countRules(await save(runner, "iptables-nft-save", [])) +
      countRules(await save(runner, "ip6tables-nft-save", []));
    result = legacy > nft
      ? { backend: "legacy", reason: `no kubelet chains; ${legacy} legacy rules > ${nft} nft rules` }
      : {
        backend: "nft",
        reason: `no kubelet chains; ${legacy} legacy rules <= ${nft} nft rules (default nft)`,
      };
  }
  log.info("Detected iptables backend", { backend: result.backend, reason: result.reason });
  return result;
}
