/**
 * The metrics server on `metricsBindAddress` (default `127.0.0.1:10249`): `/metrics` (Prometheus text
 * exposition of the core `kubeproxy_*` metrics and the running mode's, as upstream registers them), `/healthz` (a plain "ok" ping) and `/proxyMode` (the mode
 * string), as upstream's `serveMetrics`.
 * @module
 */
import { type BindOptions, SingleListenerServer } from "./listen.ts";
import { registerMetrics, registry } from "../metrics.ts";
import type { ZPages } from "./zpages.ts";

/** Options of {@linkcode MetricsServer}. */
export interface MetricsServerOptions extends BindOptions {
  /** The proxy mode served on /proxyMode ("iptables", "nftables", "ipvs"). */
  mode: string;
  /** `/configz`, `/flagz` and `/statusz` (upstream v1.37 serves them on this listener). */
  zpages?: ZPages;
}

/** Serves /metrics, /healthz and /proxyMode. */
export class MetricsServer extends SingleListenerServer {
  constructor(private readonly opts: MetricsServerOptions) {
    super("metrics", opts);
    registerMetrics(opts.mode);
  }

  /** Handles one request (exposed for tests without sockets). */
  async handle(req: Request): Promise<Response> {
    const z = this.opts.zpages?.handle(req);
    if (z) return z;
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
