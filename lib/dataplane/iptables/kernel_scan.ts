/**
 * What the kernel holds, read on every full sync: one `iptables-save` per table lists existing chains
 * (leftovers) and which jump rules are missing; kubelet's KUBE-FIREWALL jumps, when the payload does not own
 * that chain, are ensured with plain iptables calls after the restore.
 * @module
 */

import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { IptablesTools } from "../iptables_backend.ts";
import { hasJump, type JumpRule, missingJumpLines, SavedTableReader } from "../iptables_jumps.ts";
import { JUMP_RULES, KUBELET_JUMP_RULES } from "./static_rules.ts";

/** What an `iptables-save` scan found. */
export interface ScanResult {
  chains: { filter: Set<string>; nat: Set<string> };
  missingJumps: { filter: string; nat: string };
  /**
   * kubelet's KUBE-FIREWALL jumps missing while the payload does not own KUBE-FIREWALL (no localhost NodePorts):
   * ensured with plain iptables calls after the restore, as upstream's EnsureChain/EnsureRule do.
   */
  missingKubeletJumps: JumpRule[];
}

/**
 * One iptables-save per table: existing chains (leftovers) and which jump rules are missing.
 * `ownsKubeletChain`: the payload declares KUBE-FIREWALL (localhost NodePorts on).
 */
export async function scanTables(
  runner: CommandRunner,
  tools: IptablesTools,
  ownsKubeletChain: boolean,
): Promise<ScanResult> {
  const res: ScanResult = {
    chains: { filter: new Set(), nat: new Set() },
    missingJumps: { filter: "", nat: "" },
    missingKubeletJumps: [],
  };
  // Upstream ensures kubelet's KUBE-FIREWALL jumps on every full sync in both families, whatever
  // localhostNodePorts says (only the chain's "block incoming localnet connections" rule depends on it). When
  // the payload declares KUBE-FIREWALL (localhost NodePorts on) the jumps go into the payload with the others;
  // otherwise the payload must not declare the chain (that would flush kubelet's rules in it), so they are
  // ensured with separate calls after the restore (see ensureKubeletJumps).
  const jumps = [...JUMP_RULES, ...(ownsKubeletChain ? KUBELET_JUMP_RULES : [])];
  for (const table of ["filter", "nat"] as const) {
    const saved = new SavedTableReader();
    await runner.run({
      cmd: tools.save,
      args: ["-t", table],
      timeoutMs: 120_000,
      stdoutLines: saved.line,
    });
    for (const c of saved.chains) res.chains[table].add(c);
    res.missingJumps[table] = missingJumpLines(saved, table, jumps);
    if (table === "filter" && !ownsKubeletChain) {
      for (const j of KUBELET_JUMP_RULES) if (!hasJump(saved, j)) res.missingKubeletJumps.push(j);
    }
  }
  return res;
}

/**
 * Upstream's EnsureChain(filter, KUBE-FIREWALL) + EnsureRule(Prepend, INPUT/OUTPUT, -j KUBE-FIREWALL) when the
 * payload does not own the chain. Runs after the restore so that, as upstream's loop (kube-proxy's jumps first,
 * then kubelet's, each prepended) leaves them, the KUBE-FIREWALL jumps end up first. A failure is logged and
 * false returned (the caller makes the next sync full, which retries).
 */
export async function ensureKubeletJumps(
  runner: CommandRunner,
  tools: IptablesTools,
  log: Logger,
  scan: ScanResult,
): Promise<boolean> {
  const missing = scan.missingKubeletJumps;
  if (missing.length === 0) return true;
  const chain = missing[0].to;
  const calls: string[][] = [];
  if (!scan.chains.filter.has(chain)) calls.push(["-w", "5", "-t", "filter", "-N", chain]);
  for (const j of missing) calls.push(["-w", "5", "-t", "filter", "-I", j.from, "1", "-j", j.to]);
  for (const args of calls) {
    const r = await runner.tryRun({ cmd: tools.iptables, args, timeoutMs: 15_000 });
    // "-N" of a chain kubelet created meanwhile fails with "Chain already exists": that is fine.
    if (r.code !== 0 && !(args.includes("-N") && /already exists/i.test(r.stderr))) {
      log.error("Failed to ensure chain jumps", r.stderr.trim(), {
        table: "filter",
        args: args.join(" "),
      });
      return false;
    }
  }
  return true;
}
