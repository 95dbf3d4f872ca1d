/**
 * EndpointSlice watches in protobuf against the real kube-apiserver v1.37.2 of the test kit: the same watch read
 * as JSON and as protobuf (KubeClient.watch with the Accept the agent sends) yields the same events, for slices of
 * every shape the proxy reads (both families and FQDN, conditions absent / false / true, hints, hostname, node,
 * zone, targetRef, ports without name or protocol, labels and annotations), through adds, an update and a delete.
 * @module
 */
import assert from "node:assert/strict";
import { KubeApiServer, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { newEndpointSliceInformer } from "../../lib/kube/informer.ts";
import { PROTOBUF_MEDIA_TYPE, PROTOBUF_WATCH_ACCEPT } from "../../lib/kube/protobuf.ts";
import type { EndpointSlice, KubeObject, WatchEvent } from "../../lib/kube/types.ts";

const ignore = kubeApiServerUnavailableReason() !== undefined;
const NS = "default";

function slice(name: string, addressType: string, extra: Partial<EndpointSlice>): EndpointSlice {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      name,
      namespace: NS,
      labels: {
        "kubernetes.io/service-name": "svc-" + name,
        "endpointslice.kubernetes.io/managed-by": "test",
      },
    },
    addressType,
    endpoints: [],
    ports: [],
    ...extra,
  };
}

const SLICES: EndpointSlice[] = [
  slice("full-v4", "IPv4", {
    metadata: {
      name: "full-v4",
      namespace: NS,
      labels: { "kubernetes.io/service-name": "svc", "a": "" },
      annotations: { "note": "x", "empty": "" },
    },
    endpoints: [
      {
        addresses: ["10.1.0.1"],
        conditions: { ready: true, serving: true, terminating: false },
        hostname: "pod-a",
        nodeName: "node-a",
        zone: "zone-a",
        hints: { forZones: [{ name: "zone-a" }, { name: "zone-b" }], forNodes: [{ name: "node-a" }] },
        targetRef: { kind: "Pod", namespace: NS, name: "pod-a", uid: "00000000-0000-0000-0000-000000000001" },
      },
      { addresses: ["10.1.0.2"], conditions: {} },
      { addresses: ["10.1.0.3"], conditions: { ready: false, serving: false, terminating: true } },
    ],
    ports: [
      { name: "http", protocol: "TCP", port: 8080, appProtocol: "http" },
      { name: "dns", protocol: "UDP", port: 53 },
      { protocol: "SCTP", port: 9 },
    ],
  }),
  slice("v6", "IPv6", {
    endpoints: [{ addresses: ["fd00::1"], conditions: { ready: true }, nodeName: "node-b" }],
    ports: [{ name: "", port: 80 }],
  }),
  slice("fqdn", "FQDN", { endpoints: [{ addresses: ["example.com"] }], ports: [{ name: "p", port: 443 }] }),
  slice("empty", "IPv4", { endpoints: [], ports: [] }),
];

/** The API server's own slice in `default` (its controller writes it at any time): not the test's. */
const ours = (o: KubeObject) => o.metadata?.name !== "kubernetes";

/** Events of the test's slices from `watch` into `into` until aborted. */
async function collect(watch: AsyncGenerator<WatchEvent<KubeObject>>, into: WatchEvent<KubeObject>[]) {
  try {
    for await (const ev of watch) if (ours(ev.object)) into.push(ev);
  } catch (e) {
    if (!(e instanceof Error) || !/abort/i.test(`${e.name} ${e.message}`)) throw e;
  }
}

/** What a JSON event carries that the protobuf decoder leaves out (fields the proxy never reads). */
function comparable(ev: WatchEvent<KubeObject>): unknown {
  const o = structuredClone(ev.object) as EndpointSlice & { metadata: Record<string, unknown> };
  for (const k of ["managedFields", "generateName", "selfLink", "ownerReferences", "finalizers"]) {
    delete o.metadata[k];
  }
  for (const e of o.endpoints ?? []) delete (e as Record<string, unknown>).deprecatedTopology;
  return { type: ev.type, object: o };
}

async function waitUntil(cond: () => boolean, what: string, ms: number) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

