/**
 * The metrics server on `metricsBindAddress` (default `127.0.0.1:10249`): `/metrics` (Prometheus text
 * exposition of every `kubeproxy_*` metric), `/healthz` (a plain "ok" ping) and `/proxyMode` (the mode
 * string), as upstream's `serveMetrics`.
 * @module
 */
import type { Clock } from "../proxy/clock.ts";
import { RetryingListener, splitHostPort } from "./listen.ts";
import { registry } from "./metrics.ts";

/** Options of {@linkcode MetricsServer}. */
export interface MetricsServerOptions {
  /** `host:port`; port 0 picks a free port (tests). */
  bindAddress: string;
  /** The proxy mode served on /proxyMode ("iptables", "nftables", "ipvs"). */
  mode: string;
  bindAddressHardFail?: boolean;
  /** Called when binding fails and bindAddressHardFail is set (main.ts emits FailedToStartMetricServer). */
  onFatal?: (err: Error) => void;
  clock?: Clock;
}

/** Serves /metrics, /healthz and /proxyMode. */
export class MetricsServer {
  readonly #listener: RetryingListener;

  constructor(private readonly opts: MetricsServerOptions) {
    const { hostname, port } = splitHostPort(opts.bindAddress);
    this.#listener = new RetryingListener({
      name: "metrics",
      hostname,
      port,
      handler: (req) => this.handle(req),
      hardFail: opts.bindAddressHardFail,
      onFatal: opts.onFatal,
      clock: opts.clock,
    });
  }

  /** Starts listening (bind failures are retried every 5 s unless hard-fail). */
  start(): void {
    this.#listener.start();
  }

  /** Resolves once bound. */
  get ready(): Promise<void> {
    return this.#listener.ready;
  }

  /** The bound port, null when not bound. */
  get port(): number | null {
    return this.#listener.port;
  }

  /** Closes the listener. */
  stop(): Promise<void> {
    return this.#listener.stop();
  }

  /** Handles one request (exposed for tests without sockets). */
  async handle(req: Request): Promise<Response> {
    switch (new URL(req.url).pathname) {
      case "/metrics":
        return new Response(await registry.metrics(), { headers: { "Content-Type": registry.contentType } });
      case "/healthz":
        return new Response("ok", { headers: { "Content-Type": "text/plain; charset=utf-8" } });
      case "/proxyMode":
        return new Response(this.opts.mode, { headers: { "Content-Type": "text/plain; charset=utf-8" } });
      default:
        return new Response("404 page not found\n", { status: 404 });
    }
  }
}
