/**
 * List-then-watch loop for one resource, as client-go's Reflector (tools/cache/reflector.go, v0.35), with
 * its timing:
 *
 * - `run` is client-go's `wait.BackoffUntil(ListAndWatch, backoffManager, sliding=true)`: every time
 *   list-and-watch returns (an error, a watch that ended with an error, a 410), the loop waits the next
 *   backoff step before it lists again. The backoff is `NewExponentialBackoffManager(800ms, 30s, 2m, 2.0,
 *   1.0)`: 0.8, 1.6, 3.2 ... 25.6 s then 30 s, each multiplied by a random factor in [1, 2) (so the
 *   waits stop at [30, 60) s, as client-go's comment says), and back to 0.8 s when the previous wait began
 *   more than 2 minutes ago. Success does not reset it; only those 2 quiet minutes do.
 * - The list is paginated (`limit`, default 500, then `continue`); it asks for `resourceVersion=0` while
 *   nothing has been seen yet, then for the last resourceVersion seen. A relist at a resourceVersion other
 *   than 0 goes without `limit` (unless `pageSize` is set or the first list came in pages), as client-go's
 *   pager: with a limit the API server would read that exact, possibly compacted, revision from etcd
 *   instead of answering from its watch cache at least as fresh, and a watch from that old revision after
 *   an API server restart is 410 again, for ever. A list answered 410 Expired or "Too
 *   large resource version" (the server is behind us: restored from a backup, or replaced) is repeated at
 *   once without a resourceVersion (a consistent read); the latter is a history reset for the store.
 * - The watch starts from the last resourceVersion with `allowWatchBookmarks=true` and a random
 *   `timeoutSeconds` in [minWatchTimeout, 2*minWatchTimeout) (300-600 s as client-go). A stream that ends
 *   (timeout, closed or broken connection, silent for longer than its inactivity limit) is re-watched at
 *   once from the last resourceVersion, no list; one that ends within a second without a single event is a
 *   "very short watch" and goes back through the backoff and a list.
 * - A watch request refused at the TCP level, or answered 429, waits one backoff step and re-watches
 *   without listing (client-go's isWatchErrorRetriable); so does a 429 ERROR event in the stream.
 * - Any other watch failure (an HTTP error such as 500 or 401/403, a 410, an ERROR event, a malformed
 *   line) ends list-and-watch: backoff, then list again.
 * - While a watch runs, `resyncMs` (the informer's resync period) re-delivers the store's objects; the
 *   timer starts again with every list-and-watch, as client-go's watchWithResync.
 * - With `useWatchList` (client-go's WatchListClient gate, v0.37's watchList), the initial state comes from a
 *   watch-list stream instead of a list: a WATCH from the last resourceVersion (none at first: a consistent
 *   read) with `sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`, `allowWatchBookmarks=true`,
 *   whose ADDED events are the state, ended by a BOOKMARK annotated `k8s.io/initial-events-end: "true"`; the
 *   store is replaced at that bookmark's resourceVersion and the same stream goes on as the watch. Before the
 *   bookmark: a refused connection or a 429 waits a backoff step and streams again; 410 or "too large" streams
 *   again without a resourceVersion; a stream that ends (or breaks) streams again, unless it lasted under a
 *   second with no event; any other error (e.g. an API server that rejects the parameters) falls back to
 *   list + watch for this round, as client-go does.
 * @module
 */

import { log, type Logger } from "../log.ts";
import type { KubeObject, Status, WatchEvent } from "./types.ts";
import {
  KubeApiError,
  type KubeClient,
  type Query,
  WatchDecodeError,
  WatchInactivityError,
} from "./client.ts";
import { ApiConnectionError } from "./net_errors.ts";

