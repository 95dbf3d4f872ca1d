/**
 * Informers: a cache of one resource kept current by a {@link Reflector}, and ordered event handlers.
 *
 * As client-go's shared informer: objects are keyed `namespace/name` (or `name`), `hasSynced()` turns true
 * once the first list has been delivered, a relist emits only the differences (objects whose
 * resourceVersion did not change emit nothing), and every `resyncMs` while watching each cached object is
 * re-delivered as `onUpdate(obj, obj)`. Handlers run synchronously in registration order; one that throws is logged and the
 * others (and the informer) carry on.
 *
 * The factories apply kube-proxy v1.37's selectors (cmd/kube-proxy/app/server.go): Services without the
 * `service.kubernetes.io/service-proxy-name` label and with `spec.clusterIP!=None`, EndpointSlices without the
 * `service.kubernetes.io/headless` label, every ServiceCIDR, and only this node's Node. (v1.35 put both labels on
 * all three; upstream filters nothing more client-side: a slice of an opted-out Service is cached but has no
 * Service to serve.)
 * @module
 */

import { log, type Logger } from "../log.ts";
import type { EndpointSlice, KubeObject, Node, Service, ServiceCIDR } from "./types.ts";
import { LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME } from "./types.ts";
import type { KubeClient } from "./client.ts";
import { Reflector, type ReflectorOptions, type ReflectorStore } from "./reflector.ts";

/** Callbacks of an informer. All optional. */
export interface EventHandler<T> {
  /** A new object (`initial` is true while the first list is delivered). */
  onAdd?(obj: T, initial: boolean): void;
  /** A changed object, or `(obj, obj)` (the same object twice) on resync. */
  onUpdate?(oldObj: T, obj: T): void;
  /** A removed object (its last known state). */
  onDelete?(obj: T): void;
}

/**
 * Options of {@link Informer}: the reflector's (`resyncMs` is the resync period, configSyncPeriod, 0 disables,
 * counted while a watch runs as in client-go), and what the cache keeps.
 */
export interface InformerOptions<T extends KubeObject = KubeObject> extends Omit<ReflectorOptions, "path"> {
  /**
   * What the cache keeps of each object (default: the whole object as decoded, minus managedFields). Handlers
   * get the decoded object on every add and update, and on deletes from the watch; the kept form is what they
   * get as the old object of an update, for a deletion a relist finds, on resync (`onUpdate(kept, kept)`), and
   * what `get`/`list` return. It must keep the name, namespace and resourceVersion. Handlers must then be added
   * before the informer syncs (a late handler would only see kept forms).
   */
  cacheTransform?: (obj: T) => T;
}

/** The cache key of an object: `namespace/name`, or `name` for cluster-scoped objects. */
export function objectKey(obj: KubeObject): string {
  const m = obj.metadata;
  return m?.namespace ? `${m.namespace}/${m.name}` : `${m?.name}`;
}

/**
 * Drops `metadata.managedFields` from a freshly decoded object (in place), as kube-proxy's informer
 * transform does: server-side-apply bookkeeping, often larger than the rest of the object, which kube-proxy
 * never reads.
 */
export function stripManagedFields<T extends KubeObject>(obj: T): T {
  const m = obj.metadata as { managedFields?: unknown } | undefined;
  if (m && m.managedFields !== undefined) delete m.managedFields;
  return obj;
}

/**
 * The identity of a Service, as an informer cache may keep it (`cacheTransform`): name, namespace and
 * resourceVersion. kube-proxy's handlers parse a Service into its own model when it arrives; the cached copy only
 * has to say which Service a later update or a relist-found deletion is about.
 */
export function keepServiceIdentity(svc: Service): Service {
  const m = svc.metadata;
  return { metadata: { name: m?.name, namespace: m?.namespace, resourceVersion: m?.resourceVersion } };
}

/**
 * The identity of an EndpointSlice, as an informer cache may keep it (`cacheTransform`): name, namespace,
 * resourceVersion, the `kubernetes.io/service-name` label and the address type, which is what kube-proxy's
 * handlers read of a deleted slice. Its endpoints live only in the proxy's own model.
 */
export function keepEndpointSliceIdentity(slice: EndpointSlice): EndpointSlice {
  const m = slice.metadata;
  const svcName = m?.labels?.[LABEL_SERVICE_NAME];
  const kept: EndpointSlice = {
    metadata: { name: m?.name, namespace: m?.namespace, resourceVersion: m?.resourceVersion },
    addressType: slice.addressType,
  };
  if (svcName !== undefined) kept.metadata!.labels = { [LABEL_SERVICE_NAME]: svcName };
  return kept;
}

