/**
 * The nftables dataplane: renders a {@linkcode ProxySnapshot} into one `nft -f -` transaction per sync and
 * family (atomic), in the `ip kube-proxy` / `ip6 kube-proxy` table upstream v1.35 writes.
 *
 * - Full sync (start, after a failure, periodic, node IP or nodePortAddresses change): the fixed layout
 *   (`setupLines`), every service port's chains, affinity sets and elements; the shared maps and sets are
 *   flushed and refilled in the same transaction. The table's chains and sets are listed once (not on partial
 *   syncs) to find leftovers of an earlier run, and on the first sync endpoint chains that already exist are
 *   kept as they are (their content is fixed by their name), as upstream does to speed up restarts.
 * - Partial sync: only the changed Services. What the kernel holds is kept in memory, so the transaction
 *   holds only what differs: chains whose rules changed, added and removed affinity sets and map elements.
 *   The table is never listed.
 * - Stale chains are flushed at once and deleted in a later transaction, at least a second later (kernels
 *   before 6.2 notice late that a chain is no longer referenced by a map element), as upstream.
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
import type { Dataplane, IPFamily, ProxySnapshot, SyncResult } from "../../proxy/types.ts";
import { type LocalTraffic, NO_LOCAL_TRAFFIC } from "../local_traffic.ts";
import { masqueradeMark } from "../masquerade.ts";
import { NftablesError } from "./errors.ts";
import type { Nftables } from "./interface.ts";
import { isAffinitySetName, isServiceChainName, TABLE } from "./names.ts";
import { NftablesRunner } from "./nft_runner.ts";
import type { Transaction } from "./transaction.ts";
import {
  elementContainers,
  elementObject,
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
}

/** What one service port has in the kernel. */
interface Written {
  /** Chain name → its rules joined by "\n". */
  chains: Map<string, string>;
  affinitySets: Set<string>;
  affinityTimeout: number;
  /** `container key` → `value\tcomment` of the elements this port contributes. */
  elements: Map<string, string>;
}

/** Sections of one transaction, written in this order. */
class Tx {
  setup: NftOp[] = [];
  flushes: NftOp[] = [];
  setDeletes: NftOp[] = [];
  setAdds: NftOp[] = [];
  chains: NftOp[] = [];
  rules: NftOp[] = [];
  elemDeletes: NftOp[] = [];
  elemAdds: NftOp[] = [];

  /** The operations as one transaction. */
  build(nft: Nftables): Transaction {
    const tx = nft.newTransaction();
    const sections = [
      this.setup,
      this.flushes,
      this.setDeletes,
      this.setAdds,
      this.chains,
      this.rules,
      this.elemDeletes,
      this.elemAdds,
    ];
    for (const section of sections) {
      for (const [verb, obj] of section) {
        if (verb === "flush") tx.flush(obj as Parameters<Transaction["flush"]>[0]);
        else tx[verb](obj);
      }
    }
    return tx;
  }
}

const STALE_CHAIN_DELAY_MS = 1000;

function elementKey(e: NftElement): string {
  return `${e.container} ${e.key}`;
}

