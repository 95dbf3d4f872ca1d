/**
 * Change tracking between syncs for one IP family (upstream `servicechangetracker.go` and
 * `endpointschangetracker.go`): pending changes per Service, no-op updates dropped, and per sync the set
 * of changed Services (what makes partial syncs possible), whether any UDP port's endpoints changed
 * (stale conntrack cleanup) and the last-change-trigger times (network programming latency).
 * @module
 */
import { ANNOTATION_LAST_CHANGE_TRIGGER_TIME, type EndpointSlice, type Service } from "../kube/types.ts";
import { log } from "../log.ts";
import {
  endpointChangesPending,
  endpointChangesTotal,
  serviceChangesPending,
  serviceChangesTotal,
} from "../metrics.ts";
import {
  endpointListsEqual,
  EndpointSliceCache,
  type InvalidEndpointSliceCallback,
  type ServiceEndpoints,
  sliceKeys,
} from "./endpoint_slice_cache.ts";
import {
  buildServicePorts,
  type InvalidServiceCallback,
  objectKey,
  servicePortMapsEqual,
} from "./service_port.ts";
import type { EndpointInfo, IPFamily, ServicePortInfo } from "./types.ts";

/** Ports of one Service keyed by `servicePortNameString`. */
export type ServicePorts = ReadonlyMap<string, ServicePortInfo>;

interface ServiceChange {
  previous: ServicePorts | null;
  current: ServicePorts | null;
}

/**
 * Tracks Service changes for one family. {@linkcode ServiceChangeTracker.update} records a change and
 * drops it when it turns out to be a no-op; {@linkcode ServiceChangeTracker.apply} applies the pending
 * changes and returns the changed Services.
 */
export class ServiceChangeTracker {
  readonly #items = new Map<string, ServiceChange>();
  readonly #applied = new Map<string, ServicePorts>();
  /** Whether this tracker drives the (process-wide, family-less) change metrics. */
  readonly #countMetrics: boolean;

  /**
   * @param family The family whose ports are built.
   * @param onInvalid Called for Services with unusable fields.
   * @param countMetrics Update the service-change metrics (set on one tracker only when dual-stack).
   */
  constructor(
    readonly family: IPFamily,
    private readonly onInvalid?: InvalidServiceCallback,
    countMetrics = true,
  ) {
    this.#countMetrics = countMetrics;
  }

