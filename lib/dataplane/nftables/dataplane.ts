/**
 * The nftables dataplane: renders a {@linkcode ProxySnapshot} into one `nft -f -` transaction per sync and
 * family (atomic), in the `ip kube-proxy` / `ip6 kube-proxy` table upstream v1.37 writes. This module decides
 * which sync runs and keeps what the kernel holds; the pieces are apart:
 *
 * - Full sync (start, after a failure, periodic, node IP or nodePortAddresses change), `full_sync.ts`: the fixed
 *   layout, every service port's chains, affinity sets and elements, generated port by port while nft reads it.
 *   The table's chains and sets are listed once (not on partial syncs) to find leftovers of an earlier run.
 * - Partial sync, `partial_sync.ts` (sections in `partial_tx.ts`): only the changed Services, only what differs
 *   from what the dataplane last wrote. The table is never listed. Shared elements' owners: `element_owners.ts`.
 * - Stale chains, `stale_chains.ts`: flushed at once and deleted at the end of a later sync's own transaction
 *   (or of the syncPeriod poll's), at least a second later.
 * - A failed transaction logs nft's error with the failing input line, counts in
 *   `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, rejects, and the next sync is full.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import { nftablesCleanupFailuresTotal, nftablesSyncFailuresTotal } from "../../metrics.ts";
import { isLoopback } from "../../net/ip.ts";
import type { NodePortAddresses } from "../../net/node_addresses.ts";
import { NodeFacts } from "../../net/node_facts.ts";
import type { Dataplane, IPFamily, ProxySnapshot, ServicePortState, SyncResult } from "../../proxy/types.ts";
import { NO_LOCAL_TRAFFIC } from "../local_traffic.ts";
import { masqueradeMark } from "../masquerade.ts";
import type { NftablesDataplaneOptions } from "./dataplane_options.ts";
import { ElementOwnership } from "./element_owners.ts";
import { NftablesError } from "./errors.ts";
import {
  type FullResult,
  fullSyncOps,
  knownChains,
  newFullResult,
  precreate,
  recorded,
  type TableObjects,
} from "./full_sync.ts";
import type { Nftables } from "./interface.ts";
import { TABLE } from "./names.ts";
import { LocalhostNodePortProxy, localhostNodePorts } from "./localhost_nodeport_proxy.ts";
import { NftablesRunner } from "./nft_runner.ts";
import { timed } from "../payload.ts";
import { buildPartial, type PartialSyncChanges } from "./partial_sync.ts";
import { PartialSyncTx } from "./partial_tx.ts";
import { StaleChains } from "./stale_chains.ts";
import type { Operation } from "./transaction.ts";
import { localhostNodePortHandling, nftFamily, type NftRenderConfig } from "./rules.ts";
import { type ModeSyncOutcome, SyncDriver } from "../sync_driver.ts";

export type { NftablesDataplaneOptions } from "./dataplane_options.ts";

/** nftables dataplane for one IP family. */
export class NftablesDataplane implements Dataplane {
  readonly family: IPFamily;
  private readonly runner: CommandRunner;
  private readonly log: Logger;
  private readonly opts: NftablesDataplaneOptions;
  private readonly nft: Nftables;
  private readonly fam: "ip" | "ip6";
  private readonly mark: string;

  private cfg: NftRenderConfig | null = null;
  /** The node's IP, nodePortAddresses and addresses accepting NodePorts. */
  private readonly node: NodeFacts;
  private nodePortIPs: string[] = [];
  private serviceCIDRs: readonly string[] = [];
  /** Protocols whose localhost NodePort traffic is rejected (set with the node port addresses). */
  private localhostRejects: readonly string[] = [];
  /** The loopback listeners of TCP NodePorts (gate on and loopback named in nodePortAddresses). */
  private localhostProxy: LocalhostNodePortProxy | null = null;
  private readonly driver: SyncDriver;
  private baseChainsRecreated = false;

  /** The state each port in the kernel was rendered from (rendered again to know what the kernel holds). */
  private written = new Map<string, ServicePortState>();
  /** The elements in the kernel and their owners. */
  private elements = new ElementOwnership();
  /** Emptied chains waiting for deletion, and since when. */
  private readonly staleChains: StaleChains;
  /** The last transaction's text, kept only with the `keepLastTransaction` option (tests, render). */
  lastTransaction = "";
  /** The last transaction given to check(), kept only with the `keepLastTransaction` option (tests). */
  lastCheckedTransaction = "";

