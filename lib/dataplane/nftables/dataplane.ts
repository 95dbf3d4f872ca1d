/**
 * The nftables dataplane: renders a {@linkcode ProxySnapshot} into one `nft -f -` transaction per sync and
 * family (atomic), in the `ip kube-proxy` / `ip6 kube-proxy` table upstream v1.37 writes.
 *
 * - Full sync (start, after a failure, periodic, node IP or nodePortAddresses change): the fixed layout
 *   (`setupOps`), every service port's chains, affinity sets and elements; the shared maps and sets are
 *   flushed and refilled in the same transaction. The transaction is generated port by port while nft reads
 *   it (`Nftables.runOperations`: bounded chunks, no transaction-sized text). Chains and affinity sets of ports
 *   the kernel has none of go ahead in runs of `precreatePorts` (unreferenced until the sync's transaction adds
 *   the elements leading to them): the kernel's commit costs the transaction's length per anonymous set, so one
 *   10k-port transaction costs that squared. The table's chains and sets are
 *   listed once (not on partial syncs) to find leftovers of an earlier run; every existing generated chain is
 *   emptied first (v1.35's layout kept endpoint chains on the first sync; v1.37 has them only for affinity, and
 *   their rules changed, so nothing is kept).
 * - Partial sync: only the changed Services. For each port the dataplane keeps only the state it last wrote
 *   (the model's own object) and renders it again to see what the kernel holds, so the transaction holds only
 *   what differs: chains whose rules changed, added and removed affinity sets and map elements. The elements of
 *   the shared maps are kept with their owners. The table is never listed.
 * - Stale chains are flushed at once and deleted in a later transaction, at least a second later (kernels
 *   before 6.2 notice late that a chain is no longer referenced by a map element), as upstream; unlike upstream,
 *   which deletes them in a transaction of its own before the sync's, they go at the end of the next sync's own
 *   transaction (or of the syncPeriod poll's): every nft run costs nft's fetch of the table's chains first
 *   (~0.9 s at 10k Services × 10 endpoints with nft 1.0.6), so a sync runs nft once, not twice.
 * - A failed transaction logs nft's error with the failing input line, counts in
 *   `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`, rejects, and the next sync is full.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import { nftablesCleanupFailuresTotal, nftablesSyncFailuresTotal } from "../../metrics.ts";
import { isLoopback } from "../../net/ip.ts";
import {
  familyNodeIP,
  newNodePortAddresses,
  type NodePortAddresses,
  nodePortIPs,
} from "../../net/node_addresses.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import type { Dataplane, IPFamily, ProxySnapshot, ServicePortState, SyncResult } from "../../proxy/types.ts";
import { type LocalTraffic, NO_LOCAL_TRAFFIC } from "../local_traffic.ts";
import { masqueradeMark } from "../masquerade.ts";
import { NftablesError } from "./errors.ts";
import type { Nftables } from "./interface.ts";
import { isAffinitySetName, isServiceChainName, SET, TABLE, TABLE_COMMENT } from "./names.ts";
import { type LocalhostNodePort, LocalhostNodePortProxy } from "./localhost_nodeport_proxy.ts";
import { NftablesRunner } from "./nft_runner.ts";
import { type NftObject, writeObject } from "./objects.ts";
import type { Operation, Transaction } from "./transaction.ts";
import {
  elementContainerDeclarations,
  elementContainers,
  elementObject,
  localhostNodePortHandling,
  type NftElement,
  nftFamily,
  type NftOp,
  type NftPortRender,
  type NftRenderConfig,
  renderServicePort,
  ruleObject,
  setupOps,
} from "./rules.ts";

/** Options of {@linkcode NftablesDataplane}. */
export interface NftablesDataplaneOptions {
  family: IPFamily;
  /** Runs `ip` for CIDR nodePortAddresses, and `nft` unless `nftables` is given. */
  runner: CommandRunner;
  /** The table's nftables access (default: `nft` through `runner`; tests pass a FakeNftables). */
  nftables?: Nftables;
  /** Default 14. */
  masqueradeBit?: number;
  masqueradeAll?: boolean;
  /** How local pod traffic is recognized; default none. */
  localTraffic?: LocalTraffic;
  /** CIDRs and/or `primary`; the agent passes `["primary"]` when unset, as upstream's nftables mode. */
  nodePortAddresses?: readonly string[];
  /** A specific bindAddress overrides the Node's IP of its family (source-range self-allow). */
  nodeIP?: string;
  /** Node addresses to use instead of `ip -j addr show` (tests). */
  nodeAddresses?: readonly string[];
  logger?: Logger;
  /** Keep the last transaction's text in `lastTransaction` (tests, render). Default false. */
  keepLastTransaction?: boolean;
  /** Wall clock in ms for the stale-chain delay (tests). */
  now?: () => number;
  /**
   * The KubeProxyNFTablesLocalhostNodePorts gate (alpha, default off): localhost NodePort traffic is rejected and
   * counted per protocol; when nodePortAddresses names loopback explicitly, TCP NodePorts are served by a
   * userspace listener on the family's loopback address instead (UDP and SCTP still rejected), as upstream.
   */
  localhostNodePorts?: boolean;
  /**
   * Full syncs write the chains and affinity sets of ports that the kernel does not have yet (no chain or set of
   * theirs listed) ahead of the sync's transaction, this many ports per `nft -f` run; those objects are
   * unreferenced until the sync's transaction adds the map elements that lead to them, so what traffic sees
   * still changes at once. Fewer such ports than this go in the sync's transaction. 0 turns it off.
   * Why: the kernel walks the whole transaction for every anonymous set (numgen map) it binds, so one
   * transaction of 10k Services costs that squared (half the commit time at 10k × 10). @default 1000
   */
  precreatePorts?: number;
}