/** A cache of one resource kept in sync with the API server, with event handlers. */
export class Informer<T extends KubeObject> implements ReflectorStore<T> {
  private readonly cache = new Map<string, T>();
  private readonly handlers: EventHandler<T>[] = [];
  private readonly syncedCallbacks: (() => void)[] = [];
  private synced = false;
  private controller?: AbortController;
  private running?: Promise<void>;
  private readonly log: Logger;
  /** The list/watch loop. */
  readonly reflector: Reflector<T>;

  private readonly keep: (obj: T) => T;

  constructor(client: KubeClient, readonly path: string, private readonly opts: InformerOptions<T> = {}) {
    this.keep = opts.cacheTransform ?? ((o) => o);
    this.reflector = new Reflector<T>(client, this, { ...opts, path });
    this.log = log.with({ informer: opts.name ?? path });
  }

  /** Adds a handler; if the cache is already synced, it first gets onAdd for every cached object. */
  addEventHandler(h: EventHandler<T>): () => void {
    if (this.synced && this.opts.cacheTransform) {
      throw new Error(`informer ${this.opts.name ?? this.path}: handlers must be added before it syncs`);
    }
    this.handlers.push(h);
    if (this.synced && h.onAdd) {
      for (const obj of this.cache.values()) this.call(h, "onAdd", () => h.onAdd!(obj, true));
    }
    return () => {
      const i = this.handlers.indexOf(h);
      if (i >= 0) this.handlers.splice(i, 1);
    };
  }

  /** True once the first list has been delivered to the handlers. */
  hasSynced(): boolean {
    return this.synced;
  }

  /** Runs `cb` once synced (at once if already synced). */
  onSynced(cb: () => void): void {
    if (this.synced) cb();
    else this.syncedCallbacks.push(cb);
  }

  /** Resolves true when synced, or false if `signal` aborts first. */
  waitForSync(signal?: AbortSignal): Promise<boolean> {
    if (this.synced) return Promise.resolve(true);
    return new Promise((resolve) => {
      const onAbort = () => resolve(false);
      if (signal?.aborted) return resolve(false);
      signal?.addEventListener("abort", onAbort, { once: true });
      this.syncedCallbacks.push(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve(true);
      });
    });
  }

  /** All cached objects. */
  list(): T[] {
    return [...this.cache.values()];
  }

  /** Cached object by key (`namespace/name` or `name`). */
  get(key: string): T | undefined {
    return this.cache.get(key);
  }

  /** Number of cached objects. */
  get size(): number {
    return this.cache.size;
  }

  /** resourceVersion of the last list, event or bookmark. */
  get lastResourceVersion(): string {
    return this.reflector.lastResourceVersion;
  }

  /** Starts list/watch (and resync) in the background; stops when `signal` aborts or on {@link stop}. */
  start(signal?: AbortSignal): void {
    if (this.running) return;
    this.controller = new AbortController();
    const ctl = this.controller;
    if (signal) {
      if (signal.aborted) ctl.abort();
      else signal.addEventListener("abort", () => ctl.abort(), { once: true });
    }
    this.running = this.reflector.run(ctl.signal).catch((e) => this.log.error("Reflector stopped", e));
  }

  /** Stops list/watch and resync; resolves when the loop has ended. */
  async stop(): Promise<void> {
    this.controller?.abort();
    await this.running;
    this.running = undefined;
  }

  /** Re-delivers every cached object as onUpdate(obj, obj) (the reflector calls it every resyncMs). */
  resync(): void {
    if (!this.synced) return;
    for (const obj of this.cache.values()) this.dispatch("onUpdate", (h) => h.onUpdate?.(obj, obj));
  }

  // ReflectorStore

  /** @internal Replaces the cache with a list result, emitting only the differences. */
  replace(items: T[], rv: string, historyReset = false): void {
    const s = this.beginReplace(historyReset);
    for (const obj of items) s.add(obj);
    s.end(rv);
  }

  /**
   * @internal A list delivered item by item (what {@link replace} does at once): each item is cached (in its
   * kept form) and dispatched as it comes; `end` removes what the list did not have and marks the cache synced.
   */
  beginReplace(historyReset = false): { add(obj: T): void; end(rv: string): void } {
    const initial = !this.synced;
    const seen = new Set<string>();
    return {
      add: (obj: T) => {
        stripManagedFields(obj);
        const key = objectKey(obj);
        seen.add(key);
        const old = this.cache.get(key);
        this.cache.set(key, this.keep(obj));
        if (!old) this.dispatch("onAdd", (h) => h.onAdd?.(obj, initial));
        else if (historyReset || old.metadata?.resourceVersion !== obj.metadata?.resourceVersion) {
          // After a history reset every object is delivered as an update: handlers drop the no-op ones.
          this.dispatch("onUpdate", (h) => h.onUpdate?.(old, obj));
        }
      },
      end: (_rv: string) => this.endReplace(seen),
    };
  }

  private endReplace(seen: Set<string>): void {
    if (this.cache.size !== seen.size) {
      for (const [key, old] of this.cache) {
        if (seen.has(key)) continue;
        this.cache.delete(key);
        this.dispatch("onDelete", (h) => h.onDelete?.(old));
      }
    }
    if (!this.synced) {
      this.synced = true;
      this.log.v(2).info("Caches populated", { objects: this.cache.size });
      const cbs = this.syncedCallbacks.splice(0);
      for (const cb of cbs) {
        try {
          cb();
        } catch (e) {
          this.log.error("onSynced callback failed", e);
        }
      }
    }
  }

  /** @internal */
  upsert(obj: T): void {
    stripManagedFields(obj);
    const key = objectKey(obj);
    const old = this.cache.get(key);
    this.cache.set(key, this.keep(obj));
    if (old) this.dispatch("onUpdate", (h) => h.onUpdate?.(old, obj));
    else this.dispatch("onAdd", (h) => h.onAdd?.(obj, false));
  }

  /** @internal */
  remove(obj: T): void {
    stripManagedFields(obj);
    const key = objectKey(obj);
    const old = this.cache.get(key);
    this.cache.delete(key);
    this.dispatch("onDelete", (h) => h.onDelete?.(old ?? obj));
  }

  private dispatch(what: string, f: (h: EventHandler<T>) => void): void {
    for (const h of this.handlers) this.call(h, what, () => f(h));
  }

  private call(_h: EventHandler<T>, what: string, f: () => void): void {
    try {
      f();
    } catch (e) {
      this.log.error("Event handler failed", e, { handler: what });
    }
  }
}

