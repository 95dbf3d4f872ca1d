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
import { chainNames, isServiceChainName, type PortChains, removedChainNames } from "./chain_names.ts";
import { CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED, NfacctCounters } from "./nfacct.ts";
import { hasJump, missingJumpLines, SavedTableReader } from "../iptables_jumps.ts";
import { ChunkWriter, collectChunks, DEFAULT_CHUNK_BYTES, extractLines, SectionCache } from "../payload.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import { type LocalTrafficDetector, noOpLocalDetector } from "./local_detector.ts";
import {
  familyNodeIP,
  newNodePortAddresses,
  type NodePortAddresses,
  nodePortIPs,
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
  renderChainRules,
  type RenderConfig,
  renderServicePort,
  type ServicePortBlock,
} from "./rules.ts";

/**
 * Service ports above which a full sync on the nft backend is slow enough to warn about (about 1,000 Services
 * took 10 s of wall time there, 2,000 over a minute; docs/benchmarks.md, "iptables on the nft backend").
 */
export const NFT_BACKEND_SERVICE_PORTS_WARNING = 1000;

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
  /** Bytes per chunk streamed to iptables-restore's stdin (default 256 KiB). */
  chunkBytes?: number;
  logger?: Logger;
  /**
   * The node's nfacct counters (default: through the `nfacct` program with `runner`); null to write rules
   * without counters, as upstream does where nfacct is unavailable.
   */
  nfacct?: NfacctCounters | null;
}

const decoder = new TextDecoder();

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
  /** The payload as handed to iptables-restore (rendered again from the sync's plan on first use). */
  readonly bytes: Uint8Array;
  /** The payload as text. */
  readonly text: string;
  readonly full: boolean;
  /** Chains deleted by this payload. */
  readonly deleted: readonly string[];
}

/** A payload re-rendered on demand from its plan (the same bytes as were streamed). */
class Payload implements BuiltPayload {
  #bytes: Uint8Array | null = null;
  #text: string | null = null;
  constructor(private readonly plan: Plan, private readonly render: (p: Plan) => Iterable<Uint8Array>) {}

  get full(): boolean {
    return this.plan.full;
  }

  get deleted(): readonly string[] {
    return this.plan.deleted;
  }

  get bytes(): Uint8Array {
    return this.#bytes ??= collectChunks(this.render(this.plan));
  }

  get text(): string {
    return this.#text ??= decoder.decode(this.bytes);
  }
}

