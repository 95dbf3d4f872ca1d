/**
 * Watch decoding and informer memory.
 *
 * `deno bench --allow-all bench/watch_bench.ts`: decodes 100 000 Service watch events (about 600 bytes each,
 * 5 000 distinct objects, one third ADDED and two thirds MODIFIED) from an in-memory stream cut into 64 KiB
 * chunks, through the same `decodeWatchStream` the client uses, alone and into an Informer cache.
 *
 * `deno run --allow-all --v8-flags=--expose-gc bench/watch_bench.ts [n]`: heap held per cached Service
 * (n objects, default 20 000), and decode throughput measured by hand (events/s, median of 5).
 * @module
 */

import { decodeWatchStream } from "../lib/kube/client.ts";
import { Informer } from "../lib/kube/informer.ts";
import type { KubeClient } from "../lib/kube/client.ts";
import type { Service } from "../lib/kube/types.ts";
import { configureLogging } from "../lib/log.ts";

configureLogging({ sink: () => {} });

const EVENTS = 100_000;
const DISTINCT = 5_000;

function service(i: number, rv: number): Service {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: {
      name: `svc-${i}`,
      namespace: `ns-${i % 50}`,
      uid: `8a4c${String(i).padStart(8, "0")}-1b2c-4d5e-8f90-a1b2c3d4e5f6`,
      resourceVersion: String(rv),
      creationTimestamp: "2025-01-01T00:00:00Z",
      labels: { app: `app-${i}`, "app.kubernetes.io/part-of": "bench" },
    },
    spec: {
      type: "ClusterIP",
      clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
      clusterIPs: [`10.96.${(i >> 8) & 255}.${i & 255}`],
      ipFamilies: ["IPv4"],
      ipFamilyPolicy: "SingleStack",
      ports: [
        { name: "http", port: 80, protocol: "TCP", targetPort: 8080 },
        { name: "https", port: 443, protocol: "TCP", targetPort: 8443 },
      ],
      selector: { app: `app-${i}` },
      sessionAffinity: "None",
      internalTrafficPolicy: "Cluster",
    },
    status: { loadBalancer: {} },
  };
}

/** 100k NDJSON watch lines, as one byte array. */
function makeStream(): Uint8Array {
  const lines: string[] = [];
  for (let k = 0; k < EVENTS; k++) {
    const i = k % DISTINCT;
    const type = k < DISTINCT || k % 3 === 0 ? "ADDED" : "MODIFIED";
    lines.push(JSON.stringify({ type, object: service(i, 1000 + k) }));
  }
  return new TextEncoder().encode(lines.join("\n") + "\n");
}

const BYTES = makeStream();
const CHUNK = 64 * 1024;

function body(): ReadableStreamDefaultReader<Uint8Array> {
  let off = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (off >= BYTES.length) return c.close();
      c.enqueue(BYTES.subarray(off, off + CHUNK));
      off += CHUNK;
    },
  }).getReader();
}

async function decodeOnly(): Promise<number> {
  let n = 0;
  for await (const _ev of decodeWatchStream<Service>(body())) n++;
  if (n !== EVENTS) throw new Error(`decoded ${n}`);
  return n;
}

async function decodeIntoInformer(): Promise<number> {
  const inf = new Informer<Service>({} as KubeClient, "/api/v1/services");
  let handled = 0;
  inf.addEventHandler({ onAdd: () => handled++, onUpdate: () => handled++ });
  inf.replace([], "1");
  for await (const ev of decodeWatchStream<Service>(body())) inf.upsert(ev.object);
  if (handled !== EVENTS || inf.size !== DISTINCT) throw new Error(`handled ${handled}, size ${inf.size}`);
  return handled;
}

if (import.meta.main) {
  // Hand-run mode: throughput (median of 5) and memory per cached object.
  const mb = (BYTES.length / 1e6).toFixed(1);
  for (const [name, f] of [["decode", decodeOnly], ["decode+informer", decodeIntoInformer]] as const) {
    const rates: number[] = [];
    for (let r = 0; r < 5; r++) {
      const t0 = performance.now();
      await f();
      rates.push(EVENTS / ((performance.now() - t0) / 1000));
    }
    rates.sort((a, b) => a - b);
    console.log(
      `${name}: ${EVENTS} events (${mb} MB), median ${Math.round(rates[2])} events/s (min ${
        Math.round(rates[0])
      }, max ${Math.round(rates[4])})`,
    );
  }
  const n = Number(Deno.args[0] ?? 20_000);
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) console.log("(run with --v8-flags=--expose-gc for memory figures)");
  else {
    const json = Array.from({ length: n }, (_, i) => JSON.stringify(service(i, i + 1)));
    const bytes = json.reduce((a, s) => a + s.length, 0) / n;
    gc();
    gc();
    const before = Deno.memoryUsage().heapUsed;
    const inf = new Informer<Service>({} as KubeClient, "/api/v1/services");
    inf.replace(json.map((s) => JSON.parse(s)), "1");
    gc();
    gc();
    const after = Deno.memoryUsage().heapUsed;
    console.log(
      `memory: ${n} cached Services hold ${((after - before) / 1e6).toFixed(1)} MB of heap, ${
        Math.round((after - before) / n)
      } bytes per object (JSON ${Math.round(bytes)} bytes); rss ${
        (Deno.memoryUsage().rss / 1e6).toFixed(0)
      } MB`,
    );
    if (inf.size !== n) throw new Error("size");
  }
} else {
  Deno.bench({ name: "decode 100k Service watch events", n: 10, warmup: 2 }, async () => {
    await decodeOnly();
  });
  Deno.bench(
    { name: "decode 100k events into an Informer cache (5k objects)", n: 10, warmup: 2 },
    async () => {
      await decodeIntoInformer();
    },
  );
}
