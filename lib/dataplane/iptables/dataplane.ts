/**
 * The iptables dataplane: renders a {@linkcode ProxySnapshot} into one `iptables-restore --noflush --counters`
 * payload (filter + nat, plus mangle on full syncs) per sync and family.
 *
 * - Full sync at start, after a failure, when the canary chain vanished, when the snapshot asks for it
 *   (`changedServices === null`), and when large-cluster mode or the node IP changes. A full sync still reuses
 *   every cached per-port block whose state did not change.
 * - Partial sync: the dispatch chains (KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS, KUBE-FORWARD,
 *   KUBE-PROXY-FIREWALL, KUBE-POSTROUTING, KUBE-MARK-MASQ) in full, and only the changed ports' own chains.
 *   No other iptables program runs (only `ip`, with CIDR nodePortAddresses: see below).
 * - Stale chains are flushed and deleted (`:CHAIN` + `-X CHAIN`) from memory of what was written; the only
 *   `iptables-save` (one per table) runs on every full sync, including the periodic one, to re-verify the jump
 *   rules as upstream's EnsureRule loop does on each full sync; it also finds leftovers of an earlier run.
 * - With CIDR nodePortAddresses the node's addresses (`ip -j addr show`) are read on every sync, as upstream
 *   reads them on every sync; the default match-all setting runs nothing.
 *
 * The options and render settings are in settings.ts, the payload's plan and stream in restore_payload.ts, the
 * `iptables-save` scan and kubelet's jumps in kernel_scan.ts, the nft backend's scale warning in
 * nft_scale_warning.ts.
 * @module
 */

import type { CommandRunner } from "../../exec.ts";
import { CommandError } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import type { Dataplane, IPFamily, ProxySnapshot, SyncResult } from "../../proxy/types.ts";
import {
  iptablesPartialRestoreFailuresTotal,
  iptablesRestoreFailuresTotal,
  iptablesRulesLastSync,
  iptablesRulesTotal,
} from "../../metrics.ts";
import { type IptablesTools, iptablesTools } from "../iptables_backend.ts";
import type { PortChains } from "./chain_names.ts";
import { NfacctCounters } from "./nfacct.ts";
import { collectChunks, DEFAULT_CHUNK_BYTES, extractLines, SectionCache, timed } from "../payload.ts";
import { NodeFacts } from "../../net/node_facts.ts";
import { LARGE_CLUSTER_ENDPOINTS_THRESHOLD, type RenderConfig, type ServicePortBlock } from "./rules.ts";
import { KUBE_PROXY_CANARY } from "./static_rules.ts";
import { ensureCounters, initialSettings, type IptablesDataplaneOptions } from "./settings.ts";
import { ensureKubeletJumps, type ScanResult, scanTables } from "./kernel_scan.ts";
import { NftBackendScaleWarning } from "./nft_scale_warning.ts";
import {
  type BuiltPayload,
  failedLine,
  newPlan,
  Payload,
  type Plan,
  streamPayload,
} from "./restore_payload.ts";
import { type ModeSyncOutcome, SyncDriver } from "../sync_driver.ts";

export type { IptablesDataplaneOptions } from "./settings.ts";
export { type BuiltPayload, failedLine } from "./restore_payload.ts";
export { NFT_BACKEND_SERVICE_PORTS_WARNING } from "./nft_scale_warning.ts";

/** iptables dataplane for one IP family. */
export class IptablesDataplane implements Dataplane {
  readonly family: IPFamily;
  readonly tools: IptablesTools;
  private readonly runner: CommandRunner;
  private readonly log: Logger;
  private readonly opts: IptablesDataplaneOptions;
  /** The node's IP, nodePortAddresses and addresses accepting NodePorts. */
  private readonly node: NodeFacts;
  private readonly randomFully: boolean;
  private readonly nfacct: NfacctCounters | null;

  private cfg: RenderConfig | null = null;
  private conntrackLiberal = false;
  private initialized = false;

