/**
 * The dataplane-independent proxier: informer handlers → change trackers → bounded-frequency runner →
 * one {@linkcode ProxySnapshot} per IP family → `Dataplane.sync`, followed by the side outputs
 * (conntrack cleanup, proxy and service health, metrics).
 *
 * Rules kept from upstream: nothing is synced before both Services and EndpointSlices have synced
 * (never blackhole on start); a failed sync is logged, counted, retried after syncPeriod, and the next
 * sync is full (the trackers were already drained); full syncs also happen on the first sync, on a
 * topology-label change of the Node, when the dataplane reports external flushing, and every
 * fullSyncPeriod (1 h). Endpoint selection is done here once per service port and cached until the
 * Service, its endpoints or the node topology change.
 * @module
 */
import type { EndpointSlice, Node, Service } from "../kube/types.ts";
import { log } from "../log.ts";
import { parseCIDR } from "../net/ip.ts";
import {
  networkProgrammingDuration,
  noLocalEndpointsTotal,
  quarantinedServicePorts,
  syncFailuresTotal,
  syncFullProxyRulesDuration,
  syncPartialProxyRulesDuration,
  syncProxyRulesDuration,
  syncProxyRulesLastQueuedTimestamp,
  syncProxyRulesLastTimestamp,
} from "../metrics.ts";
import { EndpointsChangeTracker, ServiceChangeTracker } from "./change_tracker.ts";
import { type Clock, realClock, type TimerId } from "./clock.ts";
import { type InvalidEndpointSliceCallback, portKey } from "./endpoint_slice_cache.ts";
import { nodeIPsOfFamily, topologyLabels } from "./node_manager.ts";
import { ServiceHealthBook } from "./service_health_book.ts";
import { BoundedFrequencyRunner } from "./runner.ts";
import { isolateRefused } from "./isolation.ts";
import type { InvalidServiceCallback } from "./service_port.ts";
import { servicePortState } from "./service_plan.ts";
import type {
  Dataplane,
  EndpointInfo,
  IPFamily,
  NodeState,
  ProxyHealthUpdater,
  ProxySnapshot,
  ServiceHealthUpdater,
  ServicePortInfo,
  ServicePortState,
  SyncResult,
} from "./types.ts";

/** Upstream `proxyutil.FullSyncPeriod`. */
export const FULL_SYNC_PERIOD_MS = 60 * 60 * 1000;

/** Options of {@linkcode Proxier}. */
export interface ProxierOptions {
  /** One dataplane per IP family served (one entry single-stack, two dual-stack). */
  families: Map<IPFamily, Dataplane>;
  nodeName: string;
  /** Minimum time from the end of one sync to the start of the next. */
  minSyncPeriodMs: number;
  /** Retry interval after a failure, and how often `needsFullSync()` is polled. */
  syncPeriodMs: number;
  /** Longest time between two runs, and age after which a sync is full. @default 3600000 */
  fullSyncPeriodMs?: number;
  clock?: Clock;
  healthServer?: ProxyHealthUpdater;
  serviceHealthServer?: ServiceHealthUpdater;
  /**
   * Stale UDP conntrack cleanup, called after a successful sync in which UDP endpoints changed or UDP service
   * ports were removed (`removed`).
   */
  conntrackCleaner?: (snapshot: ProxySnapshot, removed: readonly ServicePortInfo[]) => Promise<void>;
  /** Called for Services with unusable fields (main.ts emits an Event). */
  onInvalidService?: InvalidServiceCallback;
  /** Called for the parts of EndpointSlices skipped as invalid (main.ts emits an Event). */
  onInvalidEndpointSlice?: InvalidEndpointSliceCallback;
  /**
   * Called for each service port whose rules the dataplane's kernel tool refused: the port is left out of
   * the rules (the others are programmed) until its Service changes or the next full sync (main.ts emits an
   * Event). `error` is the tool's message.
   */
  onQuarantine?: (port: ServicePortInfo, family: IPFamily, error: string) => void;
  /**
   * When a sync fails, find the refused service ports by bisection and program the rest (isolation.ts).
   * @default true
   */
  isolateRefusedPorts?: boolean;
  /** Feature gate PreferSameTrafficDistribution (node hints). @default true */
  preferSameTrafficDistribution?: boolean;
}

