/**
 * Shared helpers of the kube tests: quiet captured logging, polling, fast reflector settings, objects.
 * @module
 */

import { configureLogging } from "../../lib/log.ts";
import type { EndpointSlice, Node, Service } from "../../lib/kube/types.ts";
import type { InformerOptions } from "../../lib/kube/informer.ts";

/** Log lines captured during a test (logging is silenced). */
export const logLines: string[] = [];
configureLogging({ sink: (l) => logLines.push(l), verbosity: 0 });

/** Polls `cond` every 5 ms until true or `timeoutMs` passes (then throws with `what`). */
export async function waitFor(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!cond()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Sleeps ms. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Reflector settings that make tests run in milliseconds. */
export const FAST: InformerOptions = {
  backoff: { initialMs: 10, maxMs: 50, jitter: 0.2 },
  minWatchTimeoutSeconds: 30,
};

/** A ClusterIP Service. */
export function svc(ns: string, name: string, ip = "10.96.0.10", labels?: Record<string, string>): Service {
  return {
    metadata: { namespace: ns, name, labels },
    spec: {
      type: "ClusterIP",
      clusterIP: ip,
      clusterIPs: [ip],
      ports: [{ name: "http", port: 80, protocol: "TCP" }],
    },
  };
}

/** An EndpointSlice of a Service. */
export function slice(
  ns: string,
  service: string,
  name: string,
  ips: string[] = ["10.244.0.5"],
): EndpointSlice {
  return {
    metadata: { namespace: ns, name, labels: { "kubernetes.io/service-name": service } },
    addressType: "IPv4",
    endpoints: ips.map((ip) => ({ addresses: [ip], conditions: { ready: true } })),
    ports: [{ name: "http", port: 8080, protocol: "TCP" }],
  };
}

/** A Node. */
export function node(name: string, ip = "192.168.0.10"): Node {
  return { metadata: { name }, status: { addresses: [{ type: "InternalIP", address: ip }] } };
}