  constructor(opts: NftablesDataplaneOptions) {
    this.opts = opts;
    this.family = opts.family;
    this.runner = opts.runner;
    this.log = (opts.logger ?? rootLog).with({ ipFamily: opts.family });
    this.fam = nftFamily(opts.family);
    this.nft = opts.nftables ?? new NftablesRunner({ family: this.fam, table: TABLE, runner: opts.runner });
    this.staleChains = new StaleChains(opts.now ?? (() => Date.now()));
    this.mark = masqueradeMark(opts.masqueradeBit ?? 14);
    this.driver = new SyncDriver({ mode: "nftables", family: this.family, logger: this.log });
    this.node = new NodeFacts({
      family: opts.family,
      bindAddress: opts.nodeIP,
      nodePortAddresses: opts.nodePortAddresses,
      localAddresses: opts.nodeAddresses,
      runner: opts.runner,
      logger: this.log,
    });
  }
  /**
   * Polled every syncPeriod: deletes stale chains that are old enough, and tells whether a full sync is due
   * (the table vanished, or the addresses accepting NodePorts changed).
   */
  async needsFullSync(): Promise<boolean> {
    const known = this.driver.knownNeedsFull();
    if (known !== null) return known;
    await this.driver.exclusive(() => this.deleteStaleChains());
    const exists = await this.nft.tableExists().catch((err) => {
      this.log.error("Checking for the nftables table failed", err);
      return false;
    });
    if (!exists) {
      this.log.info("nftables table is gone (flushed externally?); next sync is full", {
        table: `${this.fam} ${TABLE}`,
      });
      this.driver.requestFull();
      return true;
    }
    if (this.node.observed && !this.node.nodePortAddresses.matchAll) {
      const before = this.nodePortIPs.join(",");
      await this.readNodePortIPs();
      if (this.nodePortIPs.join(",") !== before) {
        this.log.info("Node addresses accepting NodePorts changed; next sync is full", {
          ips: this.nodePortIPs,
        });
        this.driver.requestFull();
        return true;
      }
    }
    return false;
  }

  /** Takes the snapshot's node IPs; the first snapshot also settles the localhost NodePort handling. */
  private observeNode(snapshot: ProxySnapshot): void {
    const first = !this.node.observed;
    this.node.observe(snapshot.node.ips);
    if (first) this.localhostRejects = this.localhostRejectProtocols(this.node.nodePortAddresses);
  }

  /** Upstream's localhostNodePortRejectProtocols for this family's nodePortAddresses (and its listeners). */
  private localhostRejectProtocols(npa: NodePortAddresses): readonly string[] {
    const h = localhostNodePortHandling(this.opts.localhostNodePorts ?? false, npa.cidrs);
    if (h.listeners) this.localhostProxy = new LocalhostNodePortProxy(this.family, this.log);
    return h.rejects;
  }

  /** Closes the localhost NodePort listeners (agent stop, tests). */
  stop(): void {
    this.localhostProxy?.shutdown();
  }

  private async readNodePortIPs(): Promise<void> {
    const ips = await this.node.nodePortIPs();
    this.nodePortIPs = [];
    for (const ip of ips) {
      if (isLoopback(ip)) {
        // Served by the loopback listeners (and rejected per protocol) with KubeProxyNFTablesLocalhostNodePorts.
        if (this.localhostProxy !== null) continue;
        this.log.error(
          "--nodeport-addresses includes localhost but localhost NodePorts are not supported",
          undefined,
          { address: ip },
        );
      } else this.nodePortIPs.push(ip);
    }
  }

  /** Deletes the stale chains flushed at least a second ago, in a transaction of their own. */
  private async deleteStaleChains(): Promise<void> {
    if (this.staleChains.size === 0) return;
    const deleted = this.staleChains.takeDue();
    if (deleted.size === 0) return;
    const tx = this.nft.newTransaction();
    for (const chain of deleted) tx.delete({ kind: "chain", name: chain });
    this.log.info("Deleting stale nftables chains", { numChains: deleted.size });
    if (this.opts.keepLastTransaction) this.lastTransaction = tx.toString();
    try {
      await this.nft.run(tx);
    } catch (err) {
      // If the chains still exist the next full sync finds them and flushes them again.
      this.log.error("Unable to delete stale chains; will retry later", err);
      nftablesCleanupFailuresTotal.inc({ ip_family: this.family });
      this.driver.requestFull();
    }
  }