  /** Rendered blocks by `nameString`. */
  private readonly blocks = new Map<string, ServicePortBlock>();
  private readonly dispatchSection = new SectionCache();
  /** True while a sync streams its payload (blocks and sections must not change meanwhile). */
  private streaming = false;
  /** Bytes per chunk handed to iptables-restore. */
  private readonly chunkBytes: number;
  /** Chains of each port as last successfully written. */
  private applied = new Map<string, PortChains>();
  private readonly driver: SyncDriver;
  private largeCluster = false;
  /** The nft backend's scale warning (once per dataplane). */
  private readonly nftScaleWarning: NftBackendScaleWarning;
  /** The last restore left rules in nat KUBE-SERVICES (checked by needsFullSync in small clusters). */
  private servicesChainHasRules = false;
  private nodePortIPs: string[] = [];
  /** The last payload (tests, debugging). */
  lastPayload: BuiltPayload | null = null;

  constructor(opts: IptablesDataplaneOptions) {
    this.opts = opts;
    this.family = opts.family;
    this.runner = opts.runner;
    this.log = (opts.logger ?? rootLog).with({ ipFamily: opts.family });
    const be = opts.backend ?? "system";
    this.tools = typeof be === "string" ? iptablesTools(be, opts.family) : be;
    this.node = new NodeFacts({
      family: opts.family,
      bindAddress: opts.nodeIP,
      nodePortAddresses: opts.nodePortAddresses,
      localAddresses: opts.nodeAddresses,
      runner: opts.runner,
      logger: this.log,
    });
    this.randomFully = opts.randomFully ?? true;
    this.nfacct = opts.nfacct === undefined ? new NfacctCounters(this.runner, this.log) : opts.nfacct;
    this.chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
    this.nftScaleWarning = new NftBackendScaleWarning(this.tools, this.log);
    this.driver = new SyncDriver({ mode: "iptables", family: this.family, logger: this.log });
  }

  /** v1.37 (#138571): in large-cluster mode (> 1000 endpoints at the last sync) no hourly full resync. */
  skipsPeriodicFullSync(): boolean {
    return this.largeCluster;
  }

  /** Checks the mangle canary chain (cheap: mangle is small); true when it is gone and a full sync is due. */
  async needsFullSync(): Promise<boolean> {
    const known = this.driver.knownNeedsFull();
    if (known !== null) return known;
    const r = await this.runner.tryRun({
      cmd: this.tools.iptables,
      args: ["-w", "5", "-t", "mangle", "-S", KUBE_PROXY_CANARY],
      timeoutMs: 15_000,
    });
    if (r.code !== 0) {
      this.log.info("iptables canary chain is gone (flushed externally?); next sync is full", {
        stderr: r.stderr.trim(),
      });
      this.driver.requestFull();
      return true;
    }
    // Beyond upstream: a flush of nat KUBE-SERVICES alone (`iptables -t nat -F KUBE-SERVICES`) leaves the
    // canary in place, so upstream repairs it only at the next change or hourly resync. Listing one chain is
    // cheap while the table is small; in large-cluster mode (where a listing costs seconds with the legacy
    // backend) only the canary is checked, as upstream does.
    if (this.largeCluster || !this.servicesChainHasRules) return false;
    const svc = await this.runner.tryRun({
      cmd: this.tools.iptables,
      args: ["-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"],
      timeoutMs: 15_000,
    });
    if (svc.code === 0 && svc.stdout.includes("-A KUBE-SERVICES ")) return false;
    this.log.info("nat KUBE-SERVICES was flushed or deleted externally; next sync is full", {
      stderr: svc.stderr.trim(),
    });
    this.driver.requestFull();
    return true;
  }

  /** First-sync setup: sysctls and settings that need the node's IPs (see {@linkcode initialSettings}). */
  private async init(): Promise<void> {
    const ctx = { family: this.family, runner: this.runner, log: this.log };
    const init = await initialSettings(this.opts, ctx, this.node.nodePortAddresses, this.node.nodeIP);
    this.conntrackLiberal = init.conntrackLiberal;
    this.cfg = init.cfg;
    this.initialized = true;
  }

  /** Ensures the nfacct counters (see {@linkcode ensureCounters}). */
  private ensureCounters(cfg: RenderConfig): Promise<RenderConfig> {
    return ensureCounters(this.nfacct, this.conntrackLiberal, cfg);
  }

  /** Reads the node's addresses matching CIDR nodePortAddresses (nothing runs when they match all). */
  private async readNodePortIPs(): Promise<void> {
    this.nodePortIPs = await this.node.nodePortIPs();
  }

  /** One iptables-save per table (see {@linkcode scanTables}). */
  private scan(): Promise<ScanResult> {
    return scanTables(this.runner, this.tools, this.cfg!.localhostNodePorts);
  }

