/**
 * The ipvs dataplane of one IP family: IPVS virtual servers (`ipvsadm -R`), the mode's ipsets
 * (`ipset restore`), the service addresses on kube-ipvs0 (`ip -force -batch -`) and the iptables rules matching
 * the sets (`iptables-restore --noflush`), as upstream's ipvs proxier programs them, but incrementally.
 *
 * - What was programmed is kept in memory (the kernel model, `kernel_model.ts`). A partial sync re-renders only
 *   the changed Services' ports (`wanted_state.ts` counts what they share) and writes only the differences: one
 *   ipvsadm batch, one ipset batch, one ip batch, and the iptables payload only when its text changed (it
 *   depends only on which sets have members).
 * - A full sync (start, after a failure, at the proxier's full-sync period, or when needsFullSync() saw the
 *   kernel changed behind our back, `drift.ts`) reads the kernel once (`read_kernel.ts`: `ipvsadm -S -n`,
 *   `ipset save`, `ip -j addr show`, `iptables-save` of nat and filter for the jump rules), replaces the model
 *   with it and writes whatever differs: stale virtual servers, members and addresses go, missing ones come back.
 * - Graceful termination (upstream's GracefulTerminationManager, `graceful_termination.ts`): a TCP real server
 *   that is no longer wanted gets weight 0 and is deleted once `ipvsadm -L -n` shows it without connections
 *   (checked right after the sync and then every `drainCheckIntervalMs`, only for the virtual servers being
 *   drained); UDP and SCTP real servers are deleted at once. A drained real server that is wanted again gets
 *   its weight back.
 * @module
 */
import { CommandError, type CommandRunner } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import { iptablesRestoreFailuresTotal } from "../../metrics.ts";
import type { IPFamily } from "../../net/ip.ts";
import { NodeFacts } from "../../net/node_facts.ts";
import { type Clock, realClock } from "../../proxy/clock.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import type { Dataplane, ProxySnapshot, SyncResult } from "../../proxy/types.ts";
import type { IptablesTools } from "../iptables_backend.ts";
import { masqueradeMark } from "../masquerade.ts";
import { type LocalTrafficDetector, noOpLocalDetector } from "../iptables_local_detector.ts";
import { ChunkWriter, extractLines, timed } from "../payload.ts";
import { driftReason } from "./drift.ts";
import { GracefulTermination } from "./graceful_termination.ts";
import { renderIpvsIptables } from "./iptables_rules.ts";
import { KERNEL_COMMAND_TIMEOUT_MS, KernelModel } from "./kernel_model.ts";
import { readKernel } from "./read_kernel.ts";
import { type RenderContext, renderPort } from "./render.ts";
import { type TouchedObjects, WantedState } from "./wanted_state.ts";
import { type ModeSyncOutcome, SyncDriver } from "../sync_driver.ts";

/** Options of {@linkcode IpvsDataplane}. */
export interface IpvsDataplaneOptions {
  family: IPFamily;
  runner: CommandRunner;
  /** iptables programs of the detected backend and this family. */
  iptables: IptablesTools;
  /** `--ipvs-scheduler`; "" means rr. */
  scheduler?: string;
  /** Default 14. */
  masqueradeBit?: number;
  masqueradeAll?: boolean;
  localDetector?: LocalTrafficDetector;
  /** nodePortAddresses (CIDRs and/or `primary`); empty means every local address. */
  nodePortAddresses?: readonly string[];
  /** `--ipvs-exclude-cidrs`: virtual servers on these addresses are never deleted. */
  excludeCIDRs?: readonly string[];
  /** bindAddress (a specific one overrides the Node's IP of its family). */
  nodeIP?: string;
  /** Append `--random-fully` to MASQUERADE. Default true. */
  randomFully?: boolean;
  /** Interval of the drain checks while real servers are being drained. Default 60 s (upstream's). */
  drainCheckIntervalMs?: number;
  clock?: Clock;
  logger?: Logger;
  /** Keep the last sync's batches in `lastBatches` (tests, benches). Default false. */
  keepLastBatches?: boolean;
}

/** Kernel programs the dataplane ran in one sync, with their input (tests, debugging). */
export interface IpvsBatches {
  ipset: string;
  ipvsadm: string;
  iptables: string | null;
  ip: string;
}

/** ipvs dataplane for one IP family. */
export class IpvsDataplane implements Dataplane {
  readonly family: IPFamily;
  private readonly runner: CommandRunner;
  private readonly opts: IpvsDataplaneOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  /** The node's IP and nodePortAddresses (its local addresses are read with the kernel state). */
  private readonly node: NodeFacts;

  /** What is wanted (rendered ports and reference counts). */
  private readonly wanted = new WantedState();
  private ctx: RenderContext | null = null;

  /** What the kernel has (as far as we know). */
  private readonly kernel: KernelModel;
  private lastIptables: string | null = null;
  private readonly drain: GracefulTermination;

  private readonly driver: SyncDriver;
  /** The batches of the last sync, kept only with the `keepLastBatches` option (tests, benches). */
  lastBatches: IpvsBatches | null = null;