interface FamilyState {
  family: IPFamily;
  dataplane: Dataplane;
  services: ServiceChangeTracker;
  endpoints: EndpointsChangeTracker;
  /** Cached ServicePortStates per Service `ns/name`. */
  states: Map<string, ServicePortState[]>;
  /**
   * Every port of {@linkcode states} by `nameString`, kept up to date per changed Service: the snapshot's
   * `servicePorts` when nothing is quarantined (a new Map of every port per sync was the largest part of the
   * proxier's own work for a one-Service change at 10k, and a large object for the GC to collect each time).
   */
  ports: Map<string, ServicePortState>;
  /** Endpoints over {@linkcode ports}. */
  totalEndpoints: number;
  needFullSync: boolean;
  lastFullSyncAt: number | null;
  lastSnapshot: ProxySnapshot | null;
  /** Service ports held out of the rules because the kernel tool refused them, by `nameString`. */
  quarantine: Map<string, { serviceKey: string; error: string }>;
  /** Services changed since the last successful sync; null before the first one (every port is suspect). */
  unsynced: Set<string> | null;
}

/** Orchestrates the sync loop for every family. */
export class Proxier {
  readonly #clock: Clock;
  readonly #families: FamilyState[] = [];
  readonly #runner: BoundedFrequencyRunner;
  readonly #fullSyncPeriodMs: number;
  #servicesSynced = false;
  #endpointSlicesSynced = false;
  #nodeLabels: Record<string, string> = {};
  #topology: Record<string, string> = {};
  #node: Node | undefined;
  /** CIDRs of every ServiceCIDR object, both families. */
  #serviceCIDRs: readonly string[] = [];
  /** Recompute every selection on the next sync (node topology changed). */
  #selectionStale = false;
  #pollTimer: TimerId | null = null;
  /** Health-check node ports and local endpoint counts, updated per Service a sync rebuilds. */
  readonly #health = new ServiceHealthBook();
  #started = false;
  #syncCount = 0;
  #failureCount = 0;

