/**
 * The ipvs dataplane of one IP family: IPVS virtual servers (`ipvsadm -R`), the mode's ipsets
 * (`ipset restore`), the service addresses on kube-ipvs0 (`ip -force -batch -`) and the iptables rules matching
 * the sets (`iptables-restore --noflush`), as upstream's ipvs proxier programs them, but incrementally.
 *
 * - What was programmed is kept in memory (the kernel model). A partial sync re-renders only the changed
 *   Services' ports and writes only the differences: one ipvsadm batch, one ipset batch, one ip batch, and the
 *   iptables payload only when its text changed (it depends only on which sets have members).
 * - A full sync (start, after a failure, at the proxier's full-sync period, or when needsFullSync() saw the
 *   kernel changed behind our back) reads the kernel once (`ipvsadm -S -n`, `ipset save`, `ip -j addr show`,
 *   `iptables-save` of nat and filter for the jump rules), replaces the model with it and writes whatever
 *   differs: stale virtual servers, members and addresses go, missing ones come back.
 * - Graceful termination (upstream's GracefulTerminationManager): a TCP real server that is no longer wanted
 *   gets weight 0 and is deleted once `ipvsadm -L -n` shows it without connections (checked right after the
 *   sync and then every `drainCheckIntervalMs`, only for the virtual servers being drained); UDP and SCTP real
 *   servers are deleted at once. A drained real server that is wanted again gets its weight back.
 * @module
 */
import { CommandError, type CommandRunner } from "../../exec.ts";
import { log as rootLog, type Logger } from "../../log.ts";
import { iptablesRestoreFailuresTotal } from "../../metrics.ts";
import { cidrContains, familyOf, type IPFamily } from "../../net/ip.ts";
import { familyNodeIP, newNodePortAddresses, type NodePortAddresses } from "../../net/node_addresses.ts";
import { type Clock, realClock, type TimerId } from "../../proxy/clock.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import type { Dataplane, ProxySnapshot, SyncResult } from "../../proxy/types.ts";
import type { IptablesTools } from "../iptables_backend.ts";
import { missingJumpLines, parseSavedTable } from "../iptables_jumps.ts";
import { masqueradeMark } from "../masquerade.ts";
import { type LocalTrafficDetector, noOpLocalDetector } from "../iptables_local_detector.ts";
import { extractLines } from "../payload.ts";
import { DUMMY_INTERFACE, parseLocalAddresses } from "./addresses.ts";
import { createLine, parseIpsetSave, SET_DEFS, type SetKey, setName } from "./ipsets.ts";
import { IPVS_JUMP_RULES, renderIpvsIptables } from "./iptables_rules.ts";
import {
  deleteRealServerLine,
  deleteServiceLine,
  keyAddress,
  keyProtocol,
  parseIpvsadmList,
  parseIpvsadmSave,
  realServerLine,
  sameDef,
  serviceLine,
  type VirtualServerDef,
} from "./ipvsadm.ts";
import { type PortRendering, type RenderContext, renderPort, type WantedVirtualServer } from "./render.ts";

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

const IPVSADM_TIMEOUT = 300_000;

/**
 * A virtual server of the kernel model. `reals` is the wanted rendering's own (sorted, never mutated) array when
 * the kernel has exactly those real servers, all with weight 1, the usual case, which then costs no Map per
 * virtual server; otherwise a Map of real server → weight.
 */
interface ModelVirtualServer {
  def: VirtualServerDef;
  reals: readonly string[] | Map<string, number>;
}

/** The weights of a model virtual server's real servers as a Map (made from the shared array form). */
function realsMap(k: ModelVirtualServer): Map<string, number> {
  if (k.reals instanceof Map) return k.reals;
  const m = new Map<string, number>();
  for (const rs of k.reals) m.set(rs, 1);
  k.reals = m;
  return m;
}

/** ipvs dataplane for one IP family. */
export class IpvsDataplane implements Dataplane {
  readonly family: IPFamily;
  private readonly runner: CommandRunner;
  private readonly opts: IpvsDataplaneOptions;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly exclude: readonly string[];
  private npa: NodePortAddresses | null = null;