  constructor(opts: IpvsDataplaneOptions) {
    this.opts = opts;
    this.family = opts.family;
    this.runner = opts.runner;
    this.clock = opts.clock ?? realClock;
    this.log = (opts.logger ?? rootLog).with({ ipFamily: opts.family });
    this.driver = new SyncDriver({ mode: "ipvs", family: opts.family, logger: this.log });
    this.node = new NodeFacts({
      family: opts.family,
      bindAddress: opts.nodeIP,
      nodePortAddresses: opts.nodePortAddresses,
      runner: opts.runner,
      logger: this.log,
    });
    this.kernel = new KernelModel(opts.family, this.wanted, opts.excludeCIDRs ?? []);
    this.drain = new GracefulTermination({
      kernel: this.kernel,
      runner: this.runner,
      clock: this.clock,
      logger: this.log,
      intervalMs: opts.drainCheckIntervalMs ?? 60_000,
      exclusive: (fn) => this.exclusive(fn),
      onDeleteFailed: () => {
        this.driver.requestFull();
      },
    });
  }

  /** Serializes kernel writes (syncs and drain checks) under the sync driver's lock. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.driver.exclusive(fn);
  }

  /** Real servers being drained, as `key -r rs` strings (tests, debugging). */
  drainingRealServers(): string[] {
    return this.drain.realServers();
  }

  /** Stops the drain timer (the agent is stopping). */
  stop(): void {
    this.drain.stop();
  }

  /**
   * Cheap checks for changes behind our back, polled every syncPeriod: node addresses (NodePort virtual servers
   * follow them), addresses on kube-ipvs0, one virtual server we programmed, the member count of
   * KUBE-CLUSTER-IP. True when the next sync must be full.
   */
  async needsFullSync(): Promise<boolean> {
    const known = this.driver.knownNeedsFull();
    if (known !== null) return known;
    const why = await this.exclusive(() =>
      driftReason({
        runner: this.runner,
        family: this.family,
        iptables: this.opts.iptables.iptables,
        kernel: this.kernel,
        lastIptables: this.lastIptables,
      })
    );
    if (why === null) return false;
    this.log.info("ipvs state changed behind our back; next sync is full", { reason: why });
    this.driver.requestFull();
    return true;
  }