/** Sections of a partial sync's transaction, written in this order. */
class Tx {
  flushes: NftOp[] = [];
  setDeletes: NftOp[] = [];
  setAdds: NftOp[] = [];
  chains: NftOp[] = [];
  rules: NftOp[] = [];
  elemDeletes: NftOp[] = [];
  elemAdds: NftOp[] = [];
  chainDeletes: NftOp[] = [];

  /** The operations as one transaction. */
  build(nft: Nftables): Transaction {
    const tx = nft.newTransaction();
    const sections = [
      this.flushes,
      this.setDeletes,
      this.setAdds,
      this.chains,
      this.rules,
      this.elemDeletes,
      this.elemAdds,
      this.chainDeletes,
    ];
    for (const section of sections) for (const [verb, obj] of section) tx.push({ verb, obj });
    return tx;
  }
}

/** A port's rendering as compared by a partial sync. */
interface PortContent {
  /** Chain name → its rules joined by "\n". */
  chains: Map<string, string>;
  affinitySets: Set<string>;
  affinityTimeout: number;
  /** `container key` → `value\tcomment` of the elements this port contributes (its first of each key). */
  elements: Map<string, string>;
}

/**
 * Owners of an element in the shared maps and sets: the one port that contributes it (the kernel then holds that
 * port's value), or, when several do, each port's value in the order they came (the first one's is the kernel's).
 */
type Owners = string | Map<string, string>;

/** What a full sync found and wrote, committed when nft succeeds. */
interface FullResult {
  owners: Map<string, Owners>;
  kernel: Map<string, string>;
  stale: string[];
  /** Stale chains deleted by this transaction. */
  deleted: string[];
}

const STALE_CHAIN_DELAY_MS = 1000;
/**
 * Upstream v1.35's (and this agent's before) chain that marked packets for masquerade; v1.37 marks inline. Upstream
 * v1.37 leaves it behind in a table an older version wrote; the agent deletes it on a full sync that finds it.
 */
const LEGACY_MARK_CHAIN = "mark-for-masquerade";

function elementKey(e: NftElement): string {
  return `${e.container} ${e.key}`;
}

function elementValue(e: NftElement): string {
  return `${e.value ?? ""}\t${e.comment ?? ""}`;
}

function op(verb: Operation["verb"], obj: NftObject): Operation {
  return { verb, obj };
}

/** Times the iteration of `gen` (the generation share of a streamed transaction). */
function* timed<T>(gen: Iterable<T>, acc: { ms: number }): Generator<T, void, undefined> {
  const it = gen[Symbol.iterator]();
  try {
    for (;;) {
      const t = performance.now();
      const r = it.next();
      acc.ms += performance.now() - t;
      if (r.done) return;
      yield r.value;
    }
  } finally {
    it.return?.();
  }
}

