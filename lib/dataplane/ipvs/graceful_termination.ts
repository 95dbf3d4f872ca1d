/**
 * Graceful termination of IPVS real servers (upstream's GracefulTerminationManager): the TCP real servers the
 * kernel model drained (weight 0) are deleted once `ipvsadm -L -n` shows them without connections, checked
 * right after a sync and then every drain check interval while some remain.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import { type Clock, realClock, type TimerId } from "../../proxy/clock.ts";
import { deleteRealServerLine, parseIpvsadmList } from "./ipvsadm.ts";
import { KERNEL_COMMAND_TIMEOUT_MS, type KernelModel, realsMap } from "./kernel_model.ts";

/** What {@linkcode GracefulTermination} needs from its dataplane. */
export interface GracefulTerminationOptions {
  /** The kernel model whose `draining` list is worked off. */
  kernel: KernelModel;
  runner: CommandRunner;
  clock: Clock;
  logger: Logger;
  /** Interval of the drain checks while real servers are being drained. */
  intervalMs: number;
  /** Runs a kernel write serialized with the dataplane's syncs. */
  exclusive: <T>(fn: () => Promise<T>) => Promise<T>;
  /** Called when deleting drained real servers failed (the next sync must be full). */
  onDeleteFailed: () => void;
}

/** Deletes drained real servers once their connections are gone. */
export class GracefulTermination {
  private readonly o: GracefulTerminationOptions;
  private timer: TimerId | null = null;

  constructor(opts: GracefulTerminationOptions) {
    this.o = opts;
  }

  /** Real servers being drained, as `key -r rs` strings (tests, debugging). */
  realServers(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.o.kernel.draining) for (const rs of s) out.push(`${k} -r ${rs}`);
    return out;
  }

  /** Stops the drain timer (the agent is stopping). */
  stop(): void {
    if (this.timer !== null) this.o.clock.clearTimeout(this.timer);
    this.timer = null;
  }

  /** Schedules an immediate check when real servers are being drained and no check is scheduled (after a sync). */
  checkSoon(): void {
    if (this.o.kernel.draining.size > 0 && this.timer === null) this.schedule(0);
  }

  private schedule(ms: number): void {
    if (this.timer !== null) return;
    this.timer = this.o.clock.setTimeout(() => {
      this.timer = null;
      void this.check().catch((err) => this.o.logger.error("Drain check failed", err));
    }, ms);
    // The drain check must not keep a stopping agent alive.
    if (this.o.clock === realClock) Deno.unrefTimer(this.timer);
  }

  /**
   * Deletes the drained real servers that have no connections left (`ipvsadm -L -n` of only the virtual
   * servers being drained, one `ipvsadm -R` for the deletions) and schedules the next check while some remain.
   * Resolves with the real servers deleted.
   */
  check(): Promise<string[]> {
    const { kernel, runner } = this.o;
    const draining = kernel.draining;
    return this.o.exclusive(async () => {
      const deleted: string[] = [];
      if (draining.size === 0) return deleted;
      const stats = new Map<string, Map<string, { activeConn: number; inactiveConn: number }>>();
      const keys = [...draining.keys()];
      if (keys.length <= 16) {
        for (const key of keys) {
          const r = await runner.tryRun({ cmd: "ipvsadm", args: ["-L", "-n", ...key.split(" ")] });
          if (r.code === 0) { for (const [k, v] of parseIpvsadmList(r.stdout)) stats.set(k, v); }
          else stats.set(key, new Map()); // the virtual server is gone
        }
      } else {
        const r = await runner.run({
          cmd: "ipvsadm",
          args: ["-L", "-n"],
          timeoutMs: KERNEL_COMMAND_TIMEOUT_MS,
        });
        for (const [k, v] of parseIpvsadmList(r.stdout)) stats.set(k, v);
        for (const key of keys) if (!stats.has(key)) stats.set(key, new Map());
      }
      let batch = "";
      const gone: [string, string][] = [];
      for (const [key, reals] of draining) {
        const st = stats.get(key)!;
        for (const rs of reals) {
          const s = st.get(rs);
          if (s === undefined) gone.push([key, rs]);
          else if (s.activeConn + s.inactiveConn === 0) {
            batch += deleteRealServerLine(key, rs);
            gone.push([key, rs]);
          } else {
            this.o.logger.v(5).info("Skip deleting real server till all connection have expired", {
              realServer: `${key} -r ${rs}`,
              activeConnection: s.activeConn,
              inactiveConnection: s.inactiveConn,
            });
          }
        }
      }
      if (batch !== "") {
        const r = await runner.tryRun({ cmd: "ipvsadm", args: ["-R"], stdin: batch });
        if (r.code !== 0 || r.stderr.trim() !== "") {
          this.o.logger.error("Failed to delete drained real servers", r.stderr.trim());
          this.o.onDeleteFailed();
          return deleted;
        }
      }
      for (const [key, rs] of gone) {
        draining.get(key)?.delete(rs);
        if (draining.get(key)?.size === 0) draining.delete(key);
        const k = kernel.virtualServers.get(key);
        if (k) realsMap(k).delete(rs);
        deleted.push(`${key} -r ${rs}`);
        this.o.logger.info("Removed real server from graceful delete real server list", {
          realServer: `${key} -r ${rs}`,
        });
      }
      if (draining.size > 0) this.schedule(this.o.intervalMs);
      return deleted;
    });
  }
}