  /** Applies the snapshot through the sync driver. Rejects on failure; the next sync is then full. */
  sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    return this.driver.sync(snapshot, (full) => this.syncBody(snapshot, full));
  }

  /** This mode's part of a sync: the wanted state re-rendered where it changed, then the tools' batches. */
  private async syncBody(snapshot: ProxySnapshot, full: boolean): Promise<ModeSyncOutcome> {
    let jumps = { nat: "", filter: "" };
    if (full) jumps = await readKernel(this.kernel, this.runner, this.family, this.opts.iptables.save);
    const tGen = performance.now();
    const ctx = this.renderContext(snapshot);
    const ctxChanged = this.ctx === null || !sameContext(this.ctx, ctx);
    if (ctxChanged) this.ctx = ctx;

    // Re-render what changed; record what the changes touch.
    const touched: TouchedObjects = { virtualServers: [], setEntries: [], addrs: [] };
    const wanted = this.wanted;
    const consider = (name: string) => {
      const st = snapshot.servicePorts.get(name);
      const prev = wanted.ports.get(name);
      if (!st) {
        if (prev) wanted.update(name, null, touched);
        return;
      }
      if (prev && !ctxChanged && (prev.state === st || sameRenderedState(prev.state, st))) return;
      wanted.update(name, renderPort(st, this.ctx!), touched);
    };
    if (full || ctxChanged) {
      for (const name of snapshot.servicePorts.keys()) consider(name);
      for (const name of [...wanted.ports.keys()]) if (!snapshot.servicePorts.has(name)) consider(name);
    } else {
      for (const svc of snapshot.changedServices!) {
        const names = wanted.byService.get(svc);
        if (typeof names === "string") consider(names);
        else if (names) { for (const name of [...names]) consider(name); }
      }
      for (const [name, st] of snapshot.servicePorts) {
        if (snapshot.changedServices!.has(st.info.serviceKey)) consider(name);
      }
    }

    // Batches. A full sync's ipvsadm batch (most of its bytes: 6.5 of 7.9 MB at 10k Services × 10) is streamed to
    // `ipvsadm -R` as it is generated, unless the batches are kept; ipvsadm's errors name no line to show.
    const kernel = this.kernel;
    const streamVS = full && !this.opts.keepLastBatches;
    const ipvsadm = streamVS
      ? ""
      : full
      ? kernel.fullVirtualServerOps(snapshot.servicePorts.keys())
      : kernel.virtualServerOps(touched.virtualServers);
    const ipset = full ? kernel.fullSetOps() : kernel.setOps(touched.setEntries);
    const ip = full ? kernel.fullAddressOps() : kernel.addressOps(touched.addrs);
    const rules = renderIpvsIptables(
      this.rulesConfig(),
      (k) => wanted.sets.get(k)!.size > 0,
      [...wanted.outFilters.values()].join(""),
    );
    const iptables = full
      ? renderIpvsIptables(
        this.rulesConfig(),
        (k) => wanted.sets.get(k)!.size > 0,
        [...wanted.outFilters.values()].join(""),
        jumps,
      )
      : rules !== this.lastIptables
      ? rules
      : null;
    let generateMs = performance.now() - tGen;
    // A full sync's batches are several MiB at 10k Services: not kept unless asked for.
    if (this.opts.keepLastBatches) this.lastBatches = { ipset, ipvsadm, iptables, ip };

    const tApply = performance.now();
    let bytes = 0;
    if (ipset !== "") {
      bytes += ipset.length;
      await this.apply("ipset", ["restore"], ipset, (r) => r.code !== 0);
    }
    // ipvsadm -R goes on after a failing line and exits with the last line's status: any error output fails.
    const ipvsadmFailed = (r: { code: number; stderr: string }) => r.code !== 0 || r.stderr.trim() !== "";
    // The first block is computed before the tool starts: a batch with nothing to change runs no ipvsadm.
    const t0 = performance.now();
    const blocks = streamVS ? kernel.fullVirtualServerBlocks(snapshot.servicePorts.keys()) : null;
    const first = blocks?.next();
    generateMs += performance.now() - t0;
    if (blocks && first && !first.done) {
      const w = new ChunkWriter();
      const gen = (function* () {
        yield* w.text(first.value);
        for (let b = blocks.next(); !b.done; b = blocks.next()) yield* w.text(b.value);
        yield* w.end();
      })();
      const genTime = { ms: 0 };
      try {
        // If the tool stops reading early (it failed), the blocks not generated leave the model behind what the
        // sync wanted; a failed sync makes the next one full, which reads the kernel into the model first.
        await this.apply("ipvsadm", ["-R"], timed(gen, genTime), ipvsadmFailed);
      } finally {
        generateMs += genTime.ms;
        bytes += w.total;
      }
    } else if (!streamVS && ipvsadm !== "") {
      bytes += ipvsadm.length;
      await this.apply("ipvsadm", ["-R"], ipvsadm, ipvsadmFailed);
    }
    if (iptables !== null) {
      bytes += iptables.length;
      const args = ["--noflush", "--counters", "-w", "5", "-W", "100000"];
      try {
        await this.apply(this.opts.iptables.restore, args, iptables, (r) => r.code !== 0);
      } catch (err) {
        iptablesRestoreFailuresTotal.inc({ ip_family: this.family });
        throw err;
      }
      this.lastIptables = rules;
    }
    if (ip !== "") {
      bytes += ip.length;
      await this.apply("ip", ["-force", "-batch", "-"], ip, (r) => r.code !== 0);
      kernel.dummyExists = true;
    }
    const applyMs = performance.now() - tApply;
    this.drain.checkSoon();
    return { full, bytes, generateMs, applyMs, logFields: { virtualServers: wanted.virtualServers.size } };
  }

  private rulesConfig() {
    const o = this.opts;
    return {
      family: this.family,
      mark: masqueradeMark(o.masqueradeBit ?? 14),
      masqueradeAll: o.masqueradeAll ?? false,
      localDetector: o.localDetector ?? noOpLocalDetector,
      randomFully: o.randomFully ?? true,
    };
  }

  private async apply(
    cmd: string,
    args: string[],
    input: string | Iterable<Uint8Array>,
    failed: (r: { code: number; stderr: string }) => boolean,
  ): Promise<void> {
    const r = await this.runner.tryRun({ cmd, args, stdin: input, timeoutMs: KERNEL_COMMAND_TIMEOUT_MS });
    if (!failed(r)) return;
    const m = r.stderr.match(/line (\d+)/i);
    this.log.error(`Failed to execute ${cmd} ${args.join(" ")}`, r.stderr.trim(), {
      lines: m && typeof input === "string" ? extractLines(input, Number(m[1])) : undefined,
    });
    this.driver.requestFull();
    throw new CommandError({ cmd, args }, r.code === 0 ? 1 : r.code, r.stderr);
  }

  private renderContext(snapshot: ProxySnapshot): RenderContext {
    this.node.observe(snapshot.node.ips);
    const nodeAddresses = this.kernel.nodeAddresses;
    return {
      family: this.family,
      scheduler: this.opts.scheduler || "rr",
      nodePortIPs: this.node.nodePortIPsAmong(nodeAddresses),
      nodeAddresses: new Set(nodeAddresses),
      nodeIP: this.node.nodeIP,
    };
  }

  /**
   * Deletes the drained real servers that have no connections left (`ipvsadm -L -n` of only the virtual
   * servers being drained, one `ipvsadm -R` for the deletions) and schedules the next check while some remain.
   * Resolves with the real servers deleted.
   */
  checkDraining(): Promise<string[]> {
    return this.drain.check();
  }
}

function sameContext(a: RenderContext, b: RenderContext): boolean {
  return a.family === b.family && a.scheduler === b.scheduler && a.nodeIP === b.nodeIP &&
    a.nodePortIPs.join(",") === b.nodePortIPs.join(",") && a.nodeAddresses.size === b.nodeAddresses.size &&
    [...a.nodeAddresses].every((x) => b.nodeAddresses.has(x));
}
