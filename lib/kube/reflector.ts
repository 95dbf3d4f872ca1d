/**
 * List-then-watch loop for one resource, as client-go's Reflector.
 *
 * - The list is paginated (`limit`, default 500, then `continue`); the first list asks for
 *   `resourceVersion=0` (servable from the watch cache), a relist after 410 asks for a consistent read
 *   (`resourceVersion` unset), any other relist for the last resourceVersion seen.
 * - The watch starts from the list's resourceVersion with `allowWatchBookmarks=true` and a random
 *   `timeoutSeconds` in [minWatchTimeout, 2*minWatchTimeout) (300-600 s as client-go).
 * - A clean end of the stream re-watches from the last resourceVersion seen (bookmarks included), no list.
 * - 410 Gone/Expired (HTTP, or an ERROR event with code 410) gives exactly one relist; so does a 504
 *   "Too large resource version" (the server is behind us: restored from a backup, or replaced), with no
 *   resourceVersion, as client-go does.
 * - Network errors, 5xx, 429, 401/403 and an inactive (half-open) stream back off exponentially with jitter
 *   (800 ms doubling to 30 s by default), then re-watch; a malformed line is logged and answered by a relist.
 * @module
 */

import { log, type Logger } from "../log.ts";
import type { KubeObject, Status } from "./types.ts";
import {
  KubeApiError,
  type KubeClient,
  type Query,
  WatchDecodeError,
  WatchInactivityError,
} from "./client.ts";

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
}

/** Exponential backoff settings. */
export interface BackoffOptions {
  /** First delay (default 800 ms). */
  initialMs?: number;
  /** Cap (default 30 000 ms). */
  maxMs?: number;
  /** Growth factor (default 2). */
  factor?: number;
  /** Random extra fraction of the delay, 0..1 (default 1, as client-go). */
  jitter?: number;
}

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
  /** Name for logs (default the path). */
  name?: string;
}

/** Exponential backoff with jitter. */
export class Backoff {
  private attempt = 0;
  private readonly o: Required<BackoffOptions>;

  constructor(o: BackoffOptions = {}) {
    this.o = { initialMs: 800, maxMs: 30_000, factor: 2, jitter: 1, ...o };
  }

  /** The next delay in ms. */
  next(): number {
    const base = Math.min(this.o.maxMs, this.o.initialMs * this.o.factor ** this.attempt);
    this.attempt++;
    return Math.min(this.o.maxMs, base + base * this.o.jitter * Math.random());
  }

  /** Back to the initial delay. */
  reset(): void {
    this.attempt = 0;
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

/** Runs list/watch for one resource into a {@link ReflectorStore}. */
export class Reflector<T extends KubeObject> {
  /** resourceVersion of the last list, event or bookmark. */
  lastResourceVersion = "";
  /** Counters, for tests and metrics. */
  readonly counts = { lists: 0, watches: 0, events: 0, bookmarks: 0, errors: 0 };
  private readonly log: Logger;
  private readonly backoff: Backoff;

  constructor(
    private readonly client: KubeClient,
    private readonly store: ReflectorStore<T>,
    private readonly opts: ReflectorOptions,
  ) {
    this.log = log.with({ reflector: opts.name ?? opts.path });
    this.backoff = new Backoff(opts.backoff);
  }

  private selectors(): Query {
    return { labelSelector: this.opts.labelSelector, fieldSelector: this.opts.fieldSelector };
  }

  /** Lists and watches until `signal` aborts. Never throws for API or network errors. */
  async run(signal: AbortSignal): Promise<void> {
    let needList = true;
    let listRv = "0";
    let historyReset = false;
    while (!signal.aborted) {
      try {
        if (needList) {
          await this.listAll(listRv, signal, historyReset);
          needList = false;
          historyReset = false;
          this.backoff.reset();
        }
        const started = performance.now();
        const got = await this.watchOnce(signal);
        if (signal.aborted) break;
        if (got > 0) this.backoff.reset();
        else if (performance.now() - started < 1000) {
          // The server closed an empty watch at once: do not spin.
          await sleep(this.backoff.next(), signal);
        }
      } catch (e) {
        if (signal.aborted) break;
        this.counts.errors++;
        if (isExpired(e)) {
          this.log.info("Watch or list expired (410), relisting", {
            resourceVersion: this.lastResourceVersion,
          });
          needList = true;
          listRv = "";
          continue;
        }
        if (isTooLargeResourceVersion(e)) {
          this.log.info("API server is behind our resourceVersion (restored or replaced?), relisting", {
            resourceVersion: this.lastResourceVersion,
          });
          needList = true;
          listRv = "";
          historyReset = true;
          continue;
        }
        if (e instanceof WatchDecodeError) {
          this.log.error("Malformed watch event, relisting", e, {});
          needList = true;
          listRv = this.lastResourceVersion || "0";
          await sleep(this.backoff.next(), signal);
          continue;
        }
        const delay = this.backoff.next();
        if (e instanceof KubeApiError && (e.code === 401 || e.code === 403)) {
          this.log.error("API server refused access; will retry", e, { retryInMs: Math.round(delay) });
        } else if (e instanceof WatchInactivityError) {
          this.log.warn("Watch stream went silent, reconnecting", { err: e, retryInMs: Math.round(delay) });
        } else if (e instanceof KubeApiError) {
          this.log.warn(needList ? "List failed, retrying" : "Watch failed, retrying", {
            err: e,
            code: e.code,
            retryInMs: Math.round(delay),
          });
        } else {
          this.log.warn(needList ? "List failed, retrying" : "Watch connection failed, retrying", {
            err: e,
            retryInMs: Math.round(delay),
          });
        }
        await sleep(delay, signal);
      }
    }
  }

  private async listAll(rv: string, signal: AbortSignal, historyReset = false): Promise<void> {
    this.counts.lists++;
    // Items go to the store as they are decoded when it takes them so (bounded memory), else all at the end.
    const session = this.store.beginReplace?.(historyReset);
    const items: T[] = [];
    const onItem = session ? (it: T) => session.add(it) : (it: T) => void items.push(it);
    let n = 0;
    let cont: string | undefined;
    let listRv = "";
    const limit = this.opts.pageSize ?? 500;
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
      listRv = page.metadata?.resourceVersion ?? listRv;
    } while (cont && !signal.aborted);
    if (signal.aborted) return;
    this.log.v(2).info("Listed", { items: n, resourceVersion: listRv });
    this.lastResourceVersion = listRv;
    if (session) session.end(listRv);
    else this.store.replace(items, listRv, historyReset);
  }

  /** One watch; returns the number of events (including bookmarks) when the stream ends cleanly. */
  private async watchOnce(signal: AbortSignal): Promise<number> {
    this.counts.watches++;
    const min = this.opts.minWatchTimeoutSeconds ?? 300;
    const timeoutSeconds = Math.floor(min * (1 + Math.random()));
    const inactivityMs = this.opts.inactivityMs ??
      timeoutSeconds * 1000 + (this.opts.inactivityMarginMs ?? 30_000);
    let n = 0;
    const stream = this.client.watch<T>(
      this.opts.path,
      {
        ...this.selectors(),
        resourceVersion: this.lastResourceVersion,
        allowWatchBookmarks: "true",
        timeoutSeconds,
      },
      signal,
      { inactivityMs },
    );
    for await (const ev of stream) {
      n++;
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
}
