/**
 * iptables pieces shared by the modes that write iptables rules (iptables and ipvs): the
 * jump rules from built-in chains into kube-proxy's chains, and the `iptables-save` scan that finds which of
 * them are missing (upstream ensures them with `EnsureRule(Prepend, ...)` on every full sync).
 * @module
 */

import { ownString } from "../flat_string.ts";
import { comment, insertLine, jump, type RuleArgs, words } from "./iptables_rule.ts";

/** A jump from a built-in chain into one of ours (upstream `iptablesJumpChains`). */
export interface JumpRule {
  readonly table: "filter" | "nat";
  readonly from: string;
  readonly to: string;
  /** Match arguments placed before the comment. */
  readonly extra: string;
  /** "" for no comment. */
  readonly comment: string;
}

/** The arguments of a jump rule. */
function jumpRuleArgs(j: JumpRule): RuleArgs {
  return [words(j.extra), j.comment ? comment(j.comment) : [], jump(j.to)];
}

/** True when an `iptables-save` rule line is this jump (as iptables-save prints it). */
export function isJumpLine(line: string, j: JumpRule): boolean {
  if (!line.startsWith(`-A ${j.from} `) || !line.endsWith(` -j ${j.to}`)) return false;
  if (j.comment === "") return !line.includes("--comment");
  return line.includes(`--comment "${j.comment}"`);
}

const BUILTIN = new Set(["INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"]);

/** What one table's `iptables-save -t TABLE` holds, as far as the jump checks need it. */
export interface SavedTable {
  /** Every chain declared (`:NAME ...`). */
  readonly chains: Set<string>;
  /** Rules of the built-in chains, by chain. */
  readonly builtinRules: Map<string, string[]>;
}

/**
 * Reads one table's `iptables-save` output line by line (a big table's listing, tens of MiB at 10k Services, is
 * never held whole): only chain names and the built-in chains' rules are kept, as copies that do not pin the
 * output's chunks.
 */
export class SavedTableReader implements SavedTable {
  readonly chains = new Set<string>();
  readonly builtinRules = new Map<string, string[]>();

  /** Takes one line of the output (without its newline). */
  readonly line = (line: string): void => {
    if (line.startsWith(":")) {
      const sp = line.indexOf(" ");
      this.chains.add(ownString(line.slice(1, sp > 0 ? sp : undefined)));
    } else if (line.startsWith("-A ")) {
      const chain = line.slice(3, line.indexOf(" ", 3));
      if (BUILTIN.has(chain)) {
        let l = this.builtinRules.get(chain);
        if (!l) this.builtinRules.set(chain, l = []);
        l.push(ownString(line));
      }
    }
  };
}

/** Parses one table's whole `iptables-save` output. */
export function parseSavedTable(save: string): SavedTable {
  const reader = new SavedTableReader();
  for (const line of save.split("\n")) reader.line(line);
  return reader;
}

/** True when the saved table already has the jump. */
export function hasJump(saved: SavedTable, j: JumpRule): boolean {
  return (saved.builtinRules.get(j.from) ?? []).some((l) => isJumpLine(l, j));
}

/**
 * `-I FROM 1 ...` restore lines for the jumps of `table` missing from the saved table, in the given order:
 * upstream prepends each jump in order, so the last one ends up first, and `-I 1` in the same order does that.
 */
export function missingJumpLines(saved: SavedTable, table: string, jumps: readonly JumpRule[]): string {
  let out = "";
  for (const j of jumps) {
    if (j.table !== table || hasJump(saved, j)) continue;
    out += insertLine(j.from, 1, ...jumpRuleArgs(j));
  }
  return out;
}