  // What is wanted (rendered ports and reference counts).
  private readonly ports = new Map<string, PortRendering>();
  /** Service port names by Service (a plain string for the usual single port). */
  private readonly byService = new Map<string, string | string[]>();
  /**
   * Wanted virtual servers by key, each with the names of the service ports that want it (in the order they
   * claimed it; a plain string for the usual single claim): two Services may name the same address and port
   * (an externalIP listed twice); the last claim is programmed, and when it goes the previous one is, as long
   * as one remains. The claim's virtual server is read from the port's rendering.
   */
  private readonly wantedVS = new Map<string, string | string[]>();
  private readonly wantedSets = new Map<SetKey, Map<string, number>>();
  private readonly wantedAddrs = new Map<string, number>();
  private readonly outFilters = new Map<string, string>();
  private ctx: RenderContext | null = null;

  // What the kernel has (as far as we know).
  private kernelVS = new Map<string, ModelVirtualServer>();
  private kernelSets = new Map<SetKey, Set<string>>();
  private kernelAddrs = new Set<string>();
  private dummyExists = false;
  private lastIptables: string | null = null;
  /** Real servers with weight 0 waiting for their connections to end, by virtual server. */
  private readonly draining = new Map<string, Set<string>>();
  private drainTimer: TimerId | null = null;
  private nodeAddresses: string[] = [];

  private needFull = true;
  private everSynced = false;
  private lock: Promise<unknown> = Promise.resolve();
  /** The batches of the last sync, kept only with the `keepLastBatches` option (tests, benches). */
  lastBatches: IpvsBatches | null = null;

  constructor(opts: IpvsDataplaneOptions) {
    this.opts = opts;
    this.family = opts.family;
    this.runner = opts.runner;
    this.clock = opts.clock ?? realClock;
    this.log = (opts.logger ?? rootLog).with({ ipFamily: opts.family });
    this.exclude = (opts.excludeCIDRs ?? []).filter((c) => familyOf(c) === opts.family);
    for (const d of SET_DEFS) {
      this.wantedSets.set(d.key, new Map());
      this.kernelSets.set(d.key, new Set());
    }
  }

