/**
 * This agent's runtime metrics, under its own `denokubeproxy_` prefix (upstream's `go_*` families describe
 * the Go runtime and have no equivalent here): V8's heap used and total, memory V8 accounts as external
 * (array buffers and other off-heap allocations), the event loop's delay, and the Deno/V8 versions.
 * @module
 */
import client from "prom-client";
import { COMPONENT_REGISTRIES } from "../metrics.ts";

/** `denokubeproxy_v8_heap_used_bytes`: V8's heap in use (`Deno.memoryUsage().heapUsed`). */
export const v8HeapUsed = new client.Gauge({
  name: "denokubeproxy_v8_heap_used_bytes",
  help: "Bytes of the V8 heap in use (Deno.memoryUsage().heapUsed)",
  registers: COMPONENT_REGISTRIES,
  collect() {
    this.set(Deno.memoryUsage().heapUsed);
  },
});

/** `denokubeproxy_v8_heap_total_bytes`: V8's heap reserved (`Deno.memoryUsage().heapTotal`). */
export const v8HeapTotal = new client.Gauge({
  name: "denokubeproxy_v8_heap_total_bytes",
  help: "Bytes of the V8 heap allocated (Deno.memoryUsage().heapTotal)",
  registers: COMPONENT_REGISTRIES,
  collect() {
    this.set(Deno.memoryUsage().heapTotal);
  },
});

/** `denokubeproxy_v8_external_memory_bytes`: memory outside the heap held by V8 objects. */
export const v8External = new client.Gauge({
  name: "denokubeproxy_v8_external_memory_bytes",
  help: "Bytes of memory outside the V8 heap held by JavaScript objects (Deno.memoryUsage().external)",
  registers: COMPONENT_REGISTRIES,
  collect() {
    this.set(Deno.memoryUsage().external);
  },
});

/** `denokubeproxy_runtime_info{deno_version,v8_version,typescript_version}`: constant 1. */
export const runtimeInfo = new client.Gauge({
  name: "denokubeproxy_runtime_info",
  help:
    "A metric with a constant '1' value labeled by the Deno, V8 and TypeScript versions the agent runs on",
  labelNames: ["deno_version", "v8_version", "typescript_version"] as const,
  registers: COMPONENT_REGISTRIES,
});
runtimeInfo.set({
  deno_version: Deno.version.deno,
  v8_version: Deno.version.v8,
  typescript_version: Deno.version.typescript,
}, 1);

/** `denokubeproxy_event_loop_delay_seconds`: how late the monitor's timer fired. */
export const eventLoopDelay = new client.Histogram({
  name: "denokubeproxy_event_loop_delay_seconds",
  help: "How late a timer due every 100 ms ran, in seconds: the time the event loop was busy elsewhere",
  buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  registers: COMPONENT_REGISTRIES,
});

/** The event loop monitor's period (ms). */
export const EVENT_LOOP_PERIOD_MS = 100;

/**
 * Starts the event loop monitor: a timer due every {@linkcode EVENT_LOOP_PERIOD_MS} observes how late it
 * ran (it does not keep the process alive). Returns its stop function.
 */
export function startEventLoopMonitor(
  observe: (s: number) => void = (s) => eventLoopDelay.observe(s),
): () => void {
  let due = performance.now() + EVENT_LOOP_PERIOD_MS;
  let timer: ReturnType<typeof setTimeout>;
  let stopped = false;
  const tick = () => {
    const now = performance.now();
    observe(Math.max(0, now - due) / 1000);
    if (stopped) return;
    due = now + EVENT_LOOP_PERIOD_MS;
    timer = setTimeout(tick, EVENT_LOOP_PERIOD_MS);
    Deno.unrefTimer(timer);
  };
  timer = setTimeout(tick, EVENT_LOOP_PERIOD_MS);
  Deno.unrefTimer(timer);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