function elementValue(e: NftElement): string {
  return `${e.value ?? ""}\t${e.comment ?? ""}`;
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
  private needFull = true;
  private everSynced = false;
  private baseChainsRecreated = false;

  private readonly renders = new Map<string, NftPortRender>();
  private written = new Map<string, Written>();
  /** Every element in the kernel: `container key` → the owners' values by port (the first wins). */
  private elementOwners = new Map<string, Map<string, string>>();
  /** Element values in the kernel. */
  private kernelElements = new Map<string, string>();
  private readonly staleChains = new Map<string, number>();
  /** The last transaction's text, kept only with the `keepLastTransaction` option (tests, render). */
  lastTransaction = "";

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

  private async readNodePortIPs(): Promise<void> {
    const ips = await nodePortIPs(this.npa!, this.runner, this.log, this.opts.nodeAddresses);
    this.nodePortIPs = [];
    for (const ip of ips) {
      if (isLoopback(ip)) {
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
    };
  }

  /** Applies the snapshot. Rejects on failure; the next sync is then full. */
  async sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    if (snapshot.family !== this.family) {
      throw new Error(`nftables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    if (this.npa === null) {
      this.npa = newNodePortAddresses(this.family, this.opts.nodePortAddresses ?? [], snapshot.node.ips);
    }
    await this.deleteStaleChains();

    let full = this.needFull || snapshot.changedServices === null;
    const cfg = this.renderConfig(snapshot);
    if (this.cfg === null || this.cfg.nodeIP !== cfg.nodeIP) {
      // Every port renders differently now (the source-range self-allow depends on the node IP).
      this.cfg = cfg;
      this.renders.clear();
      full = true;
    }
    // ServiceCIDRs and NodePort addresses live in the fixed part of the table, written by full syncs.
    if (snapshot.serviceCIDRs.join(",") !== this.serviceCIDRs.join(",")) full = true;
    this.serviceCIDRs = snapshot.serviceCIDRs;

    const tGen = performance.now();
    const tx = new Tx();
    let existing: { chains: Set<string>; sets: Set<string> } | null = null;
    if (full) {
      await this.readNodePortIPs();
      existing = await this.listObjects();
      tx.setup = setupOps({
        family: this.family,
        mark: this.mark,
        nodePortsMatchAll: this.npa.matchAll,
        nodePortIPs: this.nodePortIPs,
        serviceCIDRs: this.serviceCIDRs,
        recreateBaseChains: !this.baseChainsRecreated,
      });
      for (const c of elementContainers(this.family)) tx.setup.push(["flush", c]);
    }
    const built = full ? this.buildFull(snapshot, tx, existing) : this.buildPartial(snapshot, tx);
    const transaction = tx.build(this.nft);
    const bytes = transaction.byteLength();
    const generateMs = performance.now() - tGen;

    const tApply = performance.now();
    try {
      await this.nft.run(transaction);
    } catch (err) {
      const e = err as NftablesError;
      this.log.error("nftables sync failed", e.message, { line: e.line, rule: e.inputLine });
      nftablesSyncFailuresTotal.inc({ ip_family: this.family });
      // The flushes of stale chains did not happen: the next full sync finds them again.
      this.staleChains.clear();
      this.needFull = true;
      if (this.opts.keepLastTransaction) this.lastTransaction = transaction.toString();
      throw err;
    }
    const applyMs = performance.now() - tApply;
    // A full sync's text is as big as the payload (50 MiB at 10k × 10): not kept unless asked for.
    if (this.opts.keepLastTransaction) this.lastTransaction = transaction.toString();
    built.commit();
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

  /** The cached render of a port, re-rendered when its state renders differently. */
  private render(name: string, snapshot: ProxySnapshot): NftPortRender {
    const st = snapshot.servicePorts.get(name)!;
    let r = this.renders.get(name);
    if (r !== undefined && r.state !== st) {
      if (sameRenderedState(r.state, st)) r.state = st;
      else r = undefined;
    }
    if (r === undefined) {
      r = renderServicePort(st, this.cfg!);
      this.renders.set(name, r);
    }
    return r;
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

  private addSet(tx: Tx, name: string, timeout: number): void {
    const type = this.family === "IPv6" ? "ipv6_addr" : "ipv4_addr";
    tx.setAdds.push(["add", { kind: "set", name, type, flags: ["dynamic", "timeout"], timeout }]);
  }

  private deleteSet(tx: Tx, name: string): void {
    tx.setDeletes.push(["delete", { kind: "set", name }]);
  }

  private addElement(tx: Tx, ckey: string, value: string): void {
    const sp = ckey.indexOf(" ");
    const [v, comment] = value.split("\t");
    tx.elemAdds.push([
      "add",
      elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), v || null, comment || null),
    ]);
  }

  private deleteElement(tx: Tx, ckey: string): void {
    const sp = ckey.indexOf(" ");
    tx.elemDeletes.push(["delete", elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), null, null)]);
  }

  /** What a port has once this render is written. */
  private writtenOf(r: NftPortRender): Written {
    const chains = new Map<string, string>();
    for (const [name, rules] of r.chains) chains.set(name, rules.join("\n"));
    const elements = new Map<string, string>();
    for (const e of r.elements) {
      if (!elements.has(elementKey(e))) elements.set(elementKey(e), elementValue(e));
    }
    return { chains, affinitySets: new Set(r.affinitySets), affinityTimeout: r.affinityTimeout, elements };
  }

  private buildFull(
    snapshot: ProxySnapshot,
    tx: Tx,
    existing: { chains: Set<string>; sets: Set<string> } | null,
  ): { commit(): void } {
    const written = new Map<string, Written>();
    const owners = new Map<string, Map<string, string>>();
    const activeChains = new Set<string>();
    const activeSets = new Set<string>();
    // As upstream, only the first sync keeps existing endpoint chains (their rules follow from their name).
    const keepExisting = !this.everSynced && existing !== null;
    for (const name of snapshot.servicePorts.keys()) {
      const r = this.render(name, snapshot);
      const w = this.writtenOf(r);
      written.set(name, w);
      for (const set of r.affinitySets) {
        activeSets.add(set);
        // An existing set may carry another timeout: re-create it (its referencing chains are rewritten below).
        if (existing?.sets.has(set)) this.deleteSet(tx, set);
        this.addSet(tx, set, r.affinityTimeout);
      }
      for (const [chain, rules] of r.chains) {
        activeChains.add(chain);
        if (
          keepExisting && existing!.chains.has(chain) && chain.startsWith("endpoint-") &&
          !r.affinitySets.some((s) => existing!.sets.has(s))
        ) continue;
        if (existing?.chains.has(chain)) tx.flushes.push(["flush", { kind: "chain", name: chain }]);
        this.writeChain(tx, chain, rules);
      }
      for (const [ckey, value] of w.elements) addOwner(owners, ckey, name, value);
    }
    const kernel = new Map<string, string>();
    for (const [ckey, byPort] of owners) {
      const value = byPort.values().next().value!;
      kernel.set(ckey, value);
      this.addElement(tx, ckey, value);
    }
    // Leftovers: generated chains and affinity sets nobody owns now (an earlier run, or failed syncs).
    const stale: string[] = [];
    const known = new Set<string>([...this.staleChains.keys()]);
    for (const w of this.written.values()) for (const c of w.chains.keys()) known.add(c);
    for (const c of new Set([...(existing?.chains ?? []), ...known])) {
      if (isServiceChainName(c) && !activeChains.has(c)) {
        stale.push(c);
        this.staleFlush(tx, c);
      }
    }
    for (const s of existing?.sets ?? []) {
      if (isAffinitySetName(s) && !activeSets.has(s)) this.deleteSet(tx, s);
    }
    return {
      commit: () => {
        this.written = written;
        this.elementOwners = owners;
        this.kernelElements = kernel;
        const now = this.now();
        for (const c of activeChains) this.staleChains.delete(c);
        for (const c of stale) if (!this.staleChains.has(c)) this.staleChains.set(c, now);
        for (const name of [...this.renders.keys()]) {
          if (!snapshot.servicePorts.has(name)) this.renders.delete(name);
        }
      },
    };
  }

  private buildPartial(snapshot: ProxySnapshot, tx: Tx): { commit(): void } {
    const changed = snapshot.changedServices!;
    const updates = new Map<string, Written | null>();
    const stale: string[] = [];
    const revived: string[] = [];
    const touched = new Set<string>();
    const ownerChanges: [ckey: string, port: string, value: string | null][] = [];

    const diffPort = (name: string, old: Written | undefined, r: NftPortRender | null) => {
      const neu = r === null ? null : this.writtenOf(r);
      const recreateSets = old !== undefined && neu !== null && old.affinityTimeout !== neu.affinityTimeout &&
        old.affinitySets.size > 0 && neu.affinitySets.size > 0;
      // Chains.
      for (const [chain, rules] of neu?.chains ?? []) {
        const before = old?.chains.get(chain);
        if (before === rules && !recreateSets) continue;
        // Emptied first: its old rules may reference an affinity set deleted before it is rewritten.
        if (before !== undefined) tx.flushes.push(["flush", { kind: "chain", name: chain }]);
        this.writeChain(tx, chain, r!.chains.get(chain)!);
        if (this.staleChains.has(chain)) revived.push(chain);
      }
      for (const chain of old?.chains.keys() ?? []) {
        if (neu?.chains.has(chain)) continue;
        this.staleFlush(tx, chain);
        stale.push(chain);
      }
      // Affinity sets.
      for (const set of old?.affinitySets ?? []) {
        if (recreateSets || !neu?.affinitySets.has(set)) this.deleteSet(tx, set);
      }
      for (const set of neu?.affinitySets ?? []) {
        if (recreateSets || !old?.affinitySets.has(set)) {
          this.addSet(tx, set, neu!.affinityTimeout);
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
      updates.set(name, neu);
    };

    for (const [name, st] of snapshot.servicePorts) {
      const old = this.written.get(name);
      if (old !== undefined && !changed.has(st.info.serviceKey)) continue;
      diffPort(name, old, this.render(name, snapshot));
    }
    for (const [name, old] of this.written) {
      if (!snapshot.servicePorts.has(name)) diffPort(name, old, null);
    }

    // Elements: the first remaining owner's value wins; a key nobody owns any more is deleted.
    const owners = this.elementOwners;
    const newOwners = new Map<string, Map<string, string>>();
    const ownersOf = (ckey: string) => {
      let m = newOwners.get(ckey);
      if (m === undefined) newOwners.set(ckey, m = new Map(owners.get(ckey) ?? []));
      return m;
    };
    for (const [ckey, port, value] of ownerChanges) {
      const m = ownersOf(ckey);
      if (value === null) m.delete(port);
      else m.set(port, value);
    }
    const kernelChanges = new Map<string, string | null>();
    for (const ckey of touched) {
      const m = newOwners.get(ckey)!;
      const want = m.size > 0 ? m.values().next().value! : null;
      const have = this.kernelElements.get(ckey) ?? null;
      if (want === have) continue;
      if (have !== null) this.deleteElement(tx, ckey);
      if (want !== null) this.addElement(tx, ckey, want);
      kernelChanges.set(ckey, want);
    }

    return {
      commit: () => {
        for (const [name, w] of updates) {
          if (w === null) {
            this.written.delete(name);
            this.renders.delete(name);
          } else this.written.set(name, w);
        }
        for (const [ckey, m] of newOwners) {
          if (m.size === 0) owners.delete(ckey);
          else owners.set(ckey, m);
        }
        for (const [ckey, v] of kernelChanges) {
          if (v === null) this.kernelElements.delete(ckey);
          else this.kernelElements.set(ckey, v);
        }
        const now = this.now();
        for (const c of revived) this.staleChains.delete(c);
        for (const c of stale) this.staleChains.set(c, now);
      },
    };
  }
}

function addOwner(owners: Map<string, Map<string, string>>, ckey: string, port: string, value: string): void {
  let m = owners.get(ckey);
  if (m === undefined) owners.set(ckey, m = new Map());
  m.set(port, value);
}