/** Sums the time spent producing each chunk (the generation share of a streamed sync). */
function* timed(gen: Iterator<Uint8Array>, acc: { ms: number }): Generator<Uint8Array, void, undefined> {
  for (;;) {
    const t = performance.now();
    const r = gen.next();
    acc.ms += performance.now() - t;
    if (r.done) return;
    yield r.value;
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
  private readonly dispatchSection = new SectionCache();
  /** True while a sync streams its payload (blocks and sections must not change meanwhile). */
  private streaming = false;
  /** Bytes per chunk handed to iptables-restore. */
  private readonly chunkBytes: number;
  /** Chains of each port as last successfully written. */
  private applied = new Map<string, PortChains>();
  private needFull = true;
  private largeCluster = false;
  /** The nft backend's scale warning was logged (once per dataplane). */
  private warnedNftBackendScale = false;
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
    this.chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
  }

  /** v1.37 (#138571): in large-cluster mode (> 1000 endpoints at the last sync) no hourly full resync. */
  skipsPeriodicFullSync(): boolean {
    return this.largeCluster;
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
    const ips = await nodePortIPs(this.npa!, this.runner, this.log, this.opts.nodeAddresses);
    this.nodePortIPs = ips;
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
      const saved = new SavedTableReader();
      await this.runner.run({
        cmd: this.tools.save,
        args: ["-t", table],
        timeoutMs: 120_000,
        stdoutLines: saved.line,
      });
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

  /**
   * On the nft backend, says once (before the first full sync that large) that iptables-nft-restore cannot load
   * a large rule set in useful time: its own name lookups grow faster than the square of the payload (7 s of
   * CPU at 1,000 Services x 10 endpoints, 51 s at 2,000; docs/benchmarks.md), for upstream alike.
   */
  private warnNftBackendScale(servicePorts: number): void {
    if (this.warnedNftBackendScale || this.tools.backend !== "nft") return;
    if (servicePorts <= NFT_BACKEND_SERVICE_PORTS_WARNING) return;
    this.warnedNftBackendScale = true;
    this.log.warn(
      "iptables on the nft backend does not scale to this many service ports: iptables-nft-restore may take " +
        "minutes to hours for a full sync; use --proxy-mode=nftables, or the legacy backend " +
        "(docs/operations.md, Resources)",
      { servicePorts, limit: NFT_BACKEND_SERVICE_PORTS_WARNING, restore: this.tools.restore },
    );
  }

  /** Applies the snapshot. Rejects on failure; the next sync is then full. */
  async sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    if (snapshot.family !== this.family) {
      throw new Error(`iptables dataplane for ${this.family} got a ${snapshot.family} snapshot`);
    }
    if (this.streaming) throw new Error("iptables dataplane: sync while another sync is streaming");
    if (!this.initialized) await this.init(snapshot);
    const largeCluster = snapshot.totalEndpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    const nodeIP = this.nodeIPOf(snapshot);
    let full = this.needFull || snapshot.changedServices === null;
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

    if (full) this.warnNftBackendScale(snapshot.servicePorts.size);

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
    } catch (err) {
      this.needFull = true;
      throw err;
    } finally {
      this.streaming = false;
    }
    const applyMs = performance.now() - tApply;
    const generateMs = genTime.ms;
    const last = new Payload(plan, (p) => this.replay(p));
    this.lastPayload = last;
    if (r.code !== 0) {
      const n = failedLine(r.stderr);
      this.log.error("Failed to execute iptables-restore", r.stderr.trim(), {
        rules: n !== null ? extractLines(last.text, n) : undefined,
      });
      iptablesRestoreFailuresTotal.inc({ ip_family: this.family });
      if (!full) iptablesPartialRestoreFailuresTotal.inc({ ip_family: this.family });
      this.needFull = true;
      throw new CommandError({ cmd: this.tools.restore, args }, r.code, r.stderr);
    }

    // Success: remember what the kernel now has.
    this.commit(plan);
    this.servicesChainHasRules = plan.servicesChainHasRules;
    this.needFull = false;
    this.everSynced = true;
    if (scan) await this.ensureKubeletJumps(scan);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "filter" }, plan.filterRules);
    iptablesRulesTotal.set({ ip_family: this.family, table: "filter" }, plan.filterRules);
    iptablesRulesLastSync.set({ ip_family: this.family, table: "nat" }, plan.natRulesWritten);
    iptablesRulesTotal.set({ ip_family: this.family, table: "nat" }, plan.natRulesTotal);
    this.log.v(2).info("SyncProxyRules complete", {
      full,
      bytes: plan.bytes,
      generateMs: Math.round(generateMs * 10) / 10,
      applyMs: Math.round(applyMs),
      deletedChains: plan.deleted.length,
    });
    return { full, payloadBytes: plan.bytes, generateMs, applyMs };
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
    if (!this.initialized) await this.init(snapshot);
    const largeCluster = snapshot.totalEndpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
    const nodeIP = this.nodeIPOf(snapshot);
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
      const text = n !== null ? new Payload(plan, (p) => this.replay(p)).text : "";
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
    const p = new Payload(plan, (q) => this.replay(q));
    Object.defineProperty(p, "bytes", { value: bytes });
    return p;
  }

  private newPlan(snapshot: ProxySnapshot, cfg: RenderConfig, full: boolean, scan: ScanResult | null): Plan {
    // Static parts (chain lines first: a rule may only jump to a declared chain).
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
    const nHead = natHeadRules(cfg, this.randomFully);
    const tail = nodePortsTailRules(cfg, this.npa!.matchAll, this.nodePortIPs);
    const countLines = (s: string) => {
      let n = 0;
      for (let i = s.indexOf("\n"); i >= 0; i = s.indexOf("\n", i + 1)) n++;
      return n;
    };
    return {
      full,
      cfg,
      changed: full ? null : snapshot.changedServices,
      scan,
      head,
      fTail: fTail + (scan ? scan.missingJumps.filter : ""),
      natHead,
      nHead,
      tail,
      jn: scan ? scan.missingJumps.nat : "",
      mangle: full ? `*mangle\n:${KUBE_PROXY_CANARY} - [0:0]\nCOMMIT\n` : "",
      staticFilter: countLines(fHead) + countLines(fTail),
      staticNat: countLines(nHead) + countLines(tail),
      order: [],
      written: [],
      deleted: [],
      appliedChanged: new Map(),
      dispatch: "",
      bytes: 0,
      filterRules: 0,
      natRulesWritten: 0,
      natRulesTotal: 0,
      servicesChainHasRules: false,
    };
  }

  /**
   * Plans and streams one payload. The first pass over the snapshot (cache look-ups, re-rendering changed
   * ports, which ports' chains to write, chains to delete by comparing with what was written last) streams the
   * filter section as it goes; then the nat table: declarations (from the blocks' chain names), the cached
   * dispatch section, and the written ports' chain rules, rendered one port at a time into the stream.
   * Per-sync work for an unchanged port is a map look-up and an identity check.
   */
  private *stream(snapshot: ProxySnapshot, p: Plan): Generator<Uint8Array, void, undefined> {
    const cfg = p.cfg;
    const changed = p.changed;
    const full = p.full;
    const largeCluster = this.largeCluster;
    const blocks = this.blocks;
    const applied = this.applied;
    const dispatchSec = this.dispatchSection;
    dispatchSec.begin();
    const w = new ChunkWriter(this.chunkBytes);
    let filterRules = 0, dispatchRules = 0;
    let appliedSeen = 0;

    yield* w.text(p.head);
    for (const [name, st] of snapshot.servicePorts) {
      let b = blocks.get(name);
      let rendered = false;
      if (b === undefined || b.state !== st) {
        if (b !== undefined && sameRenderedState(b.state, st)) b.state = st;
        else {
          const nb = renderServicePort(st, cfg, largeCluster, b);
          if (b !== undefined) {
            // Keep the old dispatch/filter views when their bytes did not change (an endpoint change), so
            // that the cached section concatenation stays valid.
            if (b.dispatch === nb.dispatch) nb.dispatch = b.dispatch;
            if (b.filter === nb.filter) nb.filter = b.filter;
          }
          b = nb;
          rendered = true;
          blocks.set(name, b);
        }
      }
      p.order.push(b);
      yield* w.text(b.filter);
      dispatchSec.push(b.dispatch);
      filterRules += b.filterRuleCount;
      dispatchRules += b.dispatchRuleCount;
      if (full || rendered || changed!.has(st.info.serviceKey)) {
        p.written.push(b);
        const old = applied.get(name);
        if (old !== undefined) appliedSeen++;
        if (old !== b.chains) {
          if (old !== undefined) removedChainNames(old, b.chains, p.deleted);
          p.appliedChanged.set(name, b.chains);
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
          p.deleted.push(...chainNames(chains));
          p.appliedChanged.set(name, null);
        }
      }
    }
    if (p.scan) {
      // Leftovers found by iptables-save (start, or after a failure): anything of ours not written now.
      const active = new Set<string>(p.deleted);
      for (const b of blocks.values()) for (const c of chainNames(b.chains)) active.add(c);
      for (const c of p.scan.chains.nat) {
        if (!active.has(c) && isServiceChainName(c)) {
          active.add(c);
          p.deleted.push(c);
        }
      }
    }
    p.dispatch = dispatchSec.text();
    yield* this.emitNat(w, p);

    let chainRulesWritten = 0, chainRulesAll = 0;
    for (const b of p.written) chainRulesWritten += b.chainRuleCount;
    for (const b of p.order) {
      if (b.chainRuleCount < 0) renderChainRules(b, cfg); // never written yet (not expected): count it
      chainRulesAll += b.chainRuleCount;
    }
    p.bytes = w.total;
    p.filterRules = p.staticFilter + filterRules;
    p.natRulesWritten = p.staticNat + dispatchRules + chainRulesWritten;
    p.natRulesTotal = p.staticNat + dispatchRules + chainRulesAll;
    p.servicesChainHasRules = dispatchRules > 0 || p.tail.includes("-A KUBE-SERVICES ");
  }

  /** Everything after the filter section: the nat table and the mangle canary. */
  private *emitNat(w: ChunkWriter, p: Plan): Generator<Uint8Array, void, undefined> {
    yield* w.text(p.fTail);
    yield* w.text(p.natHead);
    for (const b of p.written) {
      for (const c of chainNames(b.chains)) yield* w.text(`:${c} - [0:0]\n`);
    }
    for (const c of p.deleted) yield* w.text(`:${c} - [0:0]\n`);
    yield* w.text(p.nHead);
    yield* w.text(p.dispatch);
    for (const b of p.written) yield* w.text(renderChainRules(b, p.cfg));
    yield* w.text(p.tail);
    for (const c of p.deleted) yield* w.text(`-X ${c}\n`);
    yield* w.text(p.jn);
    yield* w.text("COMMIT\n");
    yield* w.text(p.mangle);
    yield* w.end();
  }

  /** The same payload again from a finished plan (error context, `lastPayload`). */
  private *replay(p: Plan): Generator<Uint8Array, void, undefined> {
    const w = new ChunkWriter(this.chunkBytes);
    yield* w.text(p.head);
    for (const b of p.order) yield* w.text(b.filter);
    yield* this.emitNat(w, p);
  }
}