/** Receives what the reflector learns; the Informer implements it. */
export interface ReflectorStore<T> {
  /**
   * The full state from a (re)list, and its resourceVersion. `historyReset` says the server's
   * resourceVersions started over (restored or replaced): equal resourceVersions then prove nothing.
   */
  replace(items: T[], resourceVersion: string, historyReset?: boolean): void;
  /**
   * Optional: a (re)list delivered item by item, so that the items need not be held all at once. `add` is
   * called for every item as it is decoded, `end` once the list is complete (what `replace` does with all of
   * them). A list that fails half-way is simply not ended; the next list starts over.
   */
  beginReplace?(historyReset: boolean): { add(obj: T): void; end(resourceVersion: string): void };
  /** ADDED or MODIFIED from the watch. */
  upsert(obj: T): void;
  /** DELETED from the watch (the object's last state). */
  remove(obj: T): void;
  /** Every `resyncMs` while watching: re-deliver the cached objects. */
  resync?(): void;
}

/** Exponential backoff settings (client-go's NewExponentialBackoffManager arguments). */
export interface BackoffOptions {
  /** First delay (default 800 ms). */
  initialMs?: number;
  /** Cap of the delay before jitter (default 30 000 ms). */
  maxMs?: number;
  /** Growth factor (default 2). */
  factor?: number;
  /** Random extra fraction of the delay, 0..1 (default 1: the delay times [1, 2)). */
  jitter?: number;
  /** Back to `initialMs` when the previous step was taken longer ago than this (default 120 000 ms). */
  resetMs?: number;
}

/** Time for the reflector: a monotonic clock in ms and an abortable sleep. Tests use a fake one. */
export interface ReflectorClock {
  now(): number;
  /** Resolves after `ms`, or at once when `signal` aborts. */
  sleep(ms: number, signal: AbortSignal): Promise<void>;
}

/** The real clock: performance.now() and setTimeout. */
export const realClock: ReflectorClock = { now: () => performance.now(), sleep };

/** Options of {@link Reflector}. */
export interface ReflectorOptions {
  /** Collection path, e.g. `/api/v1/services`. */
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  /** List page size (default 500). */
  pageSize?: number;
  /** Minimum watch timeoutSeconds (default 300; the actual value is random in [min, 2*min)). */
  minWatchTimeoutSeconds?: number;
  /** Extra silence tolerated past timeoutSeconds before a stream counts as half-open (default 30 000 ms). */
  inactivityMarginMs?: number;
  /** Overrides the inactivity timeout entirely (ms). */
  inactivityMs?: number;
  backoff?: BackoffOptions;
  /** Resync period while watching, in ms (configSyncPeriod); 0 or unset: never. */
  resyncMs?: number;
  /** Clock (tests inject a fake one). */
  clock?: ReflectorClock;
  /** Random numbers in [0, 1) for jitter and watch timeouts (tests inject them). */
  random?: () => number;
  /** Name for logs (default the path). */
  name?: string;
  /** Initial state by watch-list streams (client-go's WatchListClient); default false: list + watch. */
  useWatchList?: boolean;
  /**
   * The `Accept` header of watches (default: the client's, JSON), e.g. `PROTOBUF_WATCH_ACCEPT` for a kind
   * `lib/kube/protobuf.ts` decodes. Lists stay JSON, gzip-compressed and decoded item by item as they arrive
   * (`lib/kube/list_decoder.ts`).
   */
  watchAccept?: string;
}

/** The annotation of the bookmark that ends a watch-list stream's initial events. */
export const INITIAL_EVENTS_END_ANNOTATION = "k8s.io/initial-events-end";

/** A watch stream already open (a watch-list after its initial events), with what it has delivered. */
interface OpenWatch<T extends KubeObject> {
  stream: AsyncGenerator<WatchEvent<T>>;
  start: number;
  events: number;
}