  /** Serializes kernel writes (syncs and drain checks). */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.lock.then(fn, fn);
    this.lock = p.catch(() => undefined);
    return p;
  }

  /** Real servers being drained, as `key -r rs` strings (tests, debugging). */
  drainingRealServers(): string[] {
    const out: string[] = [];
    for (const [k, s] of this.draining) for (const rs of s) out.push(`${k} -r ${rs}`);
    return out;
  }

  /** Stops the drain timer (the agent is stopping). */
  stop(): void {
    if (this.drainTimer !== null) this.clock.clearTimeout(this.drainTimer);
    this.drainTimer = null;
  }

  /**
   * Cheap checks for changes behind our back, polled every syncPeriod: node addresses (NodePort virtual servers
   * follow them), addresses on kube-ipvs0, one virtual server we programmed, the member count of
   * KUBE-CLUSTER-IP. True when the next sync must be full.
   */
  async needsFullSync(): Promise<boolean> {
    if (!this.everSynced) return false;
    if (this.needFull) return true;
    const why = await this.exclusive(() => this.driftReason());
    if (why === null) return false;
    this.log.info("ipvs state changed behind our back; next sync is full", { reason: why });
    this.needFull = true;
    return true;
  }

  private async driftReason(): Promise<string | null> {
    const a = await this.runner.tryRun({ cmd: "ip", args: ["-j", "addr", "show"], timeoutMs: 30_000 });
    if (a.code !== 0) return `ip addr show failed: ${a.stderr.trim()}`;
    const addrs = parseLocalAddresses(a.stdout, this.family);
    if (!addrs.dummyExists) return `${DUMMY_INTERFACE} is gone`;
    if (addrs.others.join(",") !== this.nodeAddresses.join(",")) return "node addresses changed";
    if (
      addrs.dummy.size !== this.kernelAddrs.size || [...addrs.dummy].some((x) => !this.kernelAddrs.has(x))
    ) {
      return `addresses on ${DUMMY_INTERFACE} changed`;
    }
    const first = this.kernelVS.keys().next();
    if (!first.done) {
      const r = await this.runner.tryRun({
        cmd: "ipvsadm",
        args: ["-L", "-n", ...first.value.split(" ")],
        timeoutMs: 30_000,
      });
      if (r.code !== 0) return `virtual server ${first.value} is gone`;
    }
    // Beyond upstream (whose every periodic sync is full): a firewall reload or `iptables -t nat -F
    // KUBE-SERVICES` shows as a rule count unlike the one written (the chain is a few rules in this mode).
    if (this.lastIptables !== null) {
      const want = countRules(this.lastIptables, "KUBE-SERVICES");
      const r = await this.runner.tryRun({
        cmd: this.opts.iptables.iptables,
        args: ["-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"],
        timeoutMs: 30_000,
      });
      if (r.code !== 0) return `nat KUBE-SERVICES is gone: ${r.stderr.trim()}`;
      const have = countRules(r.stdout, "KUBE-SERVICES");
      if (have !== want) return `nat KUBE-SERVICES has ${have} rules, ${want} written`;
    }
    const set = setName("KUBE-CLUSTER-IP", this.family);
    const s = await this.runner.tryRun({ cmd: "ipset", args: ["list", "-t", set], timeoutMs: 30_000 });
    const m = s.stdout.match(/Number of entries: (\d+)/);
    if (s.code !== 0 || !m) return `ipset ${set} is gone`;
    if (Number(m[1]) !== this.kernelSets.get("KUBE-CLUSTER-IP")!.size) return `ipset ${set} changed`;
    return null;
  }

  /** Applies the snapshot. Rejects on failure; the next sync is then full. */
  sync(snapshot: ProxySnapshot): Promise<SyncResult> {
    if (snapshot.family !== this.family) {
      return Promise.reject(new Error(`ipvs dataplane for ${this.family} got a ${snapshot.family} snapshot`));
    }
    return this.exclusive(() => this.syncLocked(snapshot));
  }

  private async syncLocked(snapshot: ProxySnapshot): Promise<SyncResult> {
    const full = this.needFull || snapshot.changedServices === null || !this.everSynced;
    // Until this sync succeeds, the next one must be full.
    this.needFull = true;
    let jumps = { nat: "", filter: "" };
    if (full) jumps = await this.readKernel();
    const tGen = performance.now();
    const ctx = this.renderContext(snapshot);
    const ctxChanged = this.ctx === null || !sameContext(this.ctx, ctx);
    if (ctxChanged) this.ctx = ctx;

    // Re-render what changed; record what the changes touch.
    const touchedVS: string[] = [];
    const touchedEntries: [SetKey, string][] = [];
    const touchedAddrs: string[] = [];
    const update = (name: string, next: PortRendering | null) => {
      const prev = this.ports.get(name);
      if (prev) this.unref(name, prev, touchedVS, touchedEntries, touchedAddrs);
      if (next) {
        this.ports.set(name, next);
        this.ref(name, next, touchedVS, touchedEntries, touchedAddrs);
        const key = next.state.info.serviceKey;
        if (prev?.state.info.serviceKey !== key) {
          if (prev) removeName(this.byService, prev.state.info.serviceKey, name);
          addName(this.byService, key, name);
        }
      } else {
        this.ports.delete(name);
        removeName(this.byService, prev!.state.info.serviceKey, name);
      }
    };
    const consider = (name: string) => {
      const st = snapshot.servicePorts.get(name);
      const prev = this.ports.get(name);
      if (!st) {
        if (prev) update(name, null);
        return;
      }
      if (prev && !ctxChanged && (prev.state === st || sameRenderedState(prev.state, st))) return;
      update(name, renderPort(st, this.ctx!));
    };
    if (full || ctxChanged) {
      for (const name of snapshot.servicePorts.keys()) consider(name);
      for (const name of [...this.ports.keys()]) if (!snapshot.servicePorts.has(name)) consider(name);
    } else {
      for (const svc of snapshot.changedServices!) {
        const names = this.byService.get(svc);
        if (typeof names === "string") consider(names);
        else if (names) { for (const name of [...names]) consider(name); }
      }
      for (const [name, st] of snapshot.servicePorts) {
        if (snapshot.changedServices!.has(st.info.serviceKey)) consider(name);
      }
    }

    // Batches.
    const ipvsadm = full ? this.fullVirtualServerOps(snapshot) : this.virtualServerOps(touchedVS);
    const ipset = full ? this.fullSetOps() : this.setOps(touchedEntries);
    const ip = full ? this.fullAddressOps() : this.addressOps(touchedAddrs);
    const rules = renderIpvsIptables(
      this.rulesConfig(),
      (k) => this.wantedSets.get(k)!.size > 0,
      [...this.outFilters.values()].join(""),
    );
    const iptables = full
      ? renderIpvsIptables(
        this.rulesConfig(),
        (k) => this.wantedSets.get(k)!.size > 0,
        [...this.outFilters.values()].join(""),
        jumps,
      )
      : rules !== this.lastIptables
      ? rules
      : null;
    const generateMs = performance.now() - tGen;
    // A full sync's batches are several MiB at 10k Services: not kept unless asked for.
    if (this.opts.keepLastBatches) this.lastBatches = { ipset, ipvsadm, iptables, ip };

    const tApply = performance.now();
    let bytes = 0;
    if (ipset !== "") {
      bytes += ipset.length;
      await this.apply("ipset", ["restore"], ipset, (r) => r.code !== 0);
    }
    if (ipvsadm !== "") {
      bytes += ipvsadm.length;
      // ipvsadm -R goes on after a failing line and exits with the last line's status: any error output fails.
      await this.apply("ipvsadm", ["-R"], ipvsadm, (r) => r.code !== 0 || r.stderr.trim() !== "");
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
      this.dummyExists = true;
    }
    const applyMs = performance.now() - tApply;
    this.needFull = false;
    this.everSynced = true;
    if (this.draining.size > 0 && this.drainTimer === null) this.scheduleDrainCheck(0);
    this.log.v(2).info("SyncProxyRules complete", {
      full,
      virtualServers: this.wantedVS.size,
      bytes,
      generateMs: Math.round(generateMs * 10) / 10,
      applyMs: Math.round(applyMs),
    });
    return { full, payloadBytes: bytes, generateMs, applyMs };
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
    input: string,
    failed: (r: { code: number; stderr: string }) => boolean,
  ): Promise<void> {
    const r = await this.runner.tryRun({ cmd, args, stdin: input, timeoutMs: IPVSADM_TIMEOUT });
    if (!failed(r)) return;
    const m = r.stderr.match(/line (\d+)/i);
    this.log.error(`Failed to execute ${cmd} ${args.join(" ")}`, r.stderr.trim(), {
      lines: m ? extractLines(input, Number(m[1])) : undefined,
    });
    this.needFull = true;
    throw new CommandError({ cmd, args }, r.code === 0 ? 1 : r.code, r.stderr);
  }

  private renderContext(snapshot: ProxySnapshot): RenderContext {
    const o = this.opts;
    if (this.npa === null) {
      this.npa = newNodePortAddresses(this.family, o.nodePortAddresses ?? [], snapshot.node.ips);
    }
    const npa = this.npa;
    const nodePortIPs = npa.matchAll
      ? this.nodeAddresses
      : this.nodeAddresses.filter((ip) => npa.cidrs.some((c) => cidrContains(c, ip)));
    return {
      family: this.family,
      scheduler: o.scheduler || "rr",
      nodePortIPs,
      nodeAddresses: new Set(this.nodeAddresses),
      nodeIP: familyNodeIP(this.family, o.nodeIP, snapshot.node.ips),
    };
  }

  /** Reads the kernel's state once (full syncs) and returns the missing jump rules. */
  private async readKernel(): Promise<{ nat: string; filter: string }> {
    const a = await this.runner.run({ cmd: "ip", args: ["-j", "addr", "show"], timeoutMs: 60_000 });
    const addrs = parseLocalAddresses(a.stdout, this.family);
    this.dummyExists = addrs.dummyExists;
    this.kernelAddrs = addrs.dummy;
    this.nodeAddresses = addrs.others;

    const v = await this.runner.run({ cmd: "ipvsadm", args: ["-S", "-n"], timeoutMs: IPVSADM_TIMEOUT });
    this.kernelVS = new Map<string, ModelVirtualServer>();
    for (const [key, vs] of parseIpvsadmSave(v.stdout)) {
      if (familyOf(keyAddress(key)) === this.family) this.kernelVS.set(key, vs);
    }

    const s = await this.runner.run({ cmd: "ipset", args: ["save"], timeoutMs: IPVSADM_TIMEOUT });
    const saved = parseIpsetSave(s.stdout);
    this.kernelSets = new Map();
    for (const d of SET_DEFS) {
      this.kernelSets.set(d.key, saved.get(setName(d.key, this.family))?.entries ?? new Set());
    }

    const jumps = { nat: "", filter: "" };
    for (const table of ["nat", "filter"] as const) {
      const r = await this.runner.run({
        cmd: this.opts.iptables.save,
        args: ["-t", table],
        timeoutMs: 120_000,
      });
      jumps[table] = missingJumpLines(parseSavedTable(r.stdout), table, IPVS_JUMP_RULES);
    }
    // The drain list is rebuilt from the kernel by the full sync's virtual server pass.
    this.draining.clear();
    return jumps;
  }

  // ---- wanted state bookkeeping ----

  private ref(
    name: string,
    p: PortRendering,
    vs: string[],
    entries: [SetKey, string][],
    addrs: string[],
  ): void {
    for (const w of p.vs) {
      removeName(this.wantedVS, w.key, name);
      addName(this.wantedVS, w.key, name);
      vs.push(w.key);
    }
    for (let i = 0; i < p.sets.length; i += 2) {
      const k = p.sets[i] as SetKey, e = p.sets[i + 1];
      const m = this.wantedSets.get(k)!;
      m.set(e, (m.get(e) ?? 0) + 1);
      entries.push([k, e]);
    }
    for (const ip of p.bind) {
      const n = this.wantedAddrs.get(ip) ?? 0;
      this.wantedAddrs.set(ip, n + 1);
      if (n === 0) {
        addrs.push(ip);
        const m = this.wantedSets.get("KUBE-IPVS-IPS")!;
        m.set(ip, 1);
        entries.push(["KUBE-IPVS-IPS", ip]);
      }
    }
    if (p.outFilter !== "") this.outFilters.set(name, p.outFilter);
  }

  private unref(
    name: string,
    p: PortRendering,
    vs: string[],
    entries: [SetKey, string][],
    addrs: string[],
  ): void {
    for (const w of p.vs) if (removeName(this.wantedVS, w.key, name)) vs.push(w.key);
    for (let i = 0; i < p.sets.length; i += 2) {
      const k = p.sets[i] as SetKey, e = p.sets[i + 1];
      const m = this.wantedSets.get(k)!;
      const n = (m.get(e) ?? 1) - 1;
      if (n <= 0) m.delete(e);
      else m.set(e, n);
      entries.push([k, e]);
    }
    for (const ip of p.bind) {
      const n = (this.wantedAddrs.get(ip) ?? 1) - 1;
      if (n <= 0) {
        this.wantedAddrs.delete(ip);
        this.wantedSets.get("KUBE-IPVS-IPS")!.delete(ip);
        entries.push(["KUBE-IPVS-IPS", ip]);
        addrs.push(ip);
      } else this.wantedAddrs.set(ip, n);
    }
    this.outFilters.delete(name);
  }

  // ---- virtual servers ----

  private excluded(key: string): boolean {
    if (this.exclude.length === 0) return false;
    const ip = keyAddress(key);
    return this.exclude.some((c) => cidrContains(c, ip));
  }

  /** The wanted virtual server of a key: its last claim (the claiming port's last virtual server of the key). */
  private currentVS(key: string): WantedVirtualServer | undefined {
    const names = this.wantedVS.get(key);
    if (names === undefined) return undefined;
    const vs = this.ports.get(typeof names === "string" ? names : names[names.length - 1])?.vs ?? [];
    for (let i = vs.length - 1; i >= 0; i--) if (vs[i].key === key) return vs[i];
    return undefined;
  }

  /** Lines that make one virtual server in the kernel what is wanted (the kernel model follows). */
  private diffVS(key: string): string {
    const want = this.currentVS(key);
    let k = this.kernelVS.get(key);
    let out = "";
    if (!want) {
      if (k && !this.excluded(key)) {
        out += deleteServiceLine(key);
        this.kernelVS.delete(key);
        this.draining.delete(key);
      }
      return out;
    }
    if (!k) {
      out += serviceLine("-A", key, want.def);
      k = { def: want.def, reals: new Map() };
      this.kernelVS.set(key, k);
    } else if (!sameDef(k.def, want.def)) {
      out += serviceLine("-E", key, want.def);
      k.def = want.def;
    }
    // The kernel has the wanted array's real servers, all with weight 1 (nothing of the key is draining).
    if (k.reals === want.reals) return out;
    const reals = realsMap(k);
    const drain = this.draining.get(key);
    for (const rs of want.reals) {
      const w = reals.get(rs);
      if (w === undefined) out += realServerLine("-a", key, rs, 1);
      else if (w !== 1) out += realServerLine("-e", key, rs, 1);
      else continue;
      reals.set(rs, 1);
      drain?.delete(rs);
    }
    if (reals.size > want.reals.length) {
      const keep = new Set(want.reals);
      const graceful = keyProtocol(key) === "TCP";
      for (const [rs, w] of reals) {
        if (keep.has(rs)) continue;
        if (!graceful) {
          // UDP and SCTP: no graceful termination, as upstream (expire_nodest_conn drops their flows).
          out += deleteRealServerLine(key, rs);
          reals.delete(rs);
          continue;
        }
        if (w !== 0) {
          out += realServerLine("-e", key, rs, 0);
          reals.set(rs, 0);
        }
        let d = this.draining.get(key);
        if (!d) this.draining.set(key, d = new Set());
        d.add(rs);
      }
    }
    if (drain?.size === 0) this.draining.delete(key);
    // Every wanted real server has weight 1 and nothing else is left (none draining): share the wanted array.
    if (reals.size === want.reals.length && !this.draining.has(key)) k.reals = want.reals;
    return out;
  }

  private virtualServerOps(keys: readonly string[]): string {
    let out = "";
    const seen = new Set<string>();
    for (const key of keys) {
      if (seen.has(key)) continue;
      seen.add(key);
      out += this.diffVS(key);
    }
    return out;
  }

  private fullVirtualServerOps(snapshot: ProxySnapshot): string {
    const parts: string[] = [];
    const seen = new Set<string>();
    for (const name of snapshot.servicePorts.keys()) {
      const p = this.ports.get(name);
      if (!p) continue;
      for (const w of p.vs) {
        if (seen.has(w.key)) continue;
        seen.add(w.key);
        parts.push(this.diffVS(w.key));
      }
    }
    for (const key of [...this.kernelVS.keys()]) {
      if (!seen.has(key)) parts.push(this.diffVS(key));
    }
    return parts.join("");
  }

  // ---- ipsets ----

  private setLine(k: SetKey, e: string): string {
    const want = this.wantedSets.get(k)!.has(e);
    const have = this.kernelSets.get(k)!;
    if (want === have.has(e)) return "";
    if (want) {
      have.add(e);
      return `add ${setName(k, this.family)} ${e} -exist\n`;
    }
    have.delete(e);
    return `del ${setName(k, this.family)} ${e} -exist\n`;
  }

  private setOps(entries: readonly [SetKey, string][]): string {
    let out = "";
    for (const [k, e] of entries) out += this.setLine(k, e);
    return out;
  }

  private fullSetOps(): string {
    const parts: string[] = [];
    for (const d of SET_DEFS) parts.push(createLine(d, this.family) + " -exist\n");
    for (const d of SET_DEFS) {
      const want = this.wantedSets.get(d.key)!;
      const have = this.kernelSets.get(d.key)!;
      for (const e of [...have]) if (!want.has(e)) parts.push(this.setLine(d.key, e));
      for (const e of want.keys()) if (!have.has(e)) parts.push(this.setLine(d.key, e));
    }
    return parts.join("");
  }

  // ---- kube-ipvs0 ----

  private addrLine(ip: string): string {
    const want = this.wantedAddrs.has(ip);
    if (want === this.kernelAddrs.has(ip)) return "";
    const len = this.family === "IPv6" ? 128 : 32;
    if (want) {
      this.kernelAddrs.add(ip);
      return `addr replace ${ip}/${len} dev ${DUMMY_INTERFACE}\n`;
    }
    this.kernelAddrs.delete(ip);
    return `addr del ${ip}/${len} dev ${DUMMY_INTERFACE}\n`;
  }

  private linkLine(): string {
    return this.dummyExists ? "" : `link add ${DUMMY_INTERFACE} type dummy\n`;
  }

  private addressOps(addrs: readonly string[]): string {
    let out = "";
    for (const ip of addrs) out += this.addrLine(ip);
    return out === "" ? "" : this.linkLine() + out;
  }

  private fullAddressOps(): string {
    const parts: string[] = [this.linkLine()];
    for (const ip of [...this.kernelAddrs]) if (!this.wantedAddrs.has(ip)) parts.push(this.addrLine(ip));
    for (const ip of this.wantedAddrs.keys()) parts.push(this.addrLine(ip));
    return parts.join("");
  }

  // ---- graceful termination ----

  private scheduleDrainCheck(ms: number): void {
    if (this.drainTimer !== null) return;
    this.drainTimer = this.clock.setTimeout(() => {
      this.drainTimer = null;
      void this.checkDraining().catch((err) => this.log.error("Drain check failed", err));
    }, ms);
    // The drain check must not keep a stopping agent alive.
    if (this.clock === realClock) Deno.unrefTimer(this.drainTimer);
  }

  /**
   * Deletes the drained real servers that have no connections left (`ipvsadm -L -n` of only the virtual
   * servers being drained, one `ipvsadm -R` for the deletions) and schedules the next check while some remain.
   * Resolves with the real servers deleted.
   */
  checkDraining(): Promise<string[]> {
    return this.exclusive(async () => {
      const deleted: string[] = [];
      if (this.draining.size === 0) return deleted;
      const stats = new Map<string, Map<string, { activeConn: number; inactiveConn: number }>>();
      const keys = [...this.draining.keys()];
      if (keys.length <= 16) {
        for (const key of keys) {
          const r = await this.runner.tryRun({ cmd: "ipvsadm", args: ["-L", "-n", ...key.split(" ")] });
          if (r.code === 0) { for (const [k, v] of parseIpvsadmList(r.stdout)) stats.set(k, v); }
          else stats.set(key, new Map()); // the virtual server is gone
        }
      } else {
        const r = await this.runner.run({ cmd: "ipvsadm", args: ["-L", "-n"], timeoutMs: IPVSADM_TIMEOUT });
        for (const [k, v] of parseIpvsadmList(r.stdout)) stats.set(k, v);
        for (const key of keys) if (!stats.has(key)) stats.set(key, new Map());
      }
      let batch = "";
      const gone: [string, string][] = [];
      for (const [key, reals] of this.draining) {
        const st = stats.get(key)!;
        for (const rs of reals) {
          const s = st.get(rs);
          if (s === undefined) gone.push([key, rs]);
          else if (s.activeConn + s.inactiveConn === 0) {
            batch += deleteRealServerLine(key, rs);
            gone.push([key, rs]);
          } else {
            this.log.v(5).info("Skip deleting real server till all connection have expired", {
              realServer: `${key} -r ${rs}`,
              activeConnection: s.activeConn,
              inactiveConnection: s.inactiveConn,
            });
          }
        }
      }
      if (batch !== "") {
        const r = await this.runner.tryRun({ cmd: "ipvsadm", args: ["-R"], stdin: batch });
        if (r.code !== 0 || r.stderr.trim() !== "") {
          this.log.error("Failed to delete drained real servers", r.stderr.trim());
          this.needFull = true;
          return deleted;
        }
      }
      for (const [key, rs] of gone) {
        this.draining.get(key)?.delete(rs);
        if (this.draining.get(key)?.size === 0) this.draining.delete(key);
        const k = this.kernelVS.get(key);
        if (k) realsMap(k).delete(rs);
        deleted.push(`${key} -r ${rs}`);
        this.log.info("Removed real server from graceful delete real server list", {
          realServer: `${key} -r ${rs}`,
        });
      }
      if (this.draining.size > 0) this.scheduleDrainCheck(this.opts.drainCheckIntervalMs ?? 60_000);
      return deleted;
    });
  }
}

