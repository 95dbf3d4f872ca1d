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
 * @module
 */

import type { CommandRunner } from "../../exec.ts";
import { CommandError } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import { ensureSysctl, readSysctl } from "../../sysctl.ts";
import type { Dataplane, IPFamily, ProxySnapshot, SyncResult } from "../../proxy/types.ts";
import {
  iptablesPartialRestoreFailuresTotal,
  iptablesRestoreFailuresTotal,
  iptablesRulesLastSync,
  iptablesRulesTotal,
} from "../../metrics.ts";
import { type IptablesBackend, type IptablesTools, iptablesTools } from "../iptables_backend.ts";
import { isServiceChainName } from "./chain_names.ts";
import { CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED, NfacctCounters } from "./nfacct.ts";
import { hasJump, missingJumpLines, parseSavedTable } from "../iptables_jumps.ts";
import { extractLines, PayloadWriter, SectionCache } from "../payload.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import { type LocalTrafficDetector, noOpLocalDetector } from "./local_detector.ts";
import {
  familyNodeIP,
  newNodePortAddresses,
  nodeIPsMatching,
  type NodePortAddresses,
  readLocalAddresses,
} from "../../net/node_addresses.ts";
import {
  filterHeadRules,
  filterTailRules,
  JUMP_RULES,
  type JumpRule,
  KUBE_PROXY_CANARY,
  KUBELET_JUMP_RULES,
  LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
  masqueradeMark,
  natHeadRules,
  nodePortsTailRules,
  type RenderConfig,
  renderServicePort,
  sameBytes,
  type ServicePortBlock,
} from "./rules.ts";

/** Options of {@linkcode IptablesDataplane}. */
export interface IptablesDataplaneOptions {
  family: IPFamily;
  /** Spawns iptables-restore, iptables-save, sysctl and ip. */
  runner: CommandRunner;
  /** Default 14 (mark 0x00004000). */
  masqueradeBit?: number;
  /** Masquerade all ClusterIP traffic. Default false. */
  masqueradeAll?: boolean;
  /** Default: no-op (no off-cluster masquerade, no pod short-circuit rule). */
  localDetector?: LocalTrafficDetector;
  /** CIDRs and/or `primary`; empty (default) accepts NodePorts on every local address. */
  nodePortAddresses?: readonly string[];
  /** `iptables.localhostNodePorts`, default true (IPv4 only; sets route_localnet). */
  localhostNodePorts?: boolean;
  /** Default 30 000. Reserved for periodic leftover scans in large clusters. */
  syncPeriodMs?: number;
  /** Backend or explicit tool names; default `system` (plain `iptables-restore`). */
  backend?: IptablesBackend | IptablesTools;
  /** Append `--random-fully` to MASQUERADE (iptables ≥ 1.6.2). Default true. */
  randomFully?: boolean;
  /** Skip reading `net.netfilter.nf_conntrack_tcp_be_liberal` and use this value. */
  conntrackTCPBeLiberal?: boolean;
  /** Node IPs to use instead of `ip -j addr show` when nodePortAddresses do not match all (tests). */
  nodeAddresses?: readonly string[];
  /**
   * This family's node IP as upstream's detectNodeIPs picks it: a non-wildcard bindAddress of this family wins
   * over the Node object's IPs. Used for the loadBalancerSourceRanges self-allow (`-s <lbIP>` in KUBE-FW when a
   * source range contains the node IP). When unset (or of the other family), `snapshot.node.ips[0]` is used.
   */
  nodeIP?: string;
  logger?: Logger;
  /**
   * The node's nfacct counters (default: through the `nfacct` program with `runner`); null to write rules
   * without counters, as upstream does where nfacct is unavailable.
   */
  nfacct?: NfacctCounters | null;
}

const decoder = new TextDecoder();