Deno.test({
  name: "protobuf watch on kube-apiserver: EndpointSlice events decode to exactly what the JSON watch yields",
  ignore,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    await using api = await KubeApiServer.start();
    const client = new KubeClient({
      server: api.localUrl,
      caPem: api.caPem,
      certPem: await Deno.readTextFile(`${api.dir}/admin.crt`),
      keyPem: await Deno.readTextFile(`${api.dir}/admin.key`),
      source: "test",
    }, { qps: 0 });
    const path = `/apis/discovery.k8s.io/v1/namespaces/${NS}/endpointslices`;
    try {
      // The server answers a protobuf Accept in protobuf (so the decoder below is what is being compared).
      const http = Deno.createHttpClient({
        caCerts: [api.caPem],
        cert: await Deno.readTextFile(`${api.dir}/admin.crt`),
        key: await Deno.readTextFile(`${api.dir}/admin.key`),
      });
      const ac = new AbortController();
      const res = await fetch(`${api.localUrl}${path}?watch=true&resourceVersion=0`, {
        client: http,
        headers: { Accept: PROTOBUF_WATCH_ACCEPT },
        signal: ac.signal,
      });
      assert.equal(res.headers.get("content-type"), `${PROTOBUF_MEDIA_TYPE};stream=watch`);
      ac.abort();
      await res.body?.cancel().catch(() => {});
      http.close();

      const rv = (await api.request<{ metadata: { resourceVersion: string } }>("GET", path)).metadata
        .resourceVersion;
      const stop = new AbortController();
      const json: WatchEvent<KubeObject>[] = [];
      const pb: WatchEvent<KubeObject>[] = [];
      const query = { resourceVersion: rv, timeoutSeconds: 120 };
      const done = Promise.all([
        collect(client.watch(path, query, stop.signal), json),
        collect(client.watch(path, query, stop.signal, { headers: { Accept: PROTOBUF_WATCH_ACCEPT } }), pb),
      ]);
      for (const s of SLICES) await api.create(s);
      const updated = await api.get<EndpointSlice>({
        apiVersion: "discovery.k8s.io/v1",
        kind: "EndpointSlice",
        namespace: NS,
        name: "v6",
      });
      updated.endpoints = [{ addresses: ["fd00::2"], conditions: { ready: false }, zone: "z" }];
      await api.update(updated);
      await api.remove(SLICES[3]);
      const want = SLICES.length + 2;
      await waitUntil(
        () => json.length >= want && pb.length >= want,
        `${want} events on both watches`,
        60_000,
      );
      stop.abort();
      await done;

      assert.deepEqual(json.map((e) => e.type), ["ADDED", "ADDED", "ADDED", "ADDED", "MODIFIED", "DELETED"]);
      assert.deepEqual(pb.map(comparable), json.map(comparable));
      // Spot checks that the comparison saw the interesting values.
      const full = pb[0].object as EndpointSlice;
      assert.deepEqual(full.endpoints?.[1].conditions, {});
      assert.equal(full.endpoints?.[2].conditions?.ready, false);
      assert.deepEqual(full.endpoints?.[0].hints?.forNodes, [{ name: "node-a" }]);
      assert.equal(full.metadata?.annotations?.["empty"], "");
      assert.equal(full.apiVersion, "discovery.k8s.io/v1");
      assert.equal(full.kind, "EndpointSlice");
    } finally {
      client.close();
    }
  },
});

for (const useWatchList of [false, true]) {
  Deno.test({
    name: `protobuf watch on kube-apiserver: the EndpointSlice informer (${
      useWatchList
        ? "watch-list: initial events and their end bookmark in protobuf"
        : "list, then a protobuf watch"
    }) syncs and follows changes`,
    ignore,
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      await using api = await KubeApiServer.start();
      for (const s of SLICES.slice(0, 2)) await api.create(s);
      const client = new KubeClient({
        server: api.localUrl,
        caPem: api.caPem,
        certPem: await Deno.readTextFile(`${api.dir}/admin.crt`),
        keyPem: await Deno.readTextFile(`${api.dir}/admin.key`),
        source: "test",
      }, { qps: 0 });
      const inf = newEndpointSliceInformer(client, {
        useWatchList,
        minWatchTimeoutSeconds: 60,
        watchAccept: PROTOBUF_WATCH_ACCEPT,
      });
      const seen: EndpointSlice[] = [];
      inf.addEventHandler({
        onAdd: (s) => seen.push(s),
        onUpdate: (_, s) => seen.push(s),
        onDelete: () => {},
      });
      inf.start();
      try {
        await waitUntil(() => inf.hasSynced(), "synced", 30_000);
        assert.deepEqual(inf.list().filter(ours).map((s) => s.metadata?.name).sort(), ["full-v4", "v6"]);
        assert.equal(inf.reflector.counts.lists, useWatchList ? 0 : 1);
        await api.create(SLICES[2]);
        await waitUntil(() => inf.list().filter(ours).length === 3, "the live add", 30_000);
        const fqdn = seen.find((s) => s.metadata?.name === "fqdn");
        assert.equal(fqdn?.addressType, "FQDN");
        assert.deepEqual(fqdn?.endpoints?.[0].addresses, ["example.com"]);
      } finally {
        await inf.stop();
        client.close();
      }
    },
  });
}
