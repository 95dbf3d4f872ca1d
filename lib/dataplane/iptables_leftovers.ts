/**
 * Removal of kube-proxy's iptables chains, for the modes that write iptables rules (iptables and ipvs) when
 * another mode starts and for `--cleanup`. Both families and both backends (legacy and nft) are searched,
 * because a node may have run either; tables filter, nat and mangle.
 *
 * Each backend/family pair costs one `*-save` and, when anything matches, one `*-restore --noflush` that
 * deletes the rules elsewhere that jump to a removed chain (or that a mode asks to drop, e.g. ipset matches),
 * flushes the chains and deletes them, atomically per table. Missing tools and tables are not errors.
 * @module
 */
import { chainLine, deleteChainLine } from "./iptables_rule.ts";
import type { CommandRunner } from "../exec.ts";
import type { Logger } from "../log.ts";

/** Which chains and rules a cleanup removes. */
export interface IptablesLeftoverSelector {
  /** The chain is ours to flush and delete. */
  ownsChain(chain: string): boolean;
  /** Also delete this rule of a chain that stays (jumps to owned chains are always deleted). */
  dropsRule?(rule: string): boolean;
}

/** kubelet's chains: never ours, even though they start with `KUBE-`. */
export const KUBELET_CHAINS: ReadonlySet<string> = new Set([
  "KUBE-FIREWALL",
  "KUBE-KUBELET-CANARY",
  "KUBE-IPTABLES-HINT",
]);

const TABLES = new Set(["filter", "nat", "mangle"]);

/**
 * Builds the restore payload that removes the selected chains and rules from one `iptables-save` dump; ""
 * when there is nothing to do.
 */
export function iptablesCleanupPayload(save: string, sel: IptablesLeftoverSelector): string {
  let out = "";
  let table = "";
  let chains: string[] = [];
  let deletes: string[] = [];
  const flush = () => {
    if (table && TABLES.has(table) && (chains.length || deletes.length)) {
      out += `*${table}\n`;
      for (const c of chains) out += chainLine(c);
      for (const d of deletes) out += d + "\n";
      for (const c of chains) out += deleteChainLine(c);
      out += "COMMIT\n";
    }
    chains = [];
    deletes = [];
  };
  for (const line of save.split("\n")) {
    if (line.startsWith("*")) {
      flush();
      table = line.slice(1).trim();
    } else if (line.startsWith(":")) {
      const c = line.slice(1).split(" ")[0];
      if (sel.ownsChain(c)) chains.push(c);
    } else if (line.startsWith("-A ")) {
      const chain = line.slice(3, line.indexOf(" ", 3));
      if (sel.ownsChain(chain)) continue; // flushed with the chain
      const m = line.match(/ -[jg] (\S+)/);
      if ((m && sel.ownsChain(m[1])) || sel.dropsRule?.(line)) deletes.push("-D " + line.slice(3));
    } else if (line.startsWith("COMMIT")) {
      flush();
      table = "";
    }
  }
  flush();
  return out;
}

/** What {@linkcode removeIptablesLeftovers} did. */
export interface IptablesLeftoverResult {
  /** `tool: N chains, M rules` per backend/family that had something. */
  readonly removed: string[];
  readonly failed: boolean;
}

async function tryRun(runner: CommandRunner, cmd: string, args: string[], stdin?: string) {
  try {
    return await runner.tryRun({ cmd, args, stdin, timeoutMs: 300_000 });
  } catch {
    return { code: 127, stdout: "", stderr: `${cmd}: not found` };
  }
}

/** Removes the selected chains and rules in every iptables backend and family that has them. */
export async function removeIptablesLeftovers(
  runner: CommandRunner,
  sel: IptablesLeftoverSelector,
  logger: Logger,
): Promise<IptablesLeftoverResult> {
  const removed: string[] = [];
  let failed = false;
  for (const base of ["iptables", "ip6tables"]) {
    for (const backend of ["legacy", "nft"]) {
      const tool = `${base}-${backend}`;
      const save = await tryRun(runner, `${tool}-save`, []);
      if (save.code !== 0) continue; // not installed, or no such tables
      const payload = iptablesCleanupPayload(save.stdout, sel);
      if (!payload) continue;
      const r = await tryRun(runner, `${tool}-restore`, ["--noflush", "-w", "5"], payload);
      if (r.code !== 0) {
        logger.error("Failed to remove iptables leftovers", r.stderr.trim(), { tool });
        failed = true;
        continue;
      }
      const chains = payload.match(/^-X /gm)?.length ?? 0;
      const rules = payload.match(/^-D /gm)?.length ?? 0;
      removed.push(`${tool}: ${chains} chains, ${rules} rules`);
    }
  }
  return { removed, failed };
}