/** Chains of `old` missing from `now` (a set only for long lists). */
function removedChains(old: readonly string[], now: readonly string[], out: string[]): void {
  if (now.length > 16) {
    const keep = new Set(now);
    for (const c of old) if (!keep.has(c)) out.push(c);
  } else {
    for (const c of old) if (!now.includes(c)) out.push(c);
  }
}

/** Parses iptables-restore's "line N failed" / "line N: ..." error. */
export function failedLine(stderr: string): number | null {
  const m = stderr.match(/line (\d+)/);
  return m ? Number(m[1]) : null;
}

/** What an `iptables-save` scan found. */
interface ScanResult {
  chains: { filter: Set<string>; nat: Set<string> };
  missingJumps: { filter: string; nat: string };
  /**
   * kubelet's KUBE-FIREWALL jumps missing while the payload does not own KUBE-FIREWALL (no localhost NodePorts):
   * ensured with plain iptables calls after the restore, as upstream's EnsureChain/EnsureRule do.
   */
  missingKubeletJumps: JumpRule[];
}

/** The payload of one sync, kept for tests and error messages. */
export interface BuiltPayload {
  /** The payload as handed to iptables-restore (a view of a reused buffer: valid until the next build). */
  readonly bytes: Uint8Array;
  /** The payload as text (decoded on first use, which must come before the next build). */
  readonly text: string;
  readonly full: boolean;
  /** Chains deleted by this payload. */
  readonly deleted: readonly string[];
}

class Payload implements BuiltPayload {
  #text: string | null = null;
  constructor(
    readonly bytes: Uint8Array,
    readonly full: boolean,
    readonly deleted: readonly string[],
    private readonly writer: PayloadWriter,
    private readonly generation: number,
  ) {}

  get text(): string {
    if (this.#text === null) {
      if (this.writer.overwrote(this.bytes.buffer, this.generation)) {
        throw new Error("payload buffer was reused by a later build; read .text before building again");
      }
      this.#text = decoder.decode(this.bytes);
    }
    return this.#text;
  }
}

/** iptables dataplane for one IP family. */
export class IptablesDataplane implements Dataplane {
  readonly family: IPFamily;
  readonly tools: IptablesTools;
  private readonly runner: CommandRunner;
  private readonly log: Logger;
  private readonly opts: IptablesDataplaneOptions;
  private readonly npaEntries: readonly string[];
  private readonly randomFully: boolean;
  private readonly nfacct: NfacctCounters | null;

  private cfg: RenderConfig | null = null;
  private npa: NodePortAddresses | null = null;
  private conntrackLiberal = false;
  private initialized = false;

  /** Rendered blocks by `nameString`. */
  private readonly blocks = new Map<string, ServicePortBlock>();
  private readonly filterSection = new SectionCache();
  private readonly dispatchSection = new SectionCache();
  private readonly writer = new PayloadWriter();
  /** True while iptables-restore may still be reading the writer's buffer. */
  private applying = false;
  /** Chains of each port as last successfully written. */
  private applied = new Map<string, readonly string[]>();
  private needFull = true;
  private largeCluster = false;
  /** The last restore left rules in nat KUBE-SERVICES (checked by needsFullSync in small clusters). */
  private servicesChainHasRules = false;
  private nodePortIPs: string[] = [];
  private everSynced = false;
  /** The last payload (tests, debugging). */
  lastPayload: BuiltPayload | null = null;

  constructor(opts: IptablesDataplaneOptions) {
    this.opts = opts;
    this.family = opts.family;
    this.runner = opts.runner;
    this.log = (opts.logger ?? rootLog).with({ ipFamily: opts.family });
    const be = opts.backend ?? "system";
    this.tools = typeof be === "string" ? iptablesTools(be, opts.family) : be;
    this.npaEntries = opts.nodePortAddresses ?? [];
    this.randomFully = opts.randomFully ?? true;
    this.nfacct = opts.nfacct === undefined ? new NfacctCounters(this.runner, this.log) : opts.nfacct;
  }

