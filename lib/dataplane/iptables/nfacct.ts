/**
 * nfacct packet counters (the kernel's `nfnetlink_acct`), as upstream's iptables mode uses them since v1.29:
 * the INVALID-drop rule in KUBE-FORWARD and the localhost NodePort rules count packets into named
 * counters, read back as `kubeproxy_iptables_*_packets_total` metrics. Upstream talks netlink; the agent runs
 * the `nfacct` program (Deno has no netlink without FFI). Where `nfacct` or the kernel support is missing the
 * counters are unavailable and the rules are written without the match, exactly as upstream does then.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";

/** Counts packets dropped as conntrack-INVALID in KUBE-FORWARD (upstream's counter name). */
export const CT_STATE_INVALID_DROPPED = "ct_state_invalid_dropped_pkts";
/** Counts packets accepted on localhost NodePorts (upstream's counter name). */
export const LOCALHOST_NODEPORTS_ACCEPTED = "localhost_nps_accepted_pkts";

/** Parses `nfacct get NAME` output: `{ pkts = 00000000000000000042, bytes = 00000000000000003360 } = NAME;`. */
export function parseNfacctGet(out: string, name: string): { packets: number; bytes: number } | null {
  const m = out.match(/\{\s*pkts\s*=\s*(\d+),\s*bytes\s*=\s*(\d+)\s*\}\s*=\s*(\S+?);/);
  if (!m || m[3] !== name) return null;
  return { packets: Number(m[1]), bytes: Number(m[2]) };
}

/** The node's nfacct counters, through the `nfacct` program. */
export class NfacctCounters {
  #unavailableLogged = false;

  constructor(private readonly runner: CommandRunner, private readonly logger: Logger) {}

  /**
   * Makes sure the counter exists (upstream's `Ensure` on every full sync); false when counters cannot be used
   * here (no `nfacct` program, no kernel support), logged once.
   */
  async ensure(name: string): Promise<boolean> {
    try {
      const get = await this.runner.tryRun({ cmd: "nfacct", args: ["get", name], timeoutMs: 10_000 });
      if (get.code === 0) return true;
      const add = await this.runner.tryRun({ cmd: "nfacct", args: ["add", name], timeoutMs: 10_000 });
      if (add.code === 0) return true;
      this.#unavailable(name, add.stderr.trim() || get.stderr.trim() || `exit ${add.code}`);
    } catch (err) {
      this.#unavailable(name, (err as Error).message);
    }
    return false;
  }

  #unavailable(name: string, why: string): void {
    if (this.#unavailableLogged) return;
    this.#unavailableLogged = true;
    this.logger.error(
      "Failed to create nfacct counter; the corresponding metric will not be updated",
      why,
      { counter: name },
    );
  }

  /** The counter's packet count; null when it cannot be read. */
  async packets(name: string): Promise<number | null> {
    try {
      const r = await this.runner.tryRun({ cmd: "nfacct", args: ["get", name], timeoutMs: 10_000 });
      return r.code === 0 ? parseNfacctGet(r.stdout, name)?.packets ?? null : null;
    } catch {
      return null;
    }
  }
}