/** What one payload writes, decided while it streams; enough to render the same bytes again. */
interface Plan {
  full: boolean;
  cfg: RenderConfig;
  /** Services whose ports' chains are written (null: every port's). */
  changed: ReadonlySet<string> | null;
  scan: ScanResult | null;
  /** Filter table head: declarations and static rules. */
  head: string;
  /** Static filter rules after the per-port ones, and missing jumps. */
  fTail: string;
  /** `COMMIT`, nat table head declarations. */
  natHead: string;
  /** Static nat rules (KUBE-POSTROUTING, KUBE-MARK-MASQ). */
  nHead: string;
  /** The KUBE-SERVICES → KUBE-NODEPORTS rule(s). */
  tail: string;
  /** Missing nat jumps. */
  jn: string;
  mangle: string;
  staticFilter: number;
  staticNat: number;
  /** Every port's block, in snapshot order. */
  order: ServicePortBlock[];
  /** Ports whose chains are written. */
  written: ServicePortBlock[];
  /** Chains deleted by this payload. */
  deleted: string[];
  /** Chains of each port as this payload leaves them (null: the port is gone). */
  appliedChanged: Map<string, PortChains | null>;
  /** The nat dispatch section. */
  dispatch: string;
  /** Payload size. */
  bytes: number;
  filterRules: number;
  natRulesWritten: number;
  natRulesTotal: number;
  /** nat KUBE-SERVICES holds at least one rule after this payload (dispatch or the nodeports tail). */
  servicesChainHasRules: boolean;
}