  /** Checks the mangle canary chain (cheap: mangle is small); true when it is gone and a full sync is due. */
  async needsFullSync(): Promise<boolean> {
    if (!this.everSynced) return false;
    if (this.needFull) return true;
    const r = await this.runner.tryRun({
      cmd: this.tools.iptables,
      args: ["-w", "5", "-t", "mangle", "-S", KUBE_PROXY_CANARY],
      timeoutMs: 15_000,
    });
    if (r.code !== 0) {
      this.log.info("iptables canary chain is gone (flushed externally?); next sync is full", {
        stderr: r.stderr.trim(),
      });
      this.needFull = true;
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
    this.needFull = true;
    return true;
  }

  /** First-sync setup: sysctls and settings that need the node's IPs. */
  private async init(snapshot: ProxySnapshot): Promise<void> {
    const o = this.opts;
    this.npa = newNodePortAddresses(this.family, this.npaEntries, snapshot.node.ips);
    const localhostNodePorts = (o.localhostNodePorts ?? true) && this.family === "IPv4" &&
      this.npa.containsIPv4Loopback;
    if (localhostNodePorts) {
      // Upstream logs and goes on: localhost NodePorts then do not work, everything else does.
      await ensureSysctl(this.runner, "net.ipv4.conf.all.route_localnet", 1, this.log);
    }
    if (o.conntrackTCPBeLiberal !== undefined) {
      this.conntrackLiberal = o.conntrackTCPBeLiberal;
    } else {
      this.conntrackLiberal =
        (await readSysctl(this.runner, "net.netfilter.nf_conntrack_tcp_be_liberal")) === "1";
      if (this.conntrackLiberal) {
        this.log.info("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets");
      }
    }
    this.cfg = {
      family: this.family,
      mark: masqueradeMark(o.masqueradeBit ?? 14),
      masqueradeAll: o.masqueradeAll ?? false,
      localDetector: o.localDetector ?? noOpLocalDetector,
      localhostNodePorts,
      nodeIP: this.nodeIPOf(snapshot),
      nfacctInvalidDrop: false,
      nfacctLocalhostNodePorts: false,
    };
    this.initialized = true;
  }

  /**
   * Ensures the nfacct counters, as upstream does on every full sync; returns the settings with what is usable
   * now (the same object when nothing changed).
   */
  private async ensureCounters(cfg: RenderConfig): Promise<RenderConfig> {
    const nfacct = this.nfacct;
    const invalid = nfacct !== null && !this.conntrackLiberal &&
      await nfacct.ensure(CT_STATE_INVALID_DROPPED);
    const localhost = nfacct !== null && cfg.localhostNodePorts &&
      await nfacct.ensure(LOCALHOST_NODEPORTS_ACCEPTED);
    if (invalid === cfg.nfacctInvalidDrop && localhost === cfg.nfacctLocalhostNodePorts) return cfg;
    return { ...cfg, nfacctInvalidDrop: invalid, nfacctLocalhostNodePorts: localhost };
  }

  /** The node IP for the source-range self-allow: the `nodeIP` option (bindAddress) wins over the Node's IPs. */
  private nodeIPOf(snapshot: ProxySnapshot): string | null {
    return familyNodeIP(this.family, this.opts.nodeIP, snapshot.node.ips);
  }

  /** Reads the node's addresses matching CIDR nodePortAddresses (nothing runs when they match all). */
  private async readNodePortIPs(): Promise<void> {
    const npa = this.npa!;
    if (npa.matchAll) {
      this.nodePortIPs = [];
      return;
    }
    let addrs = this.opts.nodeAddresses;
    if (!addrs) {
      try {
        addrs = await readLocalAddresses(this.runner, this.family);
      } catch (err) {
        this.log.error(
          "Failed to get node ip address matching nodeport cidrs, services with nodeport may not work as intended",
          err,
          { CIDRs: npa.cidrs },
        );
        addrs = [];
      }
    }
    this.nodePortIPs = nodeIPsMatching(npa, addrs);
  }

  /** One iptables-save per table: existing chains (leftovers) and which jump rules are missing. */
  private async scan(): Promise<ScanResult> {
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
    const ownsKubeletChain = this.cfg!.localhostNodePorts;
    const jumps = [...JUMP_RULES, ...(ownsKubeletChain ? KUBELET_JUMP_RULES : [])];
    for (const table of ["filter", "nat"] as const) {
      const r = await this.runner.run({ cmd: this.tools.save, args: ["-t", table], timeoutMs: 120_000 });
      const saved = parseSavedTable(r.stdout);
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
   * the next sync is made full, which retries.
   */
  private async ensureKubeletJumps(scan: ScanResult): Promise<void> {
    const missing = scan.missingKubeletJumps;
    if (missing.length === 0) return;
    const chain = missing[0].to;
    const calls: string[][] = [];
    if (!scan.chains.filter.has(chain)) calls.push(["-w", "5", "-t", "filter", "-N", chain]);
    for (const j of missing) calls.push(["-w", "5", "-t", "filter", "-I", j.from, "1", "-j", j.to]);
    for (const args of calls) {
      const r = await this.runner.tryRun({ cmd: this.tools.iptables, args, timeoutMs: 15_000 });
      // "-N" of a chain kubelet created meanwhile fails with "Chain already exists": that is fine.
      if (r.code !== 0 && !(args.includes("-N") && /already exists/i.test(r.stderr))) {
        this.log.error("Failed to ensure chain jumps", r.stderr.trim(), {
          table: "filter",
          args: args.join(" "),
        });
        this.needFull = true;
        return;
      }
    }
  }

  /** Applies the snapshot. Rejects on failure; the next sync is then full. */
  async sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    if (snapshot.family !== this.family) {
      throw new Error(`iptables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    if (!this.initialized) await this.init(snapshot);
    const largeCluster = snapshot.totalEndpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    const nodeIP = this.nodeIPOf(snapshot);
    let full = this.needFull || snapshot.changedServices === null;
    const cfg0 = full ? await this.ensureCounters(this.cfg!) : this.cfg!;
    if (largeCluster !== this.largeCluster || nodeIP !== cfg0.nodeIP || cfg0 !== this.cfg) {
      // Every block renders differently now: drop the cache and write everything.
      this.blocks.clear();
      this.filterSection.clear();
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
    this.lastPayload = null; // let the previous payload buffer go before building the next one
    const tGen = performance.now();
    const built = this.build(snapshot, cfg, full, scan);
    const payload = built.bytes;
    const generateMs = performance.now() - tGen;

    const tApply = performance.now();
    this.applying = true;
    let r;
    try {
      r = await this.runner.tryRun({
        cmd: this.tools.restore,
        args: ["--noflush", "--counters", "-w", "5", "-W", "100000"],
        stdin: payload,
        captureStdout: false,
        timeoutMs: 600_000,
      });
    } finally {
      this.applying = false;
    }
    const applyMs = performance.now() - tApply;
    const last = new Payload(built.bytes, full, built.deleted, this.writer, built.generation);
    this.lastPayload = last;
    if (r.code !== 0) {
      const n = failedLine(r.stderr);
      this.log.error("Failed to execute iptables-restore", r.stderr.trim(), {
        rules: n !== null ? extractLines(last.text, n) : undefined,
      });
      iptablesRestoreFailuresTotal.inc({ ip_family: this.family });
      if (!full) iptablesPartialRestoreFailuresTotal.inc({ ip_family: this.family });
      this.needFull = true;
      throw new CommandError(
        { cmd: this.tools.restore, args: ["--noflush", "--counters", "-w", "5", "-W", "100000"] },
        r.code,
        r.stderr,
      );
    }

    // Success: remember what the kernel now has.
    this.commit(built);
    this.servicesChainHasRules = built.servicesChainHasRules;
    this.needFull = false;
    this.everSynced = true;
    if (scan) await this.ensureKubeletJumps(scan);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "filter" }, built.filterRules);
    iptablesRulesTotal.set({ ip_family: this.family, table: "filter" }, built.filterRules);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "nat" }, built.natRulesWritten);
    iptablesRulesTotal.set({ ip_family: this.family, table: "nat" }, built.natRulesTotal);
    this.log.v(2).info("SyncProxyRules complete", {
      full,
      bytes: payload.byteLength,
      generateMs: Math.round(generateMs * 10) / 10,
      applyMs: Math.round(applyMs),
      deletedChains: built.deleted.length,
    });
    return { full, payloadBytes: payload.byteLength, generateMs, applyMs };
  }

  private commit(built: Built): void {
    for (const [name, chains] of built.appliedChanged) {
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
    const b = this.build(snapshot, this.cfg, full, null);
    return new Payload(b.bytes, full, b.deleted, this.writer, b.generation);
  }

  /**
   * One pass over the snapshot (cache look-ups, counters, which ports' chains to write, chains to delete by
   * comparing with what was written last), then the payload is assembled by copying cached bytes. Per-sync
   * work for an unchanged port is a map look-up and an identity check; nothing is re-rendered, re-hashed or
   * re-encoded, and the filter and dispatch sections are copied as one cached concatenation each.
   */
  private build(snapshot: ProxySnapshot, cfg: RenderConfig, full: boolean, scan: ScanResult | null): Built {
    const changed = full ? null : snapshot.changedServices;
    const largeCluster = this.largeCluster;
    const blocks = this.blocks;
    const applied = this.applied;
    const filterSec = this.filterSection, dispatchSec = this.dispatchSection;
    filterSec.begin();
    dispatchSec.begin();
    const written: ServicePortBlock[] = [];
    let chainBytes = 0;
    let filterRules = 0, dispatchRules = 0, chainRulesAll = 0, chainRulesWritten = 0;
    const appliedChanged = new Map<string, readonly string[] | null>();
    const deleted: string[] = [];
    let appliedSeen = 0;

    for (const [name, st] of snapshot.servicePorts) {
      let b = blocks.get(name);
      let rendered = false;
      if (b === undefined || b.state !== st) {
        if (b !== undefined && sameRenderedState(b.state, st)) b.state = st;
        else {
          const nb = renderServicePort(st, cfg, largeCluster, b);
          if (b !== undefined) {
            // Keep the old dispatch/filter views when their bytes did not change (an endpoint change), so
            // that the cached section concatenations stay valid.
            if (sameBytes(b.dispatch, nb.dispatch)) nb.dispatch = b.dispatch;
            if (sameBytes(b.filter, nb.filter)) nb.filter = b.filter;
          }
          b = nb;
          rendered = true;
          blocks.set(name, b);
        }
      }
      filterSec.push(b.filter);
      dispatchSec.push(b.dispatch);
      filterRules += b.filterRuleCount;
      dispatchRules += b.dispatchRuleCount;
      chainRulesAll += b.chainRuleCount;
      if (full || rendered || changed!.has(st.info.serviceKey)) {
        written.push(b);
        chainBytes += b.chainLines.length + b.chainRules.length;
        chainRulesWritten += b.chainRuleCount;
        const old = applied.get(name);
        if (old !== undefined) appliedSeen++;
        if (old !== b.chains) {
          if (old !== undefined) removedChains(old, b.chains, deleted);
          appliedChanged.set(name, b.chains);
        }
      }
    }
    // Ports that disappeared (blocks hold every snapshot port, so extra blocks mean removals; on a full sync
    // every written port was looked up in `applied`, so a count mismatch means removals too).
    const n = snapshot.servicePorts.size;
    if (blocks.size > n || applied.size > n || (full && appliedSeen !== applied.size)) {
      for (const name of [...blocks.keys()]) {
        if (!snapshot.servicePorts.has(name)) blocks.delete(name);
      }
      for (const [name, chains] of applied) {
        if (!snapshot.servicePorts.has(name)) {
          deleted.push(...chains);
          appliedChanged.set(name, null);
        }
      }
    }
    if (scan) {
      // Leftovers found by iptables-save (start, or after a failure): anything of ours not written now.
      const active = new Set<string>(deleted);
      for (const b of blocks.values()) for (const c of b.chains) active.add(c);
      for (const c of scan.chains.nat) {
        if (!active.has(c) && isServiceChainName(c)) {
          active.add(c);
          deleted.push(c);
        }
      }
    }

    // Assemble. Chain lines first (a rule may only jump to a declared chain), then rules.
    let head = "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n" +
      ":KUBE-NODEPORTS - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n";
    const fHead = filterHeadRules(cfg);
    if (fHead) head += ":KUBE-FIREWALL - [0:0]\n";
    if (full) head += `:${KUBE_PROXY_CANARY} - [0:0]\n`;
    head += fHead;
    const fTail = filterTailRules(cfg, this.conntrackLiberal);
    let natHead =
      "COMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n" +
      ":KUBE-MARK-MASQ - [0:0]\n";
    if (full) natHead += `:${KUBE_PROXY_CANARY} - [0:0]\n`;
    let decl = "", del = "";
    for (const c of deleted) {
      decl += `:${c} - [0:0]\n`;
      del += `-X ${c}\n`;
    }
    const nHead = natHeadRules(cfg, this.randomFully);
    const tail = nodePortsTailRules(cfg, this.npa!.matchAll, this.nodePortIPs);
    const mangle = full ? `*mangle\n:${KUBE_PROXY_CANARY} - [0:0]\nCOMMIT\n` : "";
    const jf = scan ? scan.missingJumps.filter : "", jn = scan ? scan.missingJumps.nat : "";
    // Static text is ASCII: string length = byte length, so the buffer is sized exactly up front.
    const w = this.writer;
    w.reset(
      head.length + filterSec.size + fTail.length + jf.length + natHead.length + chainBytes + decl.length +
        nHead.length + dispatchSec.size + tail.length + del.length + jn.length + 7 + mangle.length,
      this.applying,
    );
    w.text(head);
    filterSec.writeTo(w);
    w.text(fTail);
    w.text(jf);
    w.text(natHead);
    for (const b of written) w.bytes(b.chainLines);
    w.text(decl);
    w.text(nHead);
    dispatchSec.writeTo(w);
    for (const b of written) w.bytes(b.chainRules);
    w.text(tail);
    w.text(del);
    w.text(jn);
    w.text("COMMIT\n");
    w.text(mangle);

    const countLines = (s: string) => {
      let n = 0;
      for (let i = s.indexOf("\n"); i >= 0; i = s.indexOf("\n", i + 1)) n++;
      return n;
    };
    const staticFilter = countLines(fHead) + countLines(fTail);
    const staticNat = countLines(nHead) + countLines(tail);
    return {
      bytes: w.result(),
      generation: w.generation,
      full,
      deleted,
      appliedChanged,
      filterRules: staticFilter + filterRules,
      natRulesWritten: staticNat + dispatchRules + chainRulesWritten,
      natRulesTotal: staticNat + dispatchRules + chainRulesAll,
      servicesChainHasRules: dispatchRules > 0 || tail.includes("-A KUBE-SERVICES "),
    };
  }
}

interface Built {
  bytes: Uint8Array;
  generation: number;
  full: boolean;
  deleted: string[];
  appliedChanged: Map<string, readonly string[] | null>;
  filterRules: number;
  natRulesWritten: number;
  natRulesTotal: number;
  /** nat KUBE-SERVICES holds at least one rule after this payload (dispatch or the nodeports tail). */
  servicesChainHasRules: boolean;
}
