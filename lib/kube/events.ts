/**
 * Posts events.k8s.io/v1 Events as upstream kube-proxy's recorder does (client-go tools/events):
 * reportingController `kube-proxy`, reportingInstance `kube-proxy-<hostname>`, event names
 * `<object>.<hex nanoseconds>`, e.g. `recorder.event(nodeRef(name), "Normal", "Starting", "StartKubeProxy")`.
 *
 * Repeats of the same event (same object, type, reason, action and note) within 6 minutes become a series:
 * the first Event is patched with `series: {count, lastObservedTime}` instead of posting a new one. Events
 * are rate limited per object by a token bucket (burst 25, one per 5 minutes after that, as client-go's
 * spam filter); dropped ones are logged at -v=2. A failure to post is logged and never thrown.
 * @module
 */

import { log } from "../log.ts";
import type { KubeEvent } from "./types.ts";
import type { KubeClient } from "./client.ts";
import { TokenBucket } from "./rate_limiter.ts";
import { isDNS1123Label, isDNS1123Subdomain } from "./validation.ts";

/** The object an Event is about. */
export interface ObjectRef {
  kind: string;
  apiVersion?: string;
  name: string;
  namespace?: string;
  uid?: string;
}

/** Options of {@link EventRecorder}. */
export interface EventRecorderOptions {
  /** reportingController (default "kube-proxy"). */
  reportingController?: string;
  /** Host name used in reportingInstance (default Deno.hostname()). */
  hostname?: string;
  /** Per-object rate: burst (default 25) and tokens per second (default 1/300). */
  burst?: number;
  qps?: number;
  /** Window in which a repeat joins the series of the first event (default 6 minutes). */
  seriesWindowMs?: number;
  /** Clock (tests). */
  now?: () => Date;
}

/** The reference upstream kube-proxy uses for its Node (uid = node name). */
export function nodeRef(nodeName: string): ObjectRef {
  return { kind: "Node", apiVersion: "v1", name: nodeName, uid: nodeName };
}

interface Series {
  name: string;
  namespace: string;
  count: number;
  first: number;
}

/**
 * The object's name when it is a valid DNS-1123 subdomain short enough for `<name>.<hex ns>`, else
 * `invalid-name-<fnv-1a hex of the name>` (a valid name that still tells such objects apart).
 */
function eventNamePrefix(name: string): string {
  if (name.length <= 253 - 17 && isDNS1123Subdomain(name).length === 0) return name;
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) {
    h ^= name.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return `invalid-name-${h.toString(16).padStart(8, "0")}`;
}

function microTime(d: Date): string {
  return d.toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
}

/** Records Events to the API server without ever blocking or throwing. */
export class EventRecorder {
  /** reportingController. */
  readonly controller: string;
  /** reportingInstance: `<controller>-<hostname>`. */
  readonly instance: string;
  private readonly buckets = new Map<string, TokenBucket>();
  private readonly series = new Map<string, Series>();
  private chain: Promise<void> = Promise.resolve();
  private readonly now: () => Date;
  private seq = 0;
  private lastMs = 0;
  private readonly windowMs: number;
  /** Counters: posted, patched (series), dropped (rate limit), failed. */
  readonly counts = { posted: 0, patched: 0, dropped: 0, failed: 0 };

  constructor(private readonly client: KubeClient, private readonly opts: EventRecorderOptions = {}) {
    this.controller = opts.reportingController ?? "kube-proxy";
    let host = opts.hostname;
    if (!host) {
      try {
        host = Deno.hostname();
      } catch {
        host = "unknown";
      }
    }
    this.instance = `${this.controller}-${host}`;
    this.now = opts.now ?? (() => new Date());
    this.windowMs = opts.seriesWindowMs ?? 6 * 60_000;
  }

  /** Records an event (`type` Normal or Warning); returns at once, the post happens in the background. */
  event(regarding: ObjectRef, type: "Normal" | "Warning", reason: string, action: string, note = ""): void {
    const objKey = `${regarding.kind}/${regarding.namespace ?? ""}/${regarding.name}`;
    let bucket = this.buckets.get(objKey);
    if (!bucket) {
      bucket = new TokenBucket(this.opts.qps ?? 1 / 300, this.opts.burst ?? 25);
      this.buckets.set(objKey, bucket);
    }
    if (!bucket.tryTake()) {
      this.counts.dropped++;
      log.v(2).info("Event dropped by the rate limiter", { object: objKey, reason });
      return;
    }
    const t = this.now();
    const key = `${objKey}\x00${type}\x00${reason}\x00${action}\x00${note}`;
    this.chain = this.chain.then(() => this.send(key, regarding, type, reason, action, note, t));
  }

  /** Resolves when every event recorded so far has been sent (or has failed). */
  flush(): Promise<void> {
    return this.chain;
  }

  private async send(
    key: string,
    regarding: ObjectRef,
    type: string,
    reason: string,
    action: string,
    note: string,
    t: Date,
  ): Promise<void> {
    try {
      const s = this.series.get(key);
      if (s && t.getTime() - s.first < this.windowMs) {
        s.count++;
        await this.client.patch(
          `/apis/events.k8s.io/v1/namespaces/${encodeURIComponent(s.namespace)}/events/${
            encodeURIComponent(s.name)
          }`,
          { series: { count: s.count, lastObservedTime: microTime(t) } },
        );
        this.counts.patched++;
        return;
      }
      // An Event about an object the API would have refused (a hostile name or namespace) must itself be valid:
      // its own name and namespace then fall back to a valid form; `regarding` keeps the object's as they are.
      const namespace = regarding.namespace && isDNS1123Label(regarding.namespace).length === 0
        ? regarding.namespace
        : "default";
      // Nanoseconds as upstream; a counter keeps names unique within one millisecond.
      this.seq = t.getTime() === this.lastMs ? this.seq + 1 : 0;
      this.lastMs = t.getTime();
      const ns = BigInt(t.getTime()) * 1_000_000n + BigInt(this.seq);
      const ev: KubeEvent = {
        apiVersion: "events.k8s.io/v1",
        kind: "Event",
        metadata: { name: `${eventNamePrefix(regarding.name)}.${ns.toString(16)}`, namespace },
        eventTime: microTime(t),
        reportingController: this.controller,
        reportingInstance: this.instance,
        action,
        reason,
        regarding: { ...regarding },
        note,
        type,
      };
      await this.client.create(
        `/apis/events.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/events`,
        ev,
      );
      this.counts.posted++;
      this.series.set(key, { name: ev.metadata!.name!, namespace, count: 1, first: t.getTime() });
      for (const [k, v] of this.series) if (t.getTime() - v.first >= this.windowMs) this.series.delete(k);
    } catch (e) {
      this.counts.failed++;
      log.warn("Could not write event", { err: e, reason, object: `${regarding.kind}/${regarding.name}` });
    }
  }
}