/** kube-proxy's label selector for Services: not opted out to another proxy. */
export const SERVICE_LABEL_SELECTOR = `!${LABEL_SERVICE_PROXY_NAME}`;
/** kube-proxy's label selector for EndpointSlices: not a headless Service's. */
export const ENDPOINTSLICE_LABEL_SELECTOR = `!${LABEL_HEADLESS}`;
/** kube-proxy's field selector for Services: no headless services. */
export const SERVICE_FIELD_SELECTOR = "spec.clusterIP!=None";

/** Services kube-proxy handles: `/api/v1/services`, label and field selectors as upstream. */
export function newServiceInformer(
  client: KubeClient,
  opts: InformerOptions<Service> = {},
): Informer<Service> {
  return new Informer<Service>(client, "/api/v1/services", {
    name: "services",
    labelSelector: SERVICE_LABEL_SELECTOR,
    fieldSelector: SERVICE_FIELD_SELECTOR,
    ...opts,
  });
}

/** EndpointSlices kube-proxy handles: `/apis/discovery.k8s.io/v1/endpointslices`, not headless Services'. */
export function newEndpointSliceInformer(
  client: KubeClient,
  opts: InformerOptions<EndpointSlice> = {},
): Informer<EndpointSlice> {
  return new Informer<EndpointSlice>(client, "/apis/discovery.k8s.io/v1/endpointslices", {
    name: "endpointslices",
    labelSelector: ENDPOINTSLICE_LABEL_SELECTOR,
    ...opts,
  });
}

/**
 * ServiceCIDRs (`/apis/networking.k8s.io/v1/servicecidrs`), all of them (v1.37 watches them through its
 * unfiltered informer factory); watched since MultiCIDRServiceAllocator went GA (v1.33).
 */
export function newServiceCIDRInformer(
  client: KubeClient,
  opts: InformerOptions = {},
): Informer<ServiceCIDR> {
  return new Informer<ServiceCIDR>(client, "/apis/networking.k8s.io/v1/servicecidrs", {
    name: "servicecidrs",
    ...opts,
  });
}

/** This node only: `/api/v1/nodes` with `fieldSelector=metadata.name=<nodeName>`. */
export function newNodeInformer(
  client: KubeClient,
  nodeName: string,
  opts: InformerOptions<Node> = {},
): Informer<Node> {
  return new Informer<Node>(client, "/api/v1/nodes", {
    name: "nodes",
    fieldSelector: `metadata.name=${nodeName}`,
    ...opts,
  });
}