  /** Chains and affinity sets of the table now (full syncs only); null when listing fails. */
  private async listObjects(): Promise<TableObjects | null> {
    try {
      return { chains: new Set(await this.nft.list("chain")), sets: new Set(await this.nft.list("set")) };
    } catch (err) {
      if (err instanceof NftablesError && err.code === "ENOENT") {
        return { chains: new Set(), sets: new Set() };
      }
      this.log.error("Failed to list existing nftables objects", err);
      return null;
    }
  }

  /** The render settings now (the node IP as the last observed snapshot gives it). */
  private renderConfig(): NftRenderConfig {
    const o = this.opts;
    return {
      family: this.family,
      mark: this.mark,
      masqueradeAll: o.masqueradeAll ?? false,
      localTraffic: o.localTraffic ?? NO_LOCAL_TRAFFIC,
      nodeIP: this.node.nodeIP,
      localhostRejects: this.localhostRejects,
    };
  }

  /** Applies the snapshot through the sync driver. Rejects on failure; the next sync is then full. */
  sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    let lines: string[] | null = null;
    return this.driver.sync(snapshot, (full) => {
      lines = this.opts.keepLastTransaction ? [] : null;
      return this.syncBody(snapshot, full, lines);
    }, (err) => {
      const e = err as NftablesError;
      this.log.error("nftables sync failed", e.message, { line: e.line, rule: e.inputLine });
      nftablesSyncFailuresTotal.inc({ ip_family: this.family });
      // The flushes of stale chains did not happen: the next full sync finds them again.
      this.staleChains.clear();
      if (lines !== null) this.lastTransaction = lines.length ? lines.join("\n") + "\n" : "";
    });
  }

  /** This mode's part of a sync: one `nft -f -` transaction (a full sync: several, new ports' chains first). */
  private async syncBody(
    snapshot: ProxySnapshot,
    dueFull: boolean,
    lines: string[] | null,
  ): Promise<ModeSyncOutcome> {
    this.observeNode(snapshot);
    // Chains emptied at least a second ago: deleted at the end of this sync's transaction (unless it uses them
    // again). Taken out of the waiting list now, so that the syncPeriod poll does not delete them too.
    const due = this.staleChains.takeDue();
    let deleted = 0;

    let full = dueFull;
    const cfg = this.renderConfig();
    if (this.cfg === null || this.cfg.nodeIP !== cfg.nodeIP) {
      // Every port renders differently now (the source-range self-allow depends on the node IP).
      this.cfg = cfg;
      full = true;
    }
    // ServiceCIDRs and NodePort addresses live in the fixed part of the table, written by full syncs.
    if (snapshot.serviceCIDRs.join(",") !== this.serviceCIDRs.join(",")) full = true;
    this.serviceCIDRs = snapshot.serviceCIDRs;

    const gen = { ms: 0 };
    const tApply = performance.now();
    let bytes = 0;
    let commit: () => void;
    if (full) {
      await this.readNodePortIPs();
      const existing = await this.listObjects();
      const early = new Set<string>();
      if (existing !== null) {
        const portsPerRun = this.opts.precreatePorts ?? 1000;
        const input = { nft: this.nft, family: this.family, cfg: this.cfg, portsPerRun };
        bytes += await precreate(input, snapshot, existing, early, gen, lines);
      }
      const out = newFullResult();
      let ops: Iterable<Operation> = timed(this.fullOps(snapshot, existing, due, out, early), gen);
      if (lines !== null) ops = recorded(ops, lines, this.fam);
      bytes += await this.nft.runOperations(ops);
      commit = () => this.commitFull(snapshot, out);
      deleted = out.deleted.length;
    } else {
      const t = performance.now();
      const tx = new PartialSyncTx();
      const changes = buildPartial(snapshot, tx, due, {
        cfg: this.cfg,
        family: this.family,
        written: this.written,
        elements: this.elements,
        staleChains: this.staleChains,
      });
      commit = () => this.commitPartial(changes);
      deleted = due.size;
      const transaction = tx.build(this.nft);
      bytes = transaction.byteLength();
      gen.ms = performance.now() - t;
      if (lines !== null) lines.push(...transaction.lines());
      await this.nft.run(transaction);
    }
    const applyMs = performance.now() - tApply;
    if (deleted > 0) this.log.info("Deleted stale nftables chains", { numChains: deleted });
    // A full sync's text is as big as the payload (50 MiB at 10k × 10): not kept unless asked for.
    if (lines !== null) this.lastTransaction = lines.length ? lines.join("\n") + "\n" : "";
    commit();
    this.localhostProxy?.sync(localhostNodePorts(snapshot));
    if (full) this.baseChainsRecreated = true;
    return { full, bytes, generateMs: gen.ms, applyMs };
  }

  /**
   * Hands the full sync of the snapshot to `nft -c -f -` (the same operations a full sync streams, as one
   * transaction): nothing is committed and nothing this dataplane remembers changes (written ports and
   * elements, stale chains and their deletion times, the next sync's fullness, the NodePort addresses the
   * syncPeriod poll compares, metrics). Lists the table as a full sync does. Rejects with nft's error when
   * refused.
   */
  async check(snapshot: ProxySnapshot): Promise<void> {
    if (snapshot.family !== this.family) {
      throw new Error(`nftables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    this.observeNode(snapshot);
    const due = this.staleChains.due();
    const fresh = this.renderConfig();
    const cfg = this.cfg === null || this.cfg.nodeIP !== fresh.nodeIP ? fresh : this.cfg;
    const tx = this.nft.newTransaction();
    const savedIPs = this.nodePortIPs;
    try {
      await this.readNodePortIPs();
      const existing = await this.listObjects();
      const out = newFullResult();
      // Nothing written ahead: the check holds the whole sync in one transaction.
      for (const o of this.fullOps(snapshot, existing, due, out, new Set(), cfg, snapshot.serviceCIDRs)) {
        tx.push(o);
      }
    } finally {
      this.nodePortIPs = savedIPs;
    }
    if (this.opts.keepLastTransaction) this.lastCheckedTransaction = tx.toString();
    await this.nft.check(tx);
  }

  /**
   * The full sync's operations (see {@linkcode fullSyncOps}). A generator itself, so that the dataplane's state
   * is read when the first operation is asked for, as nft starts reading.
   */
  private *fullOps(
    snapshot: ProxySnapshot,
    existing: TableObjects | null,
    due: Set<string>,
    out: FullResult,
    early: ReadonlySet<string>,
    cfg: NftRenderConfig = this.cfg!,
    serviceCIDRs: readonly string[] = this.serviceCIDRs,
  ): Generator<Operation, void, undefined> {
    const setup = {
      family: this.family,
      mark: this.mark,
      nodePortsMatchAll: this.node.nodePortAddresses.matchAll,
      nodePortIPs: this.nodePortIPs,
      serviceCIDRs,
      recreateBaseChains: !this.baseChainsRecreated,
      masqueradeAll: cfg.masqueradeAll,
      localTraffic: cfg.localTraffic,
      localhostRejects: this.localhostRejects,
    };
    yield* fullSyncOps(
      {
        family: this.family,
        setup,
        cfg,
        knownChains: () => knownChains(snapshot, due, this.staleChains, this.written, this.cfg!),
      },
      snapshot,
      existing,
      due,
      out,
      early,
    );
  }

  /** Remembers what a full sync wrote, once nft applied it. */
  private commitFull(snapshot: ProxySnapshot, out: FullResult): void {
    this.written = new Map(snapshot.servicePorts);
    this.elements = out.elements;
    this.staleChains.keepOnly(out.stale);
  }

  /** Remembers what a partial sync changed, once nft applied it. */
  private commitPartial(changes: PartialSyncChanges): void {
    for (const [name, st] of changes.updates) {
      if (st === null) this.written.delete(name);
      else this.written.set(name, st);
    }
    this.elements.apply(changes.newOwners, changes.kernelChanges);
    this.staleChains.update(changes.revived, changes.stale);
  }
}