  /** Applies the snapshot through the sync driver. Rejects on failure; the next sync is then full. */
  sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    // A second sync while one streams is a caller's error (the proxier never overlaps them): refused at once
    // rather than queued behind it.
    if (this.streaming && snapshot.family === this.family) {
      return Promise.reject(new Error("iptables dataplane: sync while another sync is streaming"));
    }
    return this.driver.sync(snapshot, (full) => this.syncBody(snapshot, full));
  }

  /** This mode's part of a sync: settings, one streamed `iptables-restore`, what the kernel now has. */
  private async syncBody(snapshot: ProxySnapshot, dueFull: boolean): Promise<ModeSyncOutcome> {
    this.node.observe(snapshot.node.ips);
    if (!this.initialized) await this.init();
    const largeCluster = snapshot.totalEndpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    const nodeIP = this.node.nodeIP;
    let full = dueFull;
    const cfg0 = full ? await this.ensureCounters(this.cfg!) : this.cfg!;
    if (largeCluster !== this.largeCluster || nodeIP !== cfg0.nodeIP || cfg0 !== this.cfg) {
      // Every block renders differently now: drop the cache and write everything.
      this.blocks.clear();
      this.dispatchSection.clear();
      this.largeCluster = largeCluster;
      this.cfg = nodeIP !== cfg0.nodeIP ? { ...cfg0, nodeIP } : cfg0;
      full = true;
    }
    const cfg = this.cfg!;

    // Every full sync (start, failure, flush, periodic) re-verifies the jump rules, as upstream ensures them
    // on every full sync; partial syncs run nothing but the restore.
    const scan = full ? await this.scan() : null;
    // Upstream reads the node's addresses on every sync; the nodeports tail rules they feed are in nat
    // KUBE-SERVICES, which every payload rewrites, so an address change takes effect at the next (even partial)
    // sync. With match-all nodePortAddresses nothing runs.
    await this.readNodePortIPs();
    this.lastPayload = null;

    if (full) this.nftScaleWarning.check(snapshot.servicePorts.size);

    // The payload is generated while iptables-restore reads it, one bounded chunk at a time: generation overlaps
    // the kernel's parsing and no payload-sized buffer exists.
    const plan = this.newPlan(snapshot, cfg, full, scan);
    const gen = this.stream(snapshot, plan);
    const genTime = { ms: 0 };
    const tApply = performance.now();
    const args = ["--noflush", "--counters", "-w", "5", "-W", "100000"];
    let r;
    this.streaming = true;
    try {
      r = await this.runner.tryRun({
        cmd: this.tools.restore,
        args,
        stdin: timed(gen, genTime),
        captureStdout: false,
        timeoutMs: 600_000,
      });
      // iptables-restore may have stopped reading early (it failed): finish the plan all the same.
      const t = performance.now();
      for (const _ of gen) { /* discard */ }
      genTime.ms += performance.now() - t;
    } finally {
      this.streaming = false;
    }
    const applyMs = performance.now() - tApply;
    const last = new Payload(plan, this.chunkBytes);
    this.lastPayload = last;
    if (r.code !== 0) {
      const n = failedLine(r.stderr);
      this.log.error("Failed to execute iptables-restore", r.stderr.trim(), {
        rules: n !== null ? extractLines(last.text, n) : undefined,
      });
      iptablesRestoreFailuresTotal.inc({ ip_family: this.family });
      if (!full) iptablesPartialRestoreFailuresTotal.inc({ ip_family: this.family });
      throw new CommandError({ cmd: this.tools.restore, args }, r.code, r.stderr);
    }

    // Success: remember what the kernel now has.
    this.commit(plan);
    this.servicesChainHasRules = plan.servicesChainHasRules;
    const jumpsOk = scan === null || await ensureKubeletJumps(this.runner, this.tools, this.log, scan);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "filter" }, plan.filterRules);
    iptablesRulesTotal.set({ ip_family: this.family, table: "filter" }, plan.filterRules);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "nat" }, plan.natRulesWritten);
    iptablesRulesTotal.set({ ip_family: this.family, table: "nat" }, plan.natRulesTotal);
    return {
      full,
      bytes: plan.bytes,
      generateMs: genTime.ms,
      applyMs,
      logFields: { deletedChains: plan.deleted.length },
      nextFull: !jumpsOk,
    };
  }

  /**
   * Streams the full sync of the snapshot to `iptables-restore --test` (otherwise the real restore's flags):
   * nothing is committed and nothing of what this dataplane remembers of the kernel changes (written chains,
   * the next sync's fullness, restore metrics, `lastPayload`). Like a full sync it lists the tables, reads the
   * node's addresses and ensures the nfacct counters (setup a real full sync does too); the render cache is
   * shared, keyed by the rendering settings as for syncs. Rejects with the restore's error when refused.
   */
  async check(snapshot: ProxySnapshot): Promise<void> {
    if (snapshot.family !== this.family) {
      throw new Error(`iptables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    if (this.streaming) throw new Error("iptables dataplane: check while a sync is streaming");
    this.node.observe(snapshot.node.ips);
    if (!this.initialized) await this.init();
    const largeCluster = snapshot.totalEndpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    const nodeIP = this.node.nodeIP;
    const cfg0 = await this.ensureCounters(this.cfg!);
    if (largeCluster !== this.largeCluster || nodeIP !== cfg0.nodeIP || cfg0 !== this.cfg) {
      // Render-cache settings, as in sync (which compares them again and re-renders when they differ).
      this.blocks.clear();
      this.dispatchSection.clear();
      this.largeCluster = largeCluster;
      this.cfg = nodeIP !== cfg0.nodeIP ? { ...cfg0, nodeIP } : cfg0;
    }
    const scan = await this.scan();
    await this.readNodePortIPs();
    const plan = this.newPlan(snapshot, this.cfg!, true, scan);
    const gen = this.stream(snapshot, plan);
    const args = ["--test", "--noflush", "--counters", "-w", "5", "-W", "100000"];
    let r;
    this.streaming = true;
    try {
      r = await this.runner.tryRun({
        cmd: this.tools.restore,
        args,
        stdin: gen,
        captureStdout: false,
        timeoutMs: 600_000,
      });
      for (const _ of gen) { /* discard: the render cache is left as a finished stream leaves it */ }
    } finally {
      this.streaming = false;
    }
    if (r.code !== 0) {
      const n = failedLine(r.stderr);
      const text = n !== null ? new Payload(plan, this.chunkBytes).text : "";
      this.log.v(2).info("iptables-restore --test refused the payload", {
        stderr: r.stderr.trim(),
        rules: n !== null ? extractLines(text, n) : undefined,
      });
      throw new CommandError({ cmd: this.tools.restore, args }, r.code, r.stderr);
    }
  }

  private commit(plan: Plan): void {
    for (const [name, chains] of plan.appliedChanged) {
      if (chains === null) this.applied.delete(name);
      else this.applied.set(name, chains);
    }
  }

  /**
   * Builds the restore payload for a snapshot without applying it (exposed for tests and benchmarks; the
   * render cache is updated, the memory of written chains is not).
   */
  buildPayload(snapshot: ProxySnapshot, full: boolean): BuiltPayload {
    if (!this.cfg) throw new Error("buildPayload before the first sync");
    if (this.streaming) throw new Error("buildPayload while a sync is streaming its payload");
    const plan = this.newPlan(snapshot, this.cfg, full, null);
    const bytes = collectChunks(this.stream(snapshot, plan));
    const p = new Payload(plan, this.chunkBytes);
    Object.defineProperty(p, "bytes", { value: bytes });
    return p;
  }

  private newPlan(snapshot: ProxySnapshot, cfg: RenderConfig, full: boolean, scan: ScanResult | null): Plan {
    return newPlan(snapshot, cfg, full, scan, {
      conntrackLiberal: this.conntrackLiberal,
      randomFully: this.randomFully,
      nodePortsMatchAll: this.node.nodePortAddresses.matchAll,
      nodePortIPs: this.nodePortIPs,
    });
  }

  /** Plans and streams one payload from the render cache (see {@linkcode streamPayload}). */
  private stream(snapshot: ProxySnapshot, p: Plan): Generator<Uint8Array, void, undefined> {
    return streamPayload(snapshot, p, {
      blocks: this.blocks,
      dispatchSection: this.dispatchSection,
      applied: this.applied,
      largeCluster: this.largeCluster,
      chunkBytes: this.chunkBytes,
    });
  }
}