  constructor(private readonly opts: ProxierOptions) {
    if (opts.families.size === 0) throw new TypeError("Proxier needs at least one IP family");
    this.#clock = opts.clock ?? realClock;
    this.#fullSyncPeriodMs = opts.fullSyncPeriodMs ?? FULL_SYNC_PERIOD_MS;
    const start = this.#clock.now();
    const onInvalid = opts.onInvalidService ? this.#dedupInvalid(opts.onInvalidService) : undefined;
    const onInvalidSlice = opts.onInvalidEndpointSlice
      ? this.#dedupInvalid(opts.onInvalidEndpointSlice)
      : undefined;
    let first = true;
    for (const [family, dataplane] of opts.families) {
      if (dataplane.family !== family) {
        throw new TypeError(`dataplane for ${family} reports family ${dataplane.family}`);
      }
      this.#families.push({
        family,
        dataplane,
        services: new ServiceChangeTracker(family, onInvalid, first),
        endpoints: new EndpointsChangeTracker(opts.nodeName, family, start, first, onInvalidSlice),
        states: new Map(),
        ports: new Map(),
        totalEndpoints: 0,
        needFullSync: true,
        lastFullSyncAt: null,
        lastSnapshot: null,
        quarantine: new Map(),
        unsynced: null,
      });
      // Our own failure counter starts at 0 per family: "no failed sync yet" is a measured value, and the
      // alert on its rate (deploy/monitoring/alerts.yaml) has a series to evaluate from the start.
      syncFailuresTotal.inc({ ip_family: family }, 0);
      first = false;
    }
    this.#runner = new BoundedFrequencyRunner("sync-runner", () => this.#syncAll(), {
      minIntervalMs: opts.minSyncPeriodMs,
      retryIntervalMs: opts.syncPeriodMs,
      maxIntervalMs: Math.max(this.#fullSyncPeriodMs, opts.minSyncPeriodMs),
      clock: this.#clock,
    });
  }

  /** Reports each (Service version, reason) once even though every family parses the Service. */
  #dedupInvalid<T extends Service | EndpointSlice, F extends string | undefined>(
    cb: (obj: T, reason: string, field: F) => void,
  ): (obj: T, reason: string, field: F) => void {
    const seen = new Set<string>();
    return (svc, reason, field) => {
      const id =
        `${svc.metadata?.namespace}/${svc.metadata?.name}@${svc.metadata?.resourceVersion}|${reason}|${
          field ?? ""
        }`;
      if (seen.has(id)) return;
      if (seen.size > 10_000) seen.clear();
      seen.add(id);
      cb(svc, reason, field);
    };
  }

  // ---- informer handlers ------------------------------------------------------------------------

  /** Service informer: added. */
  onServiceAdd(svc: Service): void {
    this.onServiceUpdate(null, svc);
  }

  /**
   * Service informer: updated (`old` null for an add). `old === svc` is a resync (the informer re-delivers its
   * cached object, which may keep only the identity): counted as a change, as upstream, but nothing is re-parsed
   * since the Service is unchanged.
   */
  onServiceUpdate(old: Service | null, svc: Service | null): void {
    let pending = false;
    const resync = old !== null && old === svc;
    for (const f of this.#families) {
      pending = (resync ? f.services.resync() : f.services.update(old, svc)) || pending;
    }
    if (pending && this.#initialized) this.sync();
  }

  /** Service informer: deleted. */
  onServiceDelete(svc: Service): void {
    this.onServiceUpdate(svc, null);
  }

  /** Service informer: initial list delivered. */
  onServicesSynced(): void {
    this.#servicesSynced = true;
    if (this.#initialized) this.sync();
  }

  /** EndpointSlice informer: added. */
  onEndpointSliceAdd(slice: EndpointSlice): void {
    this.#endpointSliceChange(slice, false);
  }

  /** EndpointSlice informer: updated. `old === slice` is a resync: counted as a change, as upstream, and a no-op. */
  onEndpointSliceUpdate(old: EndpointSlice | null, slice: EndpointSlice): void {
    if (old !== null && old === slice) {
      if (slice.addressType !== "IPv4" && slice.addressType !== "IPv6") return;
      for (const f of this.#families) if (f.family === slice.addressType) f.endpoints.resync();
      return;
    }
    this.#endpointSliceChange(slice, false);
  }

  /** EndpointSlice informer: deleted. */
  onEndpointSliceDelete(slice: EndpointSlice): void {
    this.#endpointSliceChange(slice, true);
  }

  /** EndpointSlice informer: initial list delivered. */
  onEndpointSlicesSynced(): void {
    this.#endpointSlicesSynced = true;
    if (this.#initialized) this.sync();
  }

  #endpointSliceChange(slice: EndpointSlice, remove: boolean): void {
    if (slice.addressType !== "IPv4" && slice.addressType !== "IPv6") return; // FQDN and unknown
    let changed = false;
    for (const f of this.#families) {
      if (f.family === slice.addressType) changed = f.endpoints.update(slice, remove) || changed;
    }
    if (changed && this.#initialized) this.sync();
  }

  /**
   * The cluster's ServiceCIDRs changed (upstream's OnServiceCIDRsChanged, with every CIDR of every object).
   * Upstream only uses the new list at its next full sync; here the next sync (queued now) carries it.
   */
  onServiceCIDRsChanged(cidrs: readonly string[]): void {
    const parsed: string[] = [];
    for (const c of cidrs) {
      const p = parseCIDR(String(c ?? "").trim());
      if (p) parsed.push(p.cidr);
      else log.error("Ignoring invalid ServiceCIDR", undefined, { cidr: c });
    }
    const sorted = [...new Set(parsed)].sort();
    if (sameStrings(sorted, this.#serviceCIDRs)) return;
    this.#serviceCIDRs = sorted;
    log.v(4).info("Updated service CIDRs", { cidrs: sorted });
    if (this.#initialized) this.sync();
  }

  /** Node informer (own Node only): added. */
  onNodeAdd(node: Node): void {
    this.onNodeUpdate(null, node);
  }

  /** Node informer: updated. A change of the topology labels forces a full resync. */
  onNodeUpdate(_old: Node | null, node: Node): void {
    if (node.metadata?.name !== this.opts.nodeName) {
      log.error("Received a watch event for a node that doesn't match the current node", undefined, {
        eventNode: node.metadata?.name,
        currentNode: this.opts.nodeName,
      });
      return;
    }
    this.#node = node;
    this.#nodeLabels = { ...(node.metadata?.labels ?? {}) };
    this.#setTopology(topologyLabels(node));
  }

  /** Node informer: deleted (the NodeManager exits the process; until then topology is cleared). */
  onNodeDelete(node: Node): void {
    if (node.metadata?.name !== this.opts.nodeName) return;
    this.#node = undefined;
    this.#nodeLabels = {};
    this.#setTopology({});
  }

  #setTopology(labels: Record<string, string>): void {
    const same = Object.keys(labels).length === Object.keys(this.#topology).length &&
      Object.entries(labels).every(([k, v]) => this.#topology[k] === v);
    if (same) return;
    log.v(4).info("Updated proxier node topology labels", { labels });
    this.#topology = labels;
    this.#selectionStale = true;
    for (const f of this.#families) f.needFullSync = true;
    if (this.#initialized) this.sync();
  }

  // ---- loop ---------------------------------------------------------------------------------

  get #initialized(): boolean {
    return this.#servicesSynced && this.#endpointSlicesSynced;
  }

  /** Queues a sync: marks every family's health as pending and asks the runner (coalesced). */
  sync(): void {
    const now = this.#clock.now();
    for (const f of this.#families) {
      this.opts.healthServer?.queuedUpdate(f.family);
      syncProxyRulesLastQueuedTimestamp.set({ ip_family: f.family }, now / 1000);
    }
    if (this.#initialized) this.#runner.run();
  }

  /** Starts the sync loop (upstream `SyncLoop`) and the external-flush poll. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    const now = this.#clock.now();
    for (const f of this.#families) {
      this.opts.healthServer?.updated(f.family);
      syncProxyRulesLastQueuedTimestamp.set({ ip_family: f.family }, now / 1000);
    }
    this.#runner.start();
    this.#schedulePoll();
  }

  /** Stops the loop and waits for a sync in progress. */
  async stop(): Promise<void> {
    this.#started = false;
    if (this.#pollTimer !== null) this.#clock.clearTimeout(this.#pollTimer);
    this.#pollTimer = null;
    await this.#runner.stop();
  }

  /** Number of sync attempts (each covers every family). */
  get syncCount(): number {
    return this.#syncCount;
  }

  /** Number of failed family syncs. */
  get failureCount(): number {
    return this.#failureCount;
  }

  /** The last snapshot handed to `family`'s dataplane. */
  lastSnapshot(family: IPFamily): ProxySnapshot | null {
    return this.#families.find((f) => f.family === family)?.lastSnapshot ?? null;
  }

  #schedulePoll(): void {
    if (!this.#started || !this.#families.some((f) => f.dataplane.needsFullSync)) return;
    this.#pollTimer = this.#clock.setTimeout(async () => {
      this.#pollTimer = null;
      let any = false;
      for (const f of this.#families) {
        if (!f.dataplane.needsFullSync || f.lastSnapshot === null) continue;
        try {
          if (await f.dataplane.needsFullSync()) {
            log.info("Dataplane state was flushed externally; forcing a full sync", { ipFamily: f.family });
            f.needFullSync = true;
            any = true;
          }
        } catch (err) {
          log.error("Checking for external flushes failed", err, { ipFamily: f.family });
        }
      }
      if (any) this.sync();
      this.#schedulePoll();
    }, this.opts.syncPeriodMs);
  }

  async #syncAll(): Promise<void> {
    if (!this.#initialized) {
      log.info("Not syncing rules until Services and Endpoints have been received from master");
      return;
    }
    this.#syncCount++;
    const selectionStale = this.#selectionStale;
    this.#selectionStale = false;
    let failed: unknown = null;
    for (const f of this.#families) {
      try {
        await this.#syncFamily(f, selectionStale);
      } catch (err) {
        failed = err;
      }
    }
    if (failed !== null) throw failed;
  }

  async #syncFamily(f: FamilyState, selectionStale: boolean): Promise<void> {
    const start = performance.now();
    const now = this.#clock.now();
    const full = f.needFullSync || f.lastFullSyncAt === null ||
      (now - f.lastFullSyncAt >= this.#fullSyncPeriodMs && !(f.dataplane.skipsPeriodicFullSync?.() ?? false));
    const changedServices = f.services.apply();
    const removedUDP = f.services.removedUDPPorts;
    const ep = f.endpoints.checkout();
    for (const k of ep.changedServices) changedServices.add(k);
    const cidrs = f.lastSnapshot?.serviceCIDRs;
    const cidrsChanged = cidrs !== undefined && !sameStrings(cidrs, this.#familyServiceCIDRs(f.family));
    if (!full && !selectionStale && changedServices.size === 0 && !cidrsChanged) {
      // Nothing of this family changed (e.g. an IPv4-only slice update in a dual-stack agent): the kernel
      // already holds exactly what a partial sync would write, so skip the restore and its latency.
      this.opts.healthServer?.updated(f.family);
      log.v(4).info("No changes for this IP family; skipping its sync", { ipFamily: f.family });
      return;
    }
    // The trackers are drained now: if this sync fails, the next one must be full.
    f.needFullSync = true;
    if (f.unsynced !== null) { for (const k of changedServices) f.unsynced.add(k); }
    // Quarantined ports are tried again when their Service changes, and all of them on a full sync.
    const retried = new Set<string>();
    for (const [port, q] of f.quarantine) {
      if (full || changedServices.has(q.serviceKey)) {
        retried.add(port);
        f.quarantine.delete(port);
      }
    }

    let snapshot = this.#buildSnapshot(f, changedServices, selectionStale, full);
    f.lastSnapshot = snapshot;
    let result: SyncResult;
    try {
      result = await f.dataplane.sync(snapshot);
    } catch (err) {
      // Counted even when isolation then programs the rest: the sync as asked for failed.
      this.#failureCount++;
      syncFailuresTotal.inc({ ip_family: f.family });
      const isolated = this.opts.isolateRefusedPorts === false
        ? null
        : await this.#isolate(f, snapshot, err, retried);
      if (!isolated) {
        this.#setQuarantineMetric(f);
        log.error("Sync failed", err, {
          ipFamily: f.family,
          retryingTime: `${this.opts.syncPeriodMs / 1000}s`,
        });
        throw err;
      }
      ({ snapshot, result } = isolated);
      f.lastSnapshot = snapshot;
    }
    this.#setQuarantineMetric(f);
    f.unsynced = new Set();
    f.needFullSync = false;
    if (result.full) f.lastFullSyncAt = now;
    const seconds = (performance.now() - start) / 1000;
    const labels = { ip_family: f.family };
    syncProxyRulesDuration.observe(labels, seconds);
    (result.full ? syncFullProxyRulesDuration : syncPartialProxyRulesDuration).observe(labels, seconds);
    syncProxyRulesLastTimestamp.set(labels, this.#clock.now() / 1000);
    for (const times of ep.lastChangeTriggerTimes.values()) {
      for (const t of times) {
        networkProgrammingDuration.observe(labels, Math.max(0, this.#clock.now() - t) / 1000);
      }
    }
    this.#recordNoLocalEndpoints(snapshot);
    this.opts.healthServer?.updated(f.family);
    this.#updateServiceHealth();
    log.v(2).info("SyncProxyRules complete", {
      ipFamily: f.family,
      full: result.full,
      elapsed: `${seconds.toFixed(3)}s`,
      numServices: snapshot.servicePorts.size,
      numEndpoints: snapshot.totalEndpoints,
    });
    if ((ep.conntrackCleanupRequired || removedUDP.length > 0) && this.opts.conntrackCleaner) {
      try {
        await this.opts.conntrackCleaner(snapshot, removedUDP);
      } catch (err) {
        log.error("Failed to clean up stale UDP conntrack entries", err, { ipFamily: f.family });
      }
    }
  }

  #setQuarantineMetric(f: FamilyState): void {
    quarantinedServicePorts.set({ ip_family: f.family }, f.quarantine.size);
  }

  /**
   * After a failed sync: bisects the suspect ports (those of Services changed since the last successful sync,
   * every port before the first one, and the quarantined ports retried now) with checks (or, without a check
   * mode, full syncs) of subsets, puts
   * the refused ports in quarantine (logged, reported) and returns the snapshot of the rest and its result.
   * Null when the failure is not a port's (the trusted ports alone fail too).
   */
  async #isolate(
    f: FamilyState,
    failed: ProxySnapshot,
    error: unknown,
    retried: ReadonlySet<string>,
  ): Promise<{ snapshot: ProxySnapshot; result: SyncResult } | null> {
    const trusted: ServicePortState[] = [];
    const suspects: ServicePortState[] = [];
    for (const s of failed.servicePorts.values()) {
      const suspect = f.unsynced === null || f.unsynced.has(s.info.serviceKey) ||
        retried.has(s.info.nameString);
      (suspect ? suspects : trusted).push(s);
    }
    log.error("Sync failed; looking for the service ports the dataplane refuses", error, {
      ipFamily: f.family,
      suspects: suspects.length,
    });
    const subset = (items: readonly ServicePortState[]): ProxySnapshot => {
      const servicePorts = new Map<string, ServicePortState>();
      let totalEndpoints = 0;
      for (const s of items) {
        servicePorts.set(s.info.nameString, s);
        totalEndpoints += s.endpoints.length;
      }
      return { ...failed, servicePorts, changedServices: null, totalEndpoints };
    };
    // With a check mode the search commits nothing: the kernel keeps the last good rules until one real sync
    // of the accepted ports (isolation.ts).
    const dp = f.dataplane;
    const check = dp.check === undefined
      ? undefined
      : (items: readonly ServicePortState[]) => dp.check!(subset(items));
    const found = await isolateRefused(trusted, suspects, error, (items) => dp.sync(subset(items)), {
      check,
    });
    if (!found) return null;
    for (const { item, error: why } of found.refused) {
      const message = errorMessage(why);
      f.quarantine.set(item.info.nameString, { serviceKey: item.info.serviceKey, error: message });
      log.error(
        "Service port refused by the dataplane; leaving it out until its Service changes or the next full sync",
        undefined,
        {
          ipFamily: f.family,
          servicePort: item.info.nameString,
          err: message,
        },
      );
      try {
        this.opts.onQuarantine?.(item.info, f.family, message);
      } catch (err) {
        log.error("Quarantine callback failed", err);
      }
    }
    log.info("Programmed every service port but the refused ones", {
      ipFamily: f.family,
      attempts: found.attempts,
      realSyncs: found.realSyncs,
      refused: found.refused.length,
    });
    return { snapshot: subset(found.accepted), result: found.result };
  }

  #buildSnapshot(
    f: FamilyState,
    changed: Set<string>,
    selectionStale: boolean,
    full: boolean,
  ): ProxySnapshot {
    const categorizeOpts = { preferSameTrafficDistribution: this.opts.preferSameTrafficDistribution ?? true };
    const build = (key: string): ServicePortState[] | null => {
      const ports = f.services.get(key);
      if (!ports) return null;
      const eps = f.endpoints.get(key);
      const out: ServicePortState[] = [];
      for (const info of ports.values()) {
        const endpoints: readonly EndpointInfo[] = eps?.get(portKey(info.name.port, info.protocol)) ?? [];
        out.push(servicePortState(info, endpoints, this.opts.nodeName, this.#topology, categorizeOpts));
      }
      return out;
    };
    if (selectionStale) {
      f.states.clear();
      f.ports.clear();
      f.totalEndpoints = 0;
      this.#health.clear(f.family);
      for (const [key] of f.services.services()) {
        const s = build(key);
        if (s) setStates(f, key, s);
        if (s) this.#health.set(f.family, key, s);
      }
    } else {
      for (const key of changed) {
        const s = build(key);
        setStates(f, key, s);
        this.#health.set(f.family, key, s ?? undefined);
      }
    }
    let servicePorts: ReadonlyMap<string, ServicePortState> = f.ports;
    let totalEndpoints = f.totalEndpoints;
    if (f.quarantine.size > 0) {
      const kept = new Map<string, ServicePortState>();
      totalEndpoints = 0;
      for (const s of f.ports.values()) {
        if (f.quarantine.has(s.info.nameString)) continue;
        kept.set(s.info.nameString, s);
        totalEndpoints += s.endpoints.length;
      }
      servicePorts = kept;
    }
    const node: NodeState = {
      name: this.opts.nodeName,
      ips: nodeIPsOfFamily(this.#node, f.family),
      labels: this.#nodeLabels,
    };
    const serviceCIDRs = this.#familyServiceCIDRs(f.family);
    return {
      family: f.family,
      servicePorts,
      changedServices: full ? null : changed,
      node,
      totalEndpoints,
      serviceCIDRs,
    };
  }

  #familyServiceCIDRs(family: IPFamily): string[] {
    // Parsed and canonical (onServiceCIDRsChanged): only IPv6 text has a colon.
    return this.#serviceCIDRs.filter((c) => (c.includes(":") ? "IPv6" : "IPv4") === family);
  }

  #recordNoLocalEndpoints(snapshot: ProxySnapshot): void {
    let internal = 0;
    let external = 0;
    for (const { info, selection } of snapshot.servicePorts.values()) {
      // As upstream: counted only when the service has usable endpoints on some node (else it is REJECTed).
      const noLocal = selection.hasAnyEndpoints && (selection.localEndpoints?.length ?? 0) === 0;
      if (info.internalPolicyLocal && noLocal) internal++;
      if (info.externalPolicyLocal && noLocal) external++;
    }
    noLocalEndpointsTotal.set({ ip_family: snapshot.family, traffic_policy: "internal" }, internal);
    noLocalEndpointsTotal.set({ ip_family: snapshot.family, traffic_policy: "external" }, external);
  }

  /** Pushes health-check node ports and local ready endpoint counts to the service health server. */
  #updateServiceHealth(): void {
    const server = this.opts.serviceHealthServer;
    if (server) this.#health.flush(server);
  }
}

/** The first 300 characters of an error's message (a kernel tool's stderr can be long). */
function errorMessage(err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  return text.length > 300 ? `${text.slice(0, 300)}...` : text;
}

function sameStrings(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/**
 * Replaces the cached states of Service `key` (null: gone) and brings the family's port map and endpoint count
 * up to date. A port the Service keeps stays where it was in the map; a new one goes to the end.
 */
function setStates(f: FamilyState, key: string, states: ServicePortState[] | null): void {
  const old = f.states.get(key);
  if (old !== undefined) {
    for (const o of old) {
      f.totalEndpoints -= o.endpoints.length;
      const name = o.info.nameString;
      if (states === null || !states.some((n) => n.info.nameString === name)) f.ports.delete(name);
    }
  }
  if (states === null) {
    f.states.delete(key);
    return;
  }
  f.states.set(key, states);
  for (const n of states) {
    f.ports.set(n.info.nameString, n);
    f.totalEndpoints += n.endpoints.length;
  }
}
