/**
 * The API client's metrics, with client-go's names, types, buckets, labels and help
 * (`k8s.io/component-base/metrics/prometheus/restclient`, v0.37.2), measured where client-go measures them
 * (`k8s.io/client-go/rest/request.go`): the client-side rate limiter's wait, each request's latency and
 * sizes, each response's status code, and the exec credential plugin's calls and certificates.
 *
 * Not exported (no equivalent is measured, see docs/operations.md): `rest_client_request_retries_total`
 * (this client does not retry), `rest_client_dns_resolution_duration_seconds` (Deno's fetch does not
 * report its DNS lookups), `rest_client_transport_*` (client-go's transport cache; this client keeps one
 * connection pool per identity, no cache) and `rest_client_exec_plugin_policy_call_total` (no plugin
 * policy exists here).
 * @module
 */
import client from "prom-client";
import { X509Certificate } from "node:crypto";
import { COMPONENT_REGISTRIES } from "../metrics.ts";

/** client-go's latency buckets (seconds). */
const LATENCY_BUCKETS = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];
/** client-go's size buckets: 64 bytes to 16 MiB. */
const SIZE_BUCKETS = [64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216];

/** `rest_client_requests_total{code,method,host}`: one per response (code `<error>` without one). */
export const restClientRequestsTotal = new client.Counter({
  name: "rest_client_requests_total",
  help: "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
  labelNames: ["code", "method", "host"] as const,
  registers: COMPONENT_REGISTRIES,
});

/** `rest_client_request_duration_seconds{verb,host}`: a non-watch request, from sending to the body read. */
export const restClientRequestDuration = new client.Histogram({
  name: "rest_client_request_duration_seconds",
  help: "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
  labelNames: ["verb", "host"] as const,
  buckets: LATENCY_BUCKETS,
  registers: COMPONENT_REGISTRIES,
});

/** `rest_client_rate_limiter_duration_seconds{verb,host}`: the token bucket's wait of a non-watch request. */
export const restClientRateLimiterDuration = new client.Histogram({
  name: "rest_client_rate_limiter_duration_seconds",
  help: "[ALPHA] Client side rate limiter latency in seconds. Broken down by verb, and host.",
  labelNames: ["verb", "host"] as const,
  buckets: LATENCY_BUCKETS,
  registers: COMPONENT_REGISTRIES,
});

/** `rest_client_request_size_bytes{verb,host}`: the body sent by a non-watch request (0 without one). */
export const restClientRequestSize = new client.Histogram({
  name: "rest_client_request_size_bytes",
  help: "[ALPHA] Request size in bytes. Broken down by verb and host.",
  labelNames: ["verb", "host"] as const,
  buckets: SIZE_BUCKETS,
  registers: COMPONENT_REGISTRIES,
});

/** `rest_client_response_size_bytes{verb,host}`: the body received by a non-watch request. */
export const restClientResponseSize = new client.Histogram({
  name: "rest_client_response_size_bytes",
  help: "[ALPHA] Response size in bytes. Broken down by verb and host.",
  labelNames: ["verb", "host"] as const,
  buckets: SIZE_BUCKETS,
  registers: COMPONENT_REGISTRIES,
});

/** The soonest expiry (ms since the epoch) of an exec plugin's client certificate; undefined: none. */
let execCertExpiry: number | undefined;

/** `rest_client_exec_plugin_ttl_seconds`: seconds until the exec plugin's certificate expires, +Inf without. */
export const restClientExecPluginTTL = new client.Gauge({
  name: "rest_client_exec_plugin_ttl_seconds",
  help: "[ALPHA] Gauge of the shortest TTL (time-to-live) of the client certificate(s) managed by the auth " +
    "exec plugin. The value is in seconds until certificate expiry (negative if already expired). If auth " +
    "exec plugins are unused or manage no TLS certificates, the value will be +INF.",
  registers: COMPONENT_REGISTRIES,
  collect() {
    this.set(execCertExpiry === undefined ? Infinity : (execCertExpiry - Date.now()) / 1000);
  },
});

/** `rest_client_exec_plugin_certificate_rotation_age`: how long a rotated-out certificate had lived. */
export const restClientExecPluginRotationAge = new client.Histogram({
  name: "rest_client_exec_plugin_certificate_rotation_age",
  help: "[ALPHA] Histogram of the number of seconds the last auth exec plugin client certificate lived " +
    "before being rotated. If auth exec plugin client certificates are unused, histogram will contain no data.",
  buckets: [600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000],
  registers: COMPONENT_REGISTRIES,
});

/** `rest_client_exec_plugin_call_total{code,call_status}`: one per plugin run. */
export const restClientExecPluginCalls = new client.Counter({
  name: "rest_client_exec_plugin_call_total",
  help: "[ALPHA] Number of calls to an exec plugin, partitioned by the type of event encountered " +
    "(no_error, plugin_execution_error, plugin_not_found_error, client_internal_error) and an optional exit " +
    "code. The exit code will be set to 0 if and only if the plugin call was successful.",
  labelNames: ["code", "call_status"] as const,
  registers: COMPONENT_REGISTRIES,
});

/** How a plugin run ended, as client-go's exec metrics classify it. */
export type ExecCallStatus =
  | "no_error"
  | "plugin_execution_error"
  | "plugin_not_found_error"
  | "client_internal_error";

/** Counts one exec plugin run: exit code (0 only on success; 1 when the plugin did not run) and status. */
export function recordExecPluginCall(code: number, status: ExecCallStatus): void {
  restClientExecPluginCalls.inc({ code: String(code), call_status: status });
}

/**
 * Records the exec plugin's client certificate (PEM) after a run: its expiry feeds the TTL gauge, and when
 * it replaces a different one, the old one's age (since its notBefore) is observed as client-go does.
 */
export function recordExecCertificate(certPem: string | undefined, previousPem: string | undefined): void {
  if (certPem === undefined) return;
  const cert = new X509Certificate(certPem);
  execCertExpiry = Date.parse(cert.validTo);
  if (previousPem !== undefined && previousPem !== certPem) {
    const old = new X509Certificate(previousPem);
    restClientExecPluginRotationAge.observe((Date.now() - Date.parse(old.validFrom)) / 1000);
  }
}

/** The `host` label of a server URL: its host and port as written (client-go's `url.Host`). */
export function hostLabel(server: string): string {
  const rest = server.replace(/^[a-z][a-z0-9+.-]*:\/\//i, "");
  const end = rest.search(/[/?#]/);
  const host = end === -1 ? rest : rest.slice(0, end);
  return host.replace(/^[^@]*@/, "");
}

/** Forgets the exec certificate (tests). */
export function resetExecCertificate(): void {
  execCertExpiry = undefined;
}
