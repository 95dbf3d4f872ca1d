/**
 * The proxy health server (upstream `pkg/proxy/healthcheck/proxy_health.go`): `/healthz` and `/livez`
 * on `healthzBindAddress` (default `0.0.0.0:10256`).
 *
 * A family is unhealthy when an update was queued (`queuedUpdate`) and not applied (`updated`) within
 * `healthTimeoutMs` (2 × syncPeriod). `/healthz` also requires the Node to be eligible (known, not being
 * deleted, not tainted ToBeDeletedByClusterAutoscaler); `/livez` does not.
 * @module
 */
import type { Node } from "../kube/types.ts";
import { type Clock, realClock } from "../proxy/clock.ts";
import { nodeEligible } from "../proxy/node_manager.ts";
import type { IPFamily, ProxyHealthUpdater } from "../proxy/types.ts";
import { type BindOptions, SingleListenerServer } from "./listen.ts";
import { proxyHealthzTotal, proxyLivezTotal } from "../metrics.ts";

/** Go's JSON encoding of a `time.Time` in UTC (RFC 3339 with trimmed fraction); ms 0 gives Go's zero time. */
export function goTimeJSON(ms: number | null): string {
  if (ms === null) return "0001-01-01T00:00:00Z";
  const iso = new Date(ms).toISOString(); // 2026-01-01T00:00:00.120Z
  return iso.replace(/\.(\d*?)0*Z$/, (_m, frac: string) => (frac ? `.${frac}Z` : "Z"));
}

/** Health of one family's proxier. */
export interface ProxierHealth {
  lastUpdated: number | null;
  healthy: boolean;
}

/** Health of the whole proxy, as upstream's `ProxyHealth`. */
export interface ProxyHealth {
  /** Latest update over all families (ms), null when never. */
  lastUpdated: number | null;
  currentTime: number;
  healthy: boolean;
  status: Map<IPFamily, ProxierHealth>;
}

/** Options of {@linkcode ProxyHealthServer}. */
export interface ProxyHealthServerOptions extends BindOptions {
  /** 2 × syncPeriod. */
  healthTimeoutMs: number;
  /** The own Node (from the NodeManager); no getter means the node is always eligible. */
  getNode?: () => Node | undefined;
}

/** Serves /healthz and /livez and keeps the per-family update times. */
export class ProxyHealthServer extends SingleListenerServer implements ProxyHealthUpdater {
  readonly #clock: Clock;
  readonly #lastUpdated = new Map<IPFamily, number>();
  readonly #oldestPendingQueued = new Map<IPFamily, number>();

  constructor(private readonly opts: ProxyHealthServerOptions) {
    super("healthz", opts);
    this.#clock = opts.clock ?? realClock;
  }

  updated(family: IPFamily): void {
    this.#oldestPendingQueued.delete(family);
    this.#lastUpdated.set(family, this.#clock.now());
  }

  queuedUpdate(family: IPFamily): void {
    if (!this.#oldestPendingQueued.has(family)) this.#oldestPendingQueued.set(family, this.#clock.now());
  }

  /** Upstream `Health()`: a family is unhealthy when its oldest queued update is older than the timeout. */
  health(): ProxyHealth {
    const now = this.#clock.now();
    const status = new Map<IPFamily, ProxierHealth>();
    let lastUpdated: number | null = null;
    let healthy = true;
    for (const [family, last] of this.#lastUpdated) {
      if (lastUpdated === null || last > lastUpdated) lastUpdated = last;
      const queued = this.#oldestPendingQueued.get(family);
      const late = queued !== undefined && now - queued >= this.opts.healthTimeoutMs;
      if (late) healthy = false;
      status.set(family, { lastUpdated: last, healthy: !late });
    }
    return { lastUpdated, currentTime: now, healthy, status };
  }

  isHealthy(): boolean {
    return this.health().healthy;
  }

  /** Node eligibility for /healthz. */
  nodeEligible(): boolean {
    return this.opts.getNode ? nodeEligible(this.opts.getNode()) : true;
  }

  /** Handles one request (exposed for tests without sockets). */
  handle(req: Request): Response {
    const path = new URL(req.url).pathname;
    if (path !== "/healthz" && path !== "/livez") {
      return new Response("404 page not found\n", { status: 404 });
    }
    const h = this.health();
    const isHealthz = path === "/healthz";
    const eligible = isHealthz ? this.nodeEligible() : true;
    const ok = h.healthy && eligible;
    const counter = isHealthz ? proxyHealthzTotal : proxyLivezTotal;
    counter.inc({ code: ok ? "200" : "503" });
    // Older releases reported the last sync-loop run even when nothing changed; upstream keeps that by
    // reporting "now" while healthy.
    const lastUpdated = ok ? h.currentTime : h.lastUpdated;
    const body: Record<string, unknown> = {
      lastUpdated: goTimeJSON(lastUpdated),
      currentTime: goTimeJSON(h.currentTime),
    };
    if (isHealthz) body.nodeEligible = eligible;
    body.healthy = h.healthy;
    if (h.status.size > 0) {
      const status: Record<string, unknown> = {};
      for (const f of [...h.status.keys()].sort()) {
        const s = h.status.get(f)!;
        status[f] = { lastUpdated: goTimeJSON(s.lastUpdated), healthy: s.healthy };
      }
      body.status = status;
    }
    return new Response(JSON.stringify(body), {
      status: ok ? 200 : 503,
      headers: { "Content-Type": "application/json", "X-Content-Type-Options": "nosniff" },
    });
  }
}