  /**
   * Records the change `previous` → `current` (either may be null, not both). Returns true when there
   * are pending changes to sync (whether or not caused by this call).
   */
  update(previous: Service | null, current: Service | null): boolean {
    const svc = current ?? previous;
    if (!svc) return false;
    if (this.#countMetrics) serviceChangesTotal.inc();
    const key = objectKey(svc);
    let change = this.#items.get(key);
    if (!change) {
      change = { previous: this.#applied.get(key) ?? null, current: null };
      this.#items.set(key, change);
    }
    change.current = current ? buildServicePorts(current, this.family, this.onInvalid) : null;
    if (servicePortMapsEqual(change.previous, change.current)) this.#items.delete(key);
    else log.v(4).info("Service updated ports", { service: key, portCount: change.current?.size ?? 0 });
    if (this.#countMetrics) serviceChangesPending.set(this.#items.size);
    return this.#items.size > 0;
  }

  /**
   * A resync of an unchanged Service: counted as upstream's Update(svc, svc) counts it, nothing else. Returns
   * true when there are pending changes to sync, as {@linkcode update} does.
   */
  resync(): boolean {
    if (this.#countMetrics) serviceChangesTotal.inc();
    return this.#items.size > 0;
  }

  /** Number of Services with pending changes. */
  get pending(): number {
    return this.#items.size;
  }

  /**
   * UDP service ports removed by the last {@linkcode apply} (their Service deleted, or the port dropped from
   * it): their stale conntrack flows are cleaned up (v1.38 #141371).
   */
  removedUDPPorts: ServicePortInfo[] = [];

  /** Applies pending changes; returns the keys of the Services that changed. */
  apply(): Set<string> {
    const changed = new Set<string>();
    this.removedUDPPorts = [];
    for (const [key, change] of this.#items) {
      changed.add(key);
      for (const [pk, info] of change.previous ?? []) {
        if (info.protocol === "UDP" && !change.current?.has(pk)) this.removedUDPPorts.push(info);
      }
      if (change.current && change.current.size > 0) this.#applied.set(key, change.current);
      else this.#applied.delete(key);
    }
    this.#items.clear();
    if (this.#countMetrics) serviceChangesPending.set(0);
    return changed;
  }

  /** The applied ports of one Service. */
  get(serviceKey: string): ServicePorts | undefined {
    return this.#applied.get(serviceKey);
  }

  /** Every applied Service. */
  services(): IterableIterator<[string, ServicePorts]> {
    return this.#applied.entries();
  }

  /** Number of applied Services. */
  get size(): number {
    return this.#applied.size;
  }
}

/** What {@linkcode EndpointsChangeTracker.checkout} reports. */
export interface EndpointsUpdateResult {
  /** Services whose endpoints changed. */
  readonly changedServices: Set<string>;
  /** Some UDP port's endpoints changed: stale UDP conntrack entries may exist. */
  readonly conntrackCleanupRequired: boolean;
  /** Trigger times (ms since epoch) of the applied changes, per Service. */
  readonly lastChangeTriggerTimes: Map<string, number[]>;
}

/** Parses the last-change-trigger-time annotation; null when absent or unparsable. */
export function lastChangeTriggerTime(slice: EndpointSlice): number | null {
  const raw = slice.metadata?.annotations?.[ANNOTATION_LAST_CHANGE_TRIGGER_TIME];
  if (!raw) return null;
  const t = Date.parse(raw);
  if (Number.isNaN(t)) {
    log.error("Error while parsing EndpointsLastChangeTriggerTimeAnnotation", undefined, { value: raw });
    return null;
  }
  return t;
}

/** Tracks EndpointSlice changes for one family. */
export class EndpointsChangeTracker {
  readonly cache: EndpointSliceCache;
  readonly #dirty = new Set<string>();
  readonly #applied = new Map<string, ServiceEndpoints>();
  readonly #triggerTimes = new Map<string, number[]>();
  readonly #countMetrics: boolean;
  #pendingChanges = 0;

  /**
   * @param nodeName This node's name.
   * @param family The family tracked (slices of other address types are ignored).
   * @param startTimeMs Tracker start: older trigger times are not measured.
   * @param countMetrics Update the endpoint-change metrics (one tracker only when dual-stack).
   * @param onInvalid Called for the parts of a slice that are skipped as invalid.
   */
  constructor(
    nodeName: string,
    readonly family: IPFamily,
    private readonly startTimeMs: number,
    countMetrics = true,
    onInvalid?: InvalidEndpointSliceCallback,
  ) {
    this.cache = new EndpointSliceCache(nodeName, family, onInvalid);
    this.#countMetrics = countMetrics;
  }

  /** Records a slice add/update (`remove` false) or delete. Returns true when this call changed anything. */
  update(slice: EndpointSlice, remove: boolean): boolean {
    if (this.#countMetrics) endpointChangesTotal.inc();
    if (!sliceKeys(slice)) return false;
    const serviceKey = this.cache.update(slice, remove);
    if (serviceKey === null) return false;
    this.#dirty.add(serviceKey);
    this.#pendingChanges++;
    if (this.#countMetrics) endpointChangesPending.set(this.#pendingChanges);
    // On deletion the annotation dates from the last update, which is not what is measured.
    if (remove) this.#triggerTimes.delete(serviceKey);
    else {
      const t = lastChangeTriggerTime(slice);
      if (t !== null && t > this.startTimeMs) {
        const list = this.#triggerTimes.get(serviceKey);
        if (list) list.push(t);
        else this.#triggerTimes.set(serviceKey, [t]);
      }
    }
    return true;
  }

  /** A resync of an unchanged slice: counted as upstream counts it; never a change. */
  resync(): void {
    if (this.#countMetrics) endpointChangesTotal.inc();
  }

  /** Number of Services with pending (not yet checked out) slice changes. */
  get pending(): number {
    return this.#dirty.size;
  }

  /** Applies the pending changes: recomputes the touched Services and reports those that really changed. */
  checkout(): EndpointsUpdateResult {
    const changedServices = new Set<string>();
    let conntrackCleanupRequired = false;
    for (const key of this.#dirty) {
      const prev = this.#applied.get(key) ?? new Map<string, readonly EndpointInfo[]>();
      const next = this.cache.endpointsFor(key);
      let changed = false;
      const ports = new Set([...prev.keys(), ...next.keys()]);
      for (const pk of ports) {
        const a = prev.get(pk) ?? [];
        const b = next.get(pk) ?? [];
        if (!endpointListsEqual(a, b)) {
          changed = true;
          if (pk.endsWith("/UDP")) conntrackCleanupRequired = true;
        }
      }
      if (next.size > 0) this.#applied.set(key, next);
      else this.#applied.delete(key);
      if (changed) changedServices.add(key);
    }
    this.#dirty.clear();
    this.#pendingChanges = 0;
    if (this.#countMetrics) endpointChangesPending.set(0);
    const lastChangeTriggerTimes = new Map(this.#triggerTimes);
    this.#triggerTimes.clear();
    return { changedServices, conntrackCleanupRequired, lastChangeTriggerTimes };
  }

  /** The applied endpoints of one Service (per port key). */
  get(serviceKey: string): ServiceEndpoints | undefined {
    return this.#applied.get(serviceKey);
  }
}