/**
 * client-go's exponential backoff manager (apimachinery wait.NewExponentialBackoffManager with
 * wait.Backoff{Duration: initial, Factor, Jitter, Cap, Steps: MaxInt32}): each step returns the current
 * duration with jitter (`d + rand*jitter*d`) and multiplies the duration by the factor until it would pass
 * the cap, after which the cap (with jitter) is returned for ever. A step taken more than `resetMs` after
 * the previous one starts again from the initial duration.
 */
export class Backoff {
  private readonly o: Required<BackoffOptions>;
  private duration: number;
  private capped = false;
  private lastStart: number;

  constructor(
    o: BackoffOptions = {},
    private readonly clock: Pick<ReflectorClock, "now"> = realClock,
    private readonly random: () => number = Math.random,
  ) {
    this.o = { initialMs: 800, maxMs: 30_000, factor: 2, jitter: 1, resetMs: 120_000, ...o };
    this.duration = this.o.initialMs;
    this.lastStart = clock.now();
  }

  /** The next delay in ms. */
  next(): number {
    const now = this.clock.now();
    if (now - this.lastStart > this.o.resetMs) {
      this.duration = this.o.initialMs;
      this.capped = false;
    }
    this.lastStart = now;
    const d = this.duration;
    if (!this.capped && this.o.factor !== 0) {
      let next = d * this.o.factor;
      if (this.o.maxMs > 0 && next > this.o.maxMs) {
        next = this.o.maxMs;
        this.capped = true;
      }
      this.duration = next;
    }
    return this.o.jitter > 0 ? d + this.random() * this.o.jitter * d : d;
  }
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

function isExpired(e: unknown): boolean {
  return e instanceof KubeApiError && (e.code === 410 || e.reason === "Expired" || e.reason === "Gone");
}

/**
 * The API server has not reached the resourceVersion asked for: it was restored from an older etcd backup,
 * or replaced. client-go then relists with no resourceVersion; re-watching from ours would never converge.
 */
function isTooLargeResourceVersion(e: unknown): boolean {
  if (!(e instanceof KubeApiError)) return false;
  const causes = (e.status as { details?: { causes?: { reason?: string }[] } } | undefined)?.details?.causes;
  return causes?.some((c) => c.reason === "ResourceVersionTooLarge") === true ||
    /too large resource version/i.test(e.message);
}

/** A watch that ended within a second without any event (client-go's VeryShortWatchError). */
export class VeryShortWatchError extends Error {
  constructor(name: string) {
    super(
      `very short watch: ${name}: Unexpected watch close - watch lasted less than a second and no items received`,
    );
    this.name = "VeryShortWatchError";
  }
}

/** A failed list, named as client-go's "failed to list <type>: <cause>". */
export class ListError extends Error {
  constructor(name: string, cause: unknown) {
    super(`failed to list ${name}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = "ListError";
  }
}

/** client-go's isWatchErrorRetriable: re-watch after a backoff step, without a list. */
function isWatchRetriable(e: unknown): boolean {
  return (e instanceof ApiConnectionError && e.kind === "refused") ||
    (e instanceof KubeApiError && e.code === 429);
}

/** Runs list/watch for one resource into a {@link ReflectorStore}. */
export class Reflector<T extends KubeObject> {
  /** resourceVersion of the last list, event or bookmark. */
  lastResourceVersion = "";
  /** Counters, for tests and metrics. */
  readonly counts = {
    lists: 0,
    watches: 0,
    watchLists: 0,
    /** Watch-list streams the server answered gzip-compressed. */
    gzipWatchLists: 0,
    events: 0,
    bookmarks: 0,
    errors: 0,
    resyncs: 0,
  };
  private readonly log: Logger;
  private readonly backoff: Backoff;
  private readonly clock: ReflectorClock;
  private readonly random: () => number;
  private readonly name: string;
  /** The last resourceVersion cannot be served (410 or too large on a list): list without one. */
  private rvUnavailable = false;
  /** The first list (resourceVersion=0) came in pages: the server ignores the watch cache, keep paging. */
  private paginatedResult = false;
  /** A watch-list was answered "too large resource version": the next replace is a history reset. */
  private historyResetPending = false;

  constructor(
    private readonly client: KubeClient,
    private readonly store: ReflectorStore<T>,
    private readonly opts: ReflectorOptions,
  ) {
    this.name = opts.name ?? opts.path;
    this.log = log.with({ reflector: this.name });
    this.clock = opts.clock ?? realClock;
    this.random = opts.random ?? Math.random;
    this.backoff = new Backoff(opts.backoff, this.clock, this.random);
  }

  private selectors(): Query {
    return { labelSelector: this.opts.labelSelector, fieldSelector: this.opts.fieldSelector };
  }

  /** Waits the next backoff step; `announce` gets its length (ms, rounded) first. */
  private async wait(signal: AbortSignal, announce?: (ms: number) => void): Promise<void> {
    const ms = this.backoff.next();
    announce?.(Math.round(ms));
    await this.clock.sleep(ms, signal);
  }

  /** Lists and watches until `signal` aborts. Never throws for API or network errors. */
  async run(signal: AbortSignal): Promise<void> {
    this.log.v(3).info("Starting reflector", { resyncPeriod: this.opts.resyncMs ?? 0 });
    // Ends when `signal` aborts even if a stream's read does not settle on the abort (seen with watch-list
    // streams of a few thousand objects on kube-apiserver v1.37: the agent did not exit on SIGTERM).
    const aborted = new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      else signal.addEventListener("abort", () => resolve(), { once: true });
    });
    while (!signal.aborted) {
      try {
        await Promise.race([this.listAndWatch(signal), aborted]);
      } catch (e) {
        if (signal.aborted) break;
        this.counts.errors++;
        this.watchErrorHandler(e);
      }
      if (signal.aborted) break;
      // wait.BackoffUntil with sliding=true: a backoff step after every return of list-and-watch.
      await this.wait(signal, (ms) => this.log.v(2).info("Listing again after backoff", { retryInMs: ms }));
    }
    this.log.v(3).info("Stopping reflector");
  }

  /** client-go's DefaultWatchErrorHandler: how an error that ended list-and-watch is logged. */
  private watchErrorHandler(e: unknown): void {
    const cause = e instanceof ListError ? e.cause : e;
    if (isExpired(cause)) {
      this.log.v(4).info("Watch closed", { err: e });
    } else if (cause instanceof KubeApiError && (cause.code === 401 || cause.code === 403)) {
      this.log.error("Failed to watch: the API server refused access", e);
    } else {
      this.log.error("Failed to watch", e);
    }
  }

  /** One ListAndWatch: list, then watch (re-watching after clean ends) until a watch fails. */
  private async listAndWatch(signal: AbortSignal): Promise<void> {
    let first: OpenWatch<T> | undefined;
    if (this.opts.useWatchList) {
      try {
        first = await this.watchList(signal);
      } catch (e) {
        if (signal.aborted) return;
        this.log.v(4).info(
          "Data couldn't be fetched in watchlist mode. Falling back to regular list. This is expected if watchlist is not supported or disabled in kube-apiserver.",
          { err: e },
        );
      }
      if (signal.aborted) return;
    }
    if (!first) {
      try {
        await this.list(signal);
      } catch (e) {
        throw new ListError(this.name, e);
      }
    }
    if (signal.aborted) return;
    this.log.v(2).info("Caches populated");
    const resync = new AbortController();
    const onAbort = () => resync.abort();
    signal.addEventListener("abort", onAbort, { once: true });
    const resyncMs = this.opts.resyncMs ?? 0;
    if (resyncMs > 0) void this.resyncLoop(resyncMs, resync.signal);
    try {
      await this.watch(signal, first);
    } finally {
      signal.removeEventListener("abort", onAbort);
      resync.abort();
    }
  }

  private async resyncLoop(ms: number, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.clock.sleep(ms, signal);
      if (signal.aborted) return;
      this.log.v(4).info("Forcing resync");
      this.counts.resyncs++;
      try {
        this.store.resync?.();
      } catch (e) {
        this.log.error("Resync failed", e);
      }
    }
  }

  /** The resourceVersion a list asks for (client-go's relistResourceVersion). */
  private relistResourceVersion(): string {
    if (this.rvUnavailable) return "";
    return this.lastResourceVersion || "0";
  }

  private async list(signal: AbortSignal): Promise<void> {
    try {
      await this.listAll(this.relistResourceVersion(), signal, false);
    } catch (e) {
      if (signal.aborted) return;
      const tooLarge = isTooLargeResourceVersion(e);
      if (!isExpired(e) && !tooLarge) throw e;
      // The resourceVersion is gone (compacted) or the server is behind it (restored or replaced): list
      // again at once, without one. After "too large" every object is new history.
      this.rvUnavailable = true;
      this.log.info(
        tooLarge
          ? "API server is behind our resourceVersion (restored or replaced?), relisting"
          : "List resourceVersion expired, relisting",
        { resourceVersion: this.lastResourceVersion },
      );
      await this.listAll("", signal, tooLarge);
    }
    this.rvUnavailable = false;
  }

  /**
   * Watches until a watch fails in a way that needs a new list (returns, or throws for the error
   * handler), re-watching after streams that end cleanly.
   */
  private async watch(signal: AbortSignal, first?: OpenWatch<T>): Promise<void> {
    while (!signal.aborted) {
      const start = first?.start ?? this.clock.now();
      let opened = first !== undefined;
      let events = first?.events ?? 0;
      const stream = first?.stream;
      first = undefined;
      try {
        await this.watchOnce(signal, () => opened = true, () => events++, stream);
      } catch (e) {
        if (signal.aborted) return;
        if (!opened && isWatchRetriable(e)) {
          this.counts.errors++;
          // Connection refused or 429 on the request: most likely the API server is down or busy; the
          // watch can resume where it ended, so back off and watch again without a list. client-go logs
          // this at V(4); we warn, with the cause, so that an operator sees why no updates arrive.
          await this.wait(
            signal,
            (ms) => this.log.warn("Watch failed - backing off", { err: e, retryInMs: ms }),
          );
          continue;
        }
        if (!opened) throw e;
        if (isExpired(e)) {
          this.log.v(4).info("Watch closed", { err: e });
          return;
        }
        if (e instanceof KubeApiError && e.code === 429) {
          this.counts.errors++;
          this.log.v(2).info("Watch returned 429 - backing off");
          await this.wait(signal);
          continue;
        }
        if (e instanceof WatchInactivityError) {
          // Silent for longer than timeoutSeconds plus a margin (a half-open connection): watch again.
          this.log.warn("Watch stream went silent, reconnecting", { err: e });
          continue;
        }
        if (e instanceof ApiConnectionError) {
          // The stream broke: like a closed stream, watch again from where it stopped.
          this.log.v(2).info("Watch stream ended", { err: e });
        } else {
          // An ERROR event (e.g. 500) or a malformed line: back off, then list again.
          this.counts.errors++;
          this.log.warn("Warning: watch ended with error", { err: e });
          return;
        }
      }
      if (signal.aborted) return;
      if (events === 0 && this.clock.now() - start < 1000) throw new VeryShortWatchError(this.name);
    }
  }

  private async listAll(rv: string, signal: AbortSignal, historyReset: boolean): Promise<void> {
    this.counts.lists++;
    // Items go to the store as they are decoded when it takes them so (bounded memory), else all at the end.
    const session = this.store.beginReplace?.(historyReset);
    const items: T[] = [];
    const onItem = session ? (it: T) => session.add(it) : (it: T) => void items.push(it);
    let n = 0;
    let cont: string | undefined;
    let listRv = "";
    const limit = this.opts.pageSize ??
      (this.paginatedResult || rv === "" || rv === "0" ? 500 : 0);
    do {
      const page = await this.client.listStream<T>(
        this.opts.path,
        {
          ...this.selectors(),
          limit: limit > 0 ? limit : undefined,
          continue: cont,
          resourceVersion: cont ? undefined : rv,
        },
        signal,
        (it) => {
          n++;
          onItem(it);
        },
      );
      cont = page.metadata?.continue || undefined;
      if (cont && rv === "0") this.paginatedResult = true;
      listRv = page.metadata?.resourceVersion ?? listRv;
    } while (cont && !signal.aborted);
    if (signal.aborted) return;
    this.log.v(2).info("Listed", { items: n, resourceVersion: listRv });
    this.lastResourceVersion = listRv;
    if (session) session.end(listRv);
    else this.store.replace(items, listRv, historyReset);
  }

  /**
   * One watch from the last resourceVersion; returns the number of events (bookmarks included) when the
   * stream ends cleanly. `onOpen` runs once the server accepted the request, `onEvent` for every event.
   */
  private async watchOnce(
    signal: AbortSignal,
    onOpen: () => void,
    onEvent: () => void,
    open?: AsyncGenerator<WatchEvent<T>>,
  ): Promise<number> {
    let n = 0;
    const stream = open ?? this.openWatch({ resourceVersion: this.lastResourceVersion }, signal, onOpen);
    for await (const ev of stream) {
      n++;
      onEvent();
      const obj = ev.object;
      switch (ev.type) {
        case "ADDED":
        case "MODIFIED":
        case "DELETED": {
          const rv = obj.metadata?.resourceVersion;
          if (!obj.metadata?.name) throw new WatchDecodeError(JSON.stringify(ev).slice(0, 300));
          this.counts.events++;
          if (ev.type === "DELETED") this.store.remove(obj);
          else this.store.upsert(obj);
          if (rv) this.lastResourceVersion = rv;
          break;
        }
        case "BOOKMARK": {
          this.counts.bookmarks++;
          const rv = obj.metadata?.resourceVersion;
          if (rv) this.lastResourceVersion = rv;
          break;
        }
        case "ERROR": {
          const st = obj as Status;
          throw new KubeApiError(
            st.code ?? 500,
            st.reason ?? "Unknown",
            `watch ${this.opts.path}: ${st.code ?? ""} ${st.reason ?? ""}: ${st.message ?? ""}`,
            st,
          );
        }
        default:
          throw new WatchDecodeError(JSON.stringify(ev).slice(0, 300));
      }
    }
    return n;
  }

  /** Opens a watch (counted) with a random timeoutSeconds in [min, 2*min) and bookmarks allowed. */
  private openWatch(
    query: Query,
    signal: AbortSignal,
    onOpen: (opened: { encoding: string }) => void,
    compressed?: boolean,
  ): AsyncGenerator<WatchEvent<T>> {
    this.counts.watches++;
    const min = this.opts.minWatchTimeoutSeconds ?? 300;
    const timeoutSeconds = Math.floor(min * (1 + this.random()));
    const inactivityMs = this.opts.inactivityMs ??
      timeoutSeconds * 1000 + (this.opts.inactivityMarginMs ?? 30_000);
    return this.client.watch<T>(
      this.opts.path,
      { ...this.selectors(), ...query, allowWatchBookmarks: "true", timeoutSeconds },
      signal,
      {
        inactivityMs,
        onOpen,
        headers: this.opts.watchAccept ? { Accept: this.opts.watchAccept } : undefined,
        compressed,
      },
    );
  }

  /**
   * client-go's watchList: streams the initial state until the initial-events-end bookmark, replaces the store
   * with it, and returns the stream to go on watching with; undefined when `signal` aborted. Throws what
   * makes client-go fall back to a list.
   */
  private async watchList(signal: AbortSignal): Promise<OpenWatch<T> | undefined> {
    while (!signal.aborted) {
      const start = this.clock.now();
      let events = 0;
      let opened = false;
      this.counts.watchLists++;
      const historyReset = this.historyResetPending;
      // Objects go to the store as they are decoded when it takes them so; an unfinished session is dropped.
      const session = this.store.beginReplace?.(historyReset);
      const items: T[] = [];
      const stream = this.openWatch(
        {
          resourceVersion: this.rvUnavailable ? "" : this.lastResourceVersion,
          sendInitialEvents: "true",
          resourceVersionMatch: "NotOlderThan",
        },
        signal,
        ({ encoding }) => {
          opened = true;
          if (encoding === "gzip") this.counts.gzipWatchLists++;
        },
        // kube-apiserver v1.37 gzips a watch-list stream (WatchListCompression), as client-go asks; the client
        // reads it compressed where its configuration allows (see KubeClient.readsCompressedWatches).
        true,
      );
      let endRv: string | undefined;
      try {
        while (endRv === undefined) {
          const r = await stream.next();
          if (r.done) break;
          events++;
          const ev = r.value;
          const obj = ev.object;
          if (ev.type === "ADDED" || ev.type === "MODIFIED") {
            if (!obj.metadata?.name) throw new WatchDecodeError(JSON.stringify(ev).slice(0, 300));
            this.counts.events++;
            if (session) session.add(obj);
            else items.push(obj);
          } else if (ev.type === "BOOKMARK") {
            this.counts.bookmarks++;
            const annotations = obj.metadata?.annotations as Record<string, string> | undefined;
            if (annotations?.[INITIAL_EVENTS_END_ANNOTATION] === "true") {
              endRv = obj.metadata?.resourceVersion ?? "";
            }
          } else if (ev.type === "ERROR") {
            const st = obj as Status;
            throw new KubeApiError(
              st.code ?? 500,
              st.reason ?? "Unknown",
              `watch ${this.opts.path}: ${st.code ?? ""} ${st.reason ?? ""}: ${st.message ?? ""}`,
              st,
            );
          } else {
            // The initial events are ADDED only; a deletion before the bookmark cannot be applied to a
            // state being streamed: fall back to a list.
            throw new WatchDecodeError(JSON.stringify(ev).slice(0, 300));
          }
        }
      } catch (e) {
        await stream.return(undefined).catch(() => {});
        if (signal.aborted) return undefined;
        if (isWatchRetriable(e) && !(opened && e instanceof ApiConnectionError)) {
          this.counts.errors++;
          await this.wait(
            signal,
            (ms) => this.log.v(2).info("watch-list failed - backing off", { err: e, retryInMs: ms }),
          );
          continue;
        }
        const tooLarge = isTooLargeResourceVersion(e);
        if (isExpired(e) || tooLarge) {
          this.rvUnavailable = true;
          if (tooLarge) this.historyResetPending = true;
          continue;
        }
        // The stream broke or went silent after it opened: as a closed stream, stream again.
        if (opened && (e instanceof ApiConnectionError || e instanceof WatchInactivityError)) continue;
        throw e;
      }
      if (signal.aborted) {
        await stream.return(undefined).catch(() => {});
        return undefined;
      }
      if (endRv === undefined) {
        // Closed before the bookmark: stream again, unless it was a very short watch.
        if (events === 0 && this.clock.now() - start < 1000) throw new VeryShortWatchError(this.name);
        continue;
      }
      this.rvUnavailable = false;
      this.historyResetPending = false;
      this.log.v(2).info("Streamed", { items: session ? undefined : items.length, resourceVersion: endRv });
      this.lastResourceVersion = endRv;
      if (session) session.end(endRv);
      else this.store.replace(items, endRv, historyReset);
      return { stream, start, events };
    }
    return undefined;
  }
}