/** nftables dataplane for one IP family. */
export class NftablesDataplane implements Dataplane {
  readonly family: IPFamily;
  private readonly runner: CommandRunner;
  private readonly log: Logger;
  private readonly opts: NftablesDataplaneOptions;
  private readonly nft: Nftables;
  private readonly fam: "ip" | "ip6";
  private readonly now: () => number;
  private readonly mark: string;

  private cfg: NftRenderConfig | null = null;
  private npa: NodePortAddresses | null = null;
  private nodePortIPs: string[] = [];
  private serviceCIDRs: readonly string[] = [];
  /** Protocols whose localhost NodePort traffic is rejected (set with the node port addresses). */
  private localhostRejects: readonly string[] = [];
  /** The loopback listeners of TCP NodePorts (gate on and loopback named in nodePortAddresses). */
  private localhostProxy: LocalhostNodePortProxy | null = null;
  private needFull = true;
  private everSynced = false;
  private baseChainsRecreated = false;

  /** The state each port in the kernel was rendered from (rendered again to know what the kernel holds). */
  private written = new Map<string, ServicePortState>();
  /** Owners of every element in the kernel, by `container key`. */
  private elementOwners = new Map<string, Owners>();
  /** Element values in the kernel (`value\tcomment`), by `container key`. */
  private kernelElements = new Map<string, string>();
  /** Emptied chains waiting for deletion, and since when. */
  private staleChains = new Map<string, number>();
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
    this.now = opts.now ?? (() => Date.now());
    this.mark = masqueradeMark(opts.masqueradeBit ?? 14);
  }
  /**
   * Polled every syncPeriod: deletes stale chains that are old enough, and tells whether a full sync is due
   * (the table vanished, or the addresses accepting NodePorts changed).
   */
  async needsFullSync(): Promise<boolean> {
    if (!this.everSynced) return false;
    if (this.needFull) return true;
    await this.deleteStaleChains();
    const exists = await this.nft.tableExists().catch((err) => {
      this.log.error("Checking for the nftables table failed", err);
      return false;
    });
    if (!exists) {
      this.log.info("nftables table is gone (flushed externally?); next sync is full", {
        table: `${this.fam} ${TABLE}`,
      });
      this.needFull = true;
      return true;
    }
    if (this.npa !== null && !this.npa.matchAll) {
      const before = this.nodePortIPs.join(",");
      await this.readNodePortIPs();
      if (this.nodePortIPs.join(",") !== before) {
        this.log.info("Node addresses accepting NodePorts changed; next sync is full", {
          ips: this.nodePortIPs,
        });
        this.needFull = true;
        return true;
      }
    }
    return false;
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

  /** The TCP NodePorts the loopback listeners serve, with the external policy's endpoints (upstream's). */
  private localhostNodePorts(snapshot: ProxySnapshot): LocalhostNodePort[] {
    const out: LocalhostNodePort[] = [];
    for (const [name, st] of snapshot.servicePorts) {
      if (st.info.protocol !== "TCP" || st.info.nodePort === 0) continue;
      const eps =
        (st.plan.externalPolicyLocal ? st.selection.localEndpoints : st.selection.clusterEndpoints) ?? [];
      out.push({
        name,
        nodePort: st.info.nodePort,
        endpoints: eps.map((e) => ({ ip: e.ip, port: e.port })),
        affinitySeconds: st.info.stickyMaxAgeSeconds,
      });
    }
    return out;
  }

  private async readNodePortIPs(): Promise<void> {
    const ips = await nodePortIPs(this.npa!, this.runner, this.log, this.opts.nodeAddresses);
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
    const cutoff = this.now() - STALE_CHAIN_DELAY_MS;
    const tx = this.nft.newTransaction();
    const deleted: string[] = [];
    for (const [chain, since] of this.staleChains) {
      if (since <= cutoff) {
        tx.delete({ kind: "chain", name: chain });
        deleted.push(chain);
      }
    }
    if (deleted.length === 0) return;
    for (const c of deleted) this.staleChains.delete(c);
    this.log.info("Deleting stale nftables chains", { numChains: deleted.length });
    if (this.opts.keepLastTransaction) this.lastTransaction = tx.toString();
    try {
      await this.nft.run(tx);
    } catch (err) {
      // If the chains still exist the next full sync finds them and flushes them again.
      this.log.error("Unable to delete stale chains; will retry later", err);
      nftablesCleanupFailuresTotal.inc({ ip_family: this.family });
      this.needFull = true;
    }
  }

  /** Chains and affinity sets of the table now (full syncs only); null when listing fails. */
  private async listObjects(): Promise<{ chains: Set<string>; sets: Set<string> } | null> {
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

  private renderConfig(snapshot: ProxySnapshot): NftRenderConfig {
    const o = this.opts;
    return {
      family: this.family,
      mark: this.mark,
      masqueradeAll: o.masqueradeAll ?? false,
      localTraffic: o.localTraffic ?? NO_LOCAL_TRAFFIC,
      nodeIP: familyNodeIP(this.family, o.nodeIP, snapshot.node.ips),
      localhostRejects: this.localhostRejects,
    };
  }

  /** Applies the snapshot. Rejects on failure; the next sync is then full. */
  async sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    if (snapshot.family !== this.family) {
      throw new Error(`nftables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    if (this.npa === null) {
      this.npa = newNodePortAddresses(this.family, this.opts.nodePortAddresses ?? [], snapshot.node.ips);
      this.localhostRejects = this.localhostRejectProtocols(this.npa);
    }
    // Chains emptied at least a second ago: deleted at the end of this sync's transaction (unless it uses them
    // again). Taken out of the waiting list now, so that the syncPeriod poll does not delete them too.
    const cutoff = this.now() - STALE_CHAIN_DELAY_MS;
    const due = new Set<string>();
    for (const [chain, since] of this.staleChains) if (since <= cutoff) due.add(chain);
    for (const chain of due) this.staleChains.delete(chain);
    let deleted = 0;

    let full = this.needFull || snapshot.changedServices === null;
    const cfg = this.renderConfig(snapshot);
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
    const lines: string[] | null = this.opts.keepLastTransaction ? [] : null;
    try {
      if (full) {
        await this.readNodePortIPs();
        const existing = await this.listObjects();
        const early = new Set<string>();
        if (existing !== null) bytes += await this.precreate(snapshot, existing, early, gen, lines);
        const out: FullResult = { owners: new Map(), kernel: new Map(), stale: [], deleted: [] };
        let ops: Iterable<Operation> = timed(this.fullOps(snapshot, existing, due, out, early), gen);
        if (lines !== null) ops = this.recorded(ops, lines);
        bytes += await this.nft.runOperations(ops);
        commit = () => this.commitFull(snapshot, out);
        deleted = out.deleted.length;
      } else {
        const t = performance.now();
        const tx = new Tx();
        commit = this.buildPartial(snapshot, tx, due);
        deleted = due.size;
        const transaction = tx.build(this.nft);
        bytes = transaction.byteLength();
        gen.ms = performance.now() - t;
        if (lines !== null) lines.push(...transaction.lines());
        await this.nft.run(transaction);
      }
    } catch (err) {
      const e = err as NftablesError;
      this.log.error("nftables sync failed", e.message, { line: e.line, rule: e.inputLine });
      nftablesSyncFailuresTotal.inc({ ip_family: this.family });
      // The flushes of stale chains did not happen: the next full sync finds them again.
      this.staleChains.clear();
      this.needFull = true;
      if (lines !== null) this.lastTransaction = lines.length ? lines.join("\n") + "\n" : "";
      throw err;
    }
    const applyMs = performance.now() - tApply;
    const generateMs = gen.ms;
    if (deleted > 0) this.log.info("Deleted stale nftables chains", { numChains: deleted });
    // A full sync's text is as big as the payload (50 MiB at 10k × 10): not kept unless asked for.
    if (lines !== null) this.lastTransaction = lines.length ? lines.join("\n") + "\n" : "";
    commit();
    this.localhostProxy?.sync(this.localhostNodePorts(snapshot));
    if (full) this.baseChainsRecreated = true;
    this.needFull = false;
    this.everSynced = true;
    this.log.v(2).info("SyncProxyRules complete", {
      full,
      bytes,
      generateMs: Math.round(generateMs * 10) / 10,
      applyMs: Math.round(applyMs),
    });
    return { full, payloadBytes: bytes, generateMs, applyMs };
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
    if (this.npa === null) {
      this.npa = newNodePortAddresses(this.family, this.opts.nodePortAddresses ?? [], snapshot.node.ips);
      this.localhostRejects = this.localhostRejectProtocols(this.npa);
    }
    const cutoff = this.now() - STALE_CHAIN_DELAY_MS;
    const due = new Set<string>();
    for (const [chain, since] of this.staleChains) if (since <= cutoff) due.add(chain);
    const fresh = this.renderConfig(snapshot);
    const cfg = this.cfg === null || this.cfg.nodeIP !== fresh.nodeIP ? fresh : this.cfg;
    const tx = this.nft.newTransaction();
    const savedIPs = this.nodePortIPs;
    try {
      await this.readNodePortIPs();
      const existing = await this.listObjects();
      const out: FullResult = { owners: new Map(), kernel: new Map(), stale: [], deleted: [] };
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

  /** Passes the operations on, keeping each one's input line. */
  private *recorded(ops: Iterable<Operation>, lines: string[]): Generator<Operation, void, undefined> {
    for (const o of ops) {
      lines.push(writeObject(o.verb, o.obj, this.fam, TABLE));
      yield o;
    }
  }

  private affinitySetOp(name: string, timeout: number): Operation {
    const type = this.family === "IPv6" ? "ipv6_addr" : "ipv4_addr";
    return op("add", { kind: "set", name, type, flags: ["dynamic", "timeout"], timeout });
  }

  /** The content of a rendered port, as a partial sync compares it. */
  private contentOf(r: NftPortRender): PortContent {
    const chains = new Map<string, string>();
    for (const [name, rules] of r.chains) chains.set(name, rules.join("\n"));
    const elements = new Map<string, string>();
    for (const e of r.elements) {
      const k = elementKey(e);
      if (!elements.has(k)) elements.set(k, elementValue(e));
    }
    return { chains, affinitySets: new Set(r.affinitySets), affinityTimeout: r.affinityTimeout, elements };
  }

  /**
   * The generated chains the kernel may hold when the table could not be listed: those waiting for deletion and
   * those of ports whose state changed since they were written (a port whose state is the same has the same
   * chains, which this sync writes again).
   */
  private knownChains(snapshot: ProxySnapshot, due: Set<string>): Set<string> {
    const known = new Set<string>([...this.staleChains.keys(), ...due]);
    for (const [name, old] of this.written) {
      if (snapshot.servicePorts.get(name) === old) continue;
      for (const c of renderServicePort(old, this.cfg!).chains.keys()) known.add(c);
    }
    return known;
  }

  /**
   * Writes the chains and affinity sets of ports the kernel has none of (per `existing`), in runs of
   * `precreatePorts` ports, ahead of the full sync's transaction; adds the ports written to `early`. Only full
   * runs are sent (a remainder goes in the sync's transaction). Returns the bytes sent.
   */
  private async precreate(
    snapshot: ProxySnapshot,
    existing: { chains: Set<string>; sets: Set<string> },
    early: Set<string>,
    gen: { ms: number },
    lines: string[] | null,
  ): Promise<number> {
    const size = this.opts.precreatePorts ?? 1000;
    if (size <= 0 || snapshot.servicePorts.size < size) return 0;
    const cfg = this.cfg!;
    let bytes = 0;
    let batch: Operation[] = [];
    let names: string[] = [];
    let t = performance.now();
    for (const [name, st] of snapshot.servicePorts) {
      const r = renderServicePort(st, cfg);
      let known = false;
      for (const c of r.chains.keys()) if (existing.chains.has(c)) known = true;
      for (const s of r.affinitySets) if (existing.sets.has(s)) known = true;
      if (known) continue;
      if (batch.length === 0) {
        // The shared maps declared before any anonymous set: the kernel finds a set by name walking the table's
        // sets in creation order, once per element added, so these go first (10k × 10: a third of the commit).
        batch.push(op("add", { kind: "table", comment: TABLE_COMMENT }));
        for (const c of elementContainerDeclarations(this.family)) batch.push(op("add", c));
      }
      for (const set of r.affinitySets) batch.push(this.affinitySetOp(set, r.affinityTimeout));
      for (const chain of r.chains.keys()) {
        batch.push(op("add", { kind: "chain", name: chain }), op("flush", { kind: "chain", name: chain }));
      }
      for (const [chain, rules] of r.chains) {
        for (const rule of rules) batch.push(op("add", ruleObject(chain, rule)));
      }
      names.push(name);
      if (names.length < size) continue;
      gen.ms += performance.now() - t;
      if (lines !== null) { for (const o of batch) lines.push(writeObject(o.verb, o.obj, this.fam, TABLE)); }
      bytes += await this.nft.runOperations(batch);
      for (const n of names) early.add(n);
      batch = [];
      names = [];
      t = performance.now();
    }
    gen.ms += performance.now() - t;
    return bytes;
  }

  /**
   * The full sync's operations, port by port: the fixed layout and the emptied shared maps; every existing
   * generated chain emptied (so that no rule uses an affinity set deleted below); for each port its affinity
   * sets, its chains declared, then its rules (a port's rules only refer to its own chains and sets, and to fixed
   * chains); then every element, and the chains and affinity sets nobody uses any more. Fills `out` as it goes.
   */
  private *fullOps(
    snapshot: ProxySnapshot,
    existing: { chains: Set<string>; sets: Set<string> } | null,
    due: Set<string>,
    out: FullResult,
    early: ReadonlySet<string>,
    cfg: NftRenderConfig = this.cfg!,
    serviceCIDRs: readonly string[] = this.serviceCIDRs,
  ): Generator<Operation, void, undefined> {
    const setup = setupOps({
      family: this.family,
      mark: this.mark,
      nodePortsMatchAll: this.npa!.matchAll,
      nodePortIPs: this.nodePortIPs,
      serviceCIDRs,
      recreateBaseChains: !this.baseChainsRecreated,
      masqueradeAll: cfg.masqueradeAll,
      localTraffic: cfg.localTraffic,
      localhostRejects: this.localhostRejects,
    });
    for (const [verb, obj] of setup) yield op(verb, obj);
    for (const c of elementContainers(this.family)) yield op("flush", c);
    if (this.localhostRejects.length > 0) {
      yield op("flush", { kind: "map", name: SET.localhostNodePortRejects });
    }

    // Generated chains that may be stale: what the kernel has (listed), else what this dataplane knows of.
    // Each chain a port uses is taken out as the port is written; what remains at the end is stale.
    const candidates = existing?.chains ?? this.knownChains(snapshot, due);
    if (existing !== null) {
      for (const c of existing.chains) {
        if (isServiceChainName(c)) yield op("flush", { kind: "chain", name: c });
      }
      // The v1.35 layout's masquerade helper: no rule refers to it once the chains above are emptied.
      if (existing.chains.has(LEGACY_MARK_CHAIN)) {
        yield op("delete", { kind: "chain", name: LEGACY_MARK_CHAIN });
      }
    }

    const activeSets = new Set<string>();
    const { owners, kernel } = out;
    const toWrite: string[] = [];
    for (const [name, st] of snapshot.servicePorts) {
      const r = renderServicePort(st, cfg);
      if (early.has(name)) {
        // Written ahead by precreate(): only its elements (below) are this transaction's.
        for (const set of r.affinitySets) activeSets.add(set);
        for (const chain of r.chains.keys()) candidates.delete(chain);
      }
      for (const set of early.has(name) ? [] : r.affinitySets) {
        activeSets.add(set);
        // An existing set may carry another timeout: re-create it (its chains were emptied above).
        if (existing?.sets.has(set)) yield op("delete", { kind: "set", name: set });
        yield this.affinitySetOp(set, r.affinityTimeout);
      }
      toWrite.length = 0;
      for (const chain of early.has(name) ? [] : r.chains.keys()) {
        candidates.delete(chain);
        toWrite.push(chain);
        yield op("add", { kind: "chain", name: chain });
        yield op("flush", { kind: "chain", name: chain });
      }
      for (const chain of toWrite) {
        for (const rule of r.chains.get(chain)!) yield op("add", ruleObject(chain, rule));
      }
      for (const e of r.elements) {
        const ckey = elementKey(e);
        const value = elementValue(e);
        const o = owners.get(ckey);
        if (o === undefined) {
          owners.set(ckey, name);
          kernel.set(ckey, value);
        } else if (typeof o === "string") {
          if (o !== name) owners.set(ckey, new Map([[o, kernel.get(ckey)!], [name, value]]));
        } else if (!o.has(name)) o.set(name, value);
      }
    }
    for (const [ckey, value] of kernel) yield this.elementOp("add", ckey, value);
    // Leftovers: generated chains and affinity sets nobody uses now (an earlier run, or failed syncs).
    for (const c of candidates) {
      if (!isServiceChainName(c)) continue;
      // Not emptied above (not listed): emptied now.
      if (existing === null) {
        yield op("add", { kind: "chain", name: c });
        yield op("flush", { kind: "chain", name: c });
      }
      if (due.has(c)) {
        yield op("delete", { kind: "chain", name: c });
        out.deleted.push(c);
      } else out.stale.push(c);
    }
    for (const s of existing?.sets ?? []) {
      if (isAffinitySetName(s) && !activeSets.has(s)) yield op("delete", { kind: "set", name: s });
    }
  }

  private commitFull(snapshot: ProxySnapshot, out: FullResult): void {
    this.written = new Map(snapshot.servicePorts);
    this.elementOwners = out.owners;
    this.kernelElements = out.kernel;
    const now = this.now();
    const stale = new Map<string, number>();
    for (const c of out.stale) stale.set(c, this.staleChains.get(c) ?? now);
    this.staleChains = stale;
  }

  /** An element operation from its `container key` and `value\tcomment`. */
  private elementOp(verb: "add" | "delete", ckey: string, value: string | null): Operation {
    const sp = ckey.indexOf(" ");
    if (value === null) return op(verb, elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), null, null));
    const tab = value.indexOf("\t");
    const v = value.slice(0, tab), comment = value.slice(tab + 1);
    return op(verb, elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), v || null, comment || null));
  }

  /** The owners of an element as a map of port → value (a copy). */
  private ownerMap(ckey: string): Map<string, string> {
    const o = this.elementOwners.get(ckey);
    if (o === undefined) return new Map();
    if (typeof o === "string") return new Map([[o, this.kernelElements.get(ckey)!]]);
    return new Map(o);
  }

  /** Empties a chain that is no longer used (created first, so that a chain missing already is no error). */
  private staleFlush(tx: Tx, name: string): void {
    tx.flushes.push(["add", { kind: "chain", name }], ["flush", { kind: "chain", name }]);
  }

  /** Declares (or empties) a chain and queues its rules after every declaration of the transaction. */
  private writeChain(tx: Tx, name: string, rules: readonly string[]): void {
    tx.chains.push(["add", { kind: "chain", name }], ["flush", { kind: "chain", name }]);
    for (const rule of rules) tx.rules.push(["add", ruleObject(name, rule)]);
  }

  private buildPartial(snapshot: ProxySnapshot, tx: Tx, due: Set<string>): () => void {
    const cfg = this.cfg!;
    const changed = snapshot.changedServices!;
    const updates = new Map<string, ServicePortState | null>();
    const stale: string[] = [];
    const revived: string[] = [];
    const touched = new Set<string>();
    const ownerChanges: [ckey: string, port: string, value: string | null][] = [];

    const diffPort = (name: string, oldR: NftPortRender | undefined, r: NftPortRender | null) => {
      const old = oldR === undefined ? undefined : this.contentOf(oldR);
      const neu = r === null ? null : this.contentOf(r);
      const recreateSets = old !== undefined && neu !== null && old.affinityTimeout !== neu.affinityTimeout &&
        old.affinitySets.size > 0 && neu.affinitySets.size > 0;
      // Chains.
      for (const [chain, rules] of neu?.chains ?? []) {
        const before = old?.chains.get(chain);
        if (before === rules && !recreateSets) continue;
        // Emptied first: its old rules may reference an affinity set deleted before it is rewritten.
        if (before !== undefined) tx.flushes.push(["flush", { kind: "chain", name: chain }]);
        this.writeChain(tx, chain, r!.chains.get(chain)!);
        if (this.staleChains.has(chain) || due.has(chain)) {
          revived.push(chain);
          due.delete(chain);
        }
      }
      for (const chain of old?.chains.keys() ?? []) {
        if (neu?.chains.has(chain)) continue;
        this.staleFlush(tx, chain);
        stale.push(chain);
      }
      // Affinity sets.
      for (const set of old?.affinitySets ?? []) {
        if (recreateSets || !neu?.affinitySets.has(set)) {
          tx.setDeletes.push(["delete", { kind: "set", name: set }]);
        }
      }
      for (const set of neu?.affinitySets ?? []) {
        if (recreateSets || !old?.affinitySets.has(set)) {
          const o = this.affinitySetOp(set, neu!.affinityTimeout);
          tx.setAdds.push([o.verb as "add", o.obj]);
        }
      }
      // Elements: ownership changes, applied below once every port is known.
      for (const [ckey, value] of old?.elements ?? []) {
        if (neu?.elements.get(ckey) !== value) {
          ownerChanges.push([ckey, name, null]);
          touched.add(ckey);
        }
      }
      for (const [ckey, value] of neu?.elements ?? []) {
        if (old?.elements.get(ckey) !== value) {
          ownerChanges.push([ckey, name, value]);
          touched.add(ckey);
        }
      }
    };

    for (const [name, st] of snapshot.servicePorts) {
      const old = this.written.get(name);
      if (old === st) continue;
      if (old !== undefined && (!changed.has(st.info.serviceKey) || sameRenderedState(old, st))) {
        // Renders as what the kernel has (an unchanged Service's state is the same by contract): keep the new
        // object, so that the old one can go.
        if (sameRenderedState(old, st)) updates.set(name, st);
        continue;
      }
      diffPort(name, old === undefined ? undefined : renderServicePort(old, cfg), renderServicePort(st, cfg));
      updates.set(name, st);
    }
    for (const [name, old] of this.written) {
      if (snapshot.servicePorts.has(name)) continue;
      diffPort(name, renderServicePort(old, cfg), null);
      updates.set(name, null);
    }

    // Elements: the first remaining owner's value wins; a key nobody owns any more is deleted.
    const newOwners = new Map<string, Map<string, string>>();
    for (const [ckey, port, value] of ownerChanges) {
      let m = newOwners.get(ckey);
      if (m === undefined) newOwners.set(ckey, m = this.ownerMap(ckey));
      if (value === null) m.delete(port);
      else m.set(port, value);
    }
    for (const chain of due) tx.chainDeletes.push(["delete", { kind: "chain", name: chain }]);
    const kernelChanges = new Map<string, string | null>();
    for (const ckey of touched) {
      const m = newOwners.get(ckey)!;
      const want = m.size > 0 ? m.values().next().value! : null;
      const have = this.kernelElements.get(ckey) ?? null;
      if (want === have) continue;
      if (have !== null) {
        const o = this.elementOp("delete", ckey, null);
        tx.elemDeletes.push([o.verb as "delete", o.obj]);
      }
      if (want !== null) {
        const o = this.elementOp("add", ckey, want);
        tx.elemAdds.push([o.verb as "add", o.obj]);
      }
      kernelChanges.set(ckey, want);
    }

    return () => {
      for (const [name, st] of updates) {
        if (st === null) this.written.delete(name);
        else this.written.set(name, st);
      }
      for (const [ckey, m] of newOwners) {
        if (m.size === 0) this.elementOwners.delete(ckey);
        else if (m.size === 1) this.elementOwners.set(ckey, m.keys().next().value!);
        else this.elementOwners.set(ckey, m);
      }
      for (const [ckey, v] of kernelChanges) {
        if (v === null) this.kernelElements.delete(ckey);
        else this.kernelElements.set(ckey, v);
      }
      const now = this.now();
      for (const c of revived) this.staleChains.delete(c);
      for (const c of stale) this.staleChains.set(c, now);
    };
  }
}