/** Appends `name` to the names under `key` (a plain string while there is one). */
function addName(m: Map<string, string | string[]>, key: string, name: string): void {
  const have = m.get(key);
  if (have === undefined) m.set(key, name);
  else if (typeof have === "string") m.set(key, [have, name]);
  else have.push(name);
}

/** Removes `name` from the names under `key`; true when it was there. */
function removeName(m: Map<string, string | string[]>, key: string, name: string): boolean {
  const have = m.get(key);
  if (have === undefined) return false;
  if (typeof have === "string") {
    if (have !== name) return false;
    m.delete(key);
    return true;
  }
  const i = have.indexOf(name);
  if (i < 0) return false;
  have.splice(i, 1);
  if (have.length === 1) m.set(key, have[0]);
  return true;
}

/** The number of `-A <chain> ` rules in iptables-save/-S text. */
function countRules(text: string, chain: string): number {
  const prefix = `-A ${chain} `;
  let n = 0;
  for (const line of text.split("\n")) if (line.startsWith(prefix)) n++;
  return n;
}

function sameContext(a: RenderContext, b: RenderContext): boolean {
  return a.family === b.family && a.scheduler === b.scheduler && a.nodeIP === b.nodeIP &&
    a.nodePortIPs.join(",") === b.nodePortIPs.join(",") && a.nodeAddresses.size === b.nodeAddresses.size &&
    [...a.nodeAddresses].every((x) => b.nodeAddresses.has(x));
}
