/**
 * `kube-proxy --cleanup`: removes what any kube-proxy mode (ours or upstream's) may have left behind, in both
 * IP families and both iptables backends, then exits. Idempotent; missing tools, tables or kernel modules are
 * not errors.
 *
 * - iptables (legacy and nft, v4 and v6; tables filter, nat, mangle): every `KUBE-*` chain is flushed and
 *   deleted, and every rule elsewhere that jumps to one is deleted, in one `iptables-restore --noflush` per
 *   table. As upstream, kubelet's chains (`KUBE-FIREWALL`, `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`) stay
 *   unless `includeKubeletChains` is set.
 * - ipvs: when the `kube-ipvs0` dummy link exists, all IPVS virtual servers are flushed (`ipvsadm -C`, as
 *   upstream) and the link is deleted; `KUBE-*` ipsets are destroyed (after the iptables rules using them).
 * - nftables: `delete table ip kube-proxy` and `ip6 kube-proxy`.
 * @module
 */

import type { CommandRunner } from "./exec.ts";
import { log } from "./log.ts";

/** Options of {@linkcode cleanupLeftovers}. */
export interface CleanupOptions {
  /** Also remove kubelet's KUBE-FIREWALL / KUBE-KUBELET-CANARY / KUBE-IPTABLES-HINT. Default false. */
  includeKubeletChains?: boolean;
}

const KUBELET_CHAINS = new Set(["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"]);
const TABLES = new Set(["filter", "nat", "mangle"]);

async function tryRun(runner: CommandRunner, cmd: string, args: string[], stdin?: string) {
  try {
    return await runner.tryRun({ cmd, args, stdin, timeoutMs: 300_000 });
  } catch {
    return { code: 127, stdout: "", stderr: `${cmd}: not found` };
  }
}

/**
 * Builds the restore payload that removes our chains from one `iptables-save` dump; "" when nothing to do.
 * Exported for tests.
 */
export function iptablesCleanupPayload(save: string, includeKubelet = false): string {
  const owned = (c: string) => c.startsWith("KUBE-") && (includeKubelet || !KUBELET_CHAINS.has(c));
  let out = "";
  let table = "";
  let chains: string[] = [];
  let deletes: string[] = [];
  const flush = () => {
    if (table && TABLES.has(table) && (chains.length || deletes.length)) {
      out += `*${table}\n`;
      for (const c of chains) out += `:${c} - [0:0]\n`;
      for (const d of deletes) out += d + "\n";
      for (const c of chains) out += `-X ${c}\n`;
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
      if (owned(c)) chains.push(c);
    } else if (line.startsWith("-A ")) {
      const sp = line.indexOf(" ", 3);
      const chain = line.slice(3, sp);
      if (owned(chain)) continue; // flushed with the chain
      const m = line.match(/ -[jg] (\S+)/);
      if (m && owned(m[1])) deletes.push("-D " + line.slice(3));
    } else if (line.startsWith("COMMIT")) {
      flush();
      table = "";
    }
  }
  flush();
  return out;
}

/** Removes kube-proxy leftovers of every mode. Resolves true when an error was encountered (upstream). */
export async function cleanupLeftovers(runner: CommandRunner, opts: CleanupOptions = {}): Promise<boolean> {
  let encounteredError = false;

  // ipvs: flush virtual servers only when our dummy link says ipvs mode ran here.
  const link = await tryRun(runner, "ip", ["link", "show", "kube-ipvs0"]);
  if (link.code === 0) {
    const r = await tryRun(runner, "ipvsadm", ["-C"]);
    if (r.code !== 0 && r.code !== 127) {
      log.info("ipvsadm -C failed (no IPVS in the kernel?)", { stderr: r.stderr.trim() });
    }
    const d = await tryRun(runner, "ip", ["link", "del", "kube-ipvs0"]);
    if (d.code !== 0) {
      log.error("Failed to delete dummy interface kube-ipvs0", d.stderr.trim());
      encounteredError = true;
    }
  }

  // iptables, both backends and families.
  for (const base of ["iptables", "ip6tables"]) {
    for (const backend of ["legacy", "nft"]) {
      const save = await tryRun(runner, `${base}-${backend}-save`, []);
      if (save.code !== 0) continue; // not installed, or no such tables
      const payload = iptablesCleanupPayload(save.stdout, opts.includeKubeletChains ?? false);
      if (!payload) continue;
      const r = await tryRun(runner, `${base}-${backend}-restore`, ["--noflush", "-w", "5"], payload);
      if (r.code !== 0) {
        log.error("Failed to remove iptables leftovers", r.stderr.trim(), {
          tool: `${base}-${backend}-restore`,
        });
        encounteredError = true;
      } else {
        log.info("Removed iptables leftovers", {
          tool: `${base}-${backend}`,
          chains: payload.match(/^-X /gm)?.length ?? 0,
        });
      }
    }
  }

  // ipsets (after the iptables rules that referenced them).
  const sets = await tryRun(runner, "ipset", ["list", "-n"]);
  if (sets.code === 0) {
    for (const name of sets.stdout.split("\n").map((s) => s.trim()).filter((s) => s.startsWith("KUBE-"))) {
      const r = await tryRun(runner, "ipset", ["destroy", name]);
      if (r.code !== 0) {
        log.error("Failed to destroy ipset", r.stderr.trim(), { set: name });
        encounteredError = true;
      }
    }
  }

  // nftables.
  const tables = await tryRun(runner, "nft", ["list", "tables"]);
  if (tables.code === 0) {
    for (const fam of ["ip", "ip6"]) {
      if (!new RegExp(`^table ${fam} kube-proxy$`, "m").test(tables.stdout)) continue;
      const r = await tryRun(runner, "nft", ["delete", "table", fam, "kube-proxy"]);
      if (r.code !== 0) {
        log.error("Failed to delete nftables table", r.stderr.trim(), { table: `${fam} kube-proxy` });
        encounteredError = true;
      }
    }
  }
  return encounteredError;
}
