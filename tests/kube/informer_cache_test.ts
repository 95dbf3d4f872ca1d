/**
 * Informers with a cacheTransform (what the agent uses for Services and EndpointSlices): the cache keeps only
 * identities while handlers get whole objects on adds and updates; relist-found deletions, resyncs and the old
 * object of an update are the kept forms.
 */
import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import {
  keepEndpointSliceIdentity,
  keepServiceIdentity,
  newEndpointSliceInformer,
  newServiceInformer,
} from "../../lib/kube/informer.ts";
import type { EndpointSlice, Service } from "../../lib/kube/types.ts";
import { FAST, slice, svc, waitFor } from "./helpers.ts";

Deno.test("informer cacheTransform: handlers get whole objects, the cache and resyncs only identities", async () => {
  const sim = await ApiServerSimulator.start({ bookmarkIntervalMs: 0 });
  const client = new KubeClient({ server: sim.url, source: "test" }, { qps: 0 });
  const inf = newEndpointSliceInformer(client, {
    ...FAST,
    resyncMs: 40,
    cacheTransform: keepEndpointSliceIdentity,
  });
  const seen: { what: string; old?: EndpointSlice; obj: EndpointSlice }[] = [];
  inf.addEventHandler({
    onAdd: (obj) => seen.push({ what: "add", obj }),
    onUpdate: (old, obj) => seen.push({ what: old === obj ? "resync" : "update", old, obj }),
    onDelete: (obj) => seen.push({ what: "delete", obj }),
  });
  try {
    sim.upsert("endpointslices", slice("ns", "web", "web-1"));
    inf.start();
    await inf.waitForSync();
    assert.equal(seen[0].what, "add");
    assert.equal(seen[0].obj.endpoints?.length, 1, "the handler got the whole slice");
    const kept = inf.get("ns/web-1")!;
    assert.deepEqual(kept, {
      metadata: {
        name: "web-1",
        namespace: "ns",
        resourceVersion: sim.get("endpointslices", "ns", "web-1")!.metadata!.resourceVersion,
        labels: { "kubernetes.io/service-name": "web" },
      },
      addressType: "IPv4",
    });

    const changed = slice("ns", "web", "web-1");
    changed.endpoints![0].addresses = ["10.0.0.99"];
    sim.upsert("endpointslices", changed);
    await waitFor(() => seen.some((e) => e.what === "update"), "update");
    const up = seen.find((e) => e.what === "update")!;
    assert.equal(up.obj.endpoints![0].addresses![0], "10.0.0.99", "new: whole object");
    assert.equal(up.old!.endpoints, undefined, "old: the kept identity");

    // A resync after the update (one may also come between the first sync and the update, every 40 ms, with
    // the kept object of that time: on a loaded machine the update can take longer than a resync period).
    const afterUpdate = seen.indexOf(up);
    await waitFor(() => seen.some((e, i) => i > afterUpdate && e.what === "resync"), "resync");
    const rs = seen.find((e, i) => i > afterUpdate && e.what === "resync")!;
    assert.equal(rs.obj, inf.get("ns/web-1"), "a resync re-delivers the kept object, as (kept, kept)");

    assert.throws(() => inf.addEventHandler({}), /before it syncs/);
  } finally {
    await inf.stop();
    client.close();
    await sim.close();
  }
});

Deno.test("informer cacheTransform: a deletion found by a relist is delivered as the kept identity", async () => {
  const sim = await ApiServerSimulator.start({ bookmarkIntervalMs: 0 });
  const client = new KubeClient({ server: sim.url, source: "test" }, { qps: 0 });
  const inf = newServiceInformer(client, { ...FAST, cacheTransform: keepServiceIdentity });
  const deleted: Service[] = [];
  inf.addEventHandler({ onDelete: (o) => deleted.push(o) });
  try {
    sim.upsert("services", svc("ns", "a"));
    sim.upsert("services", svc("ns", "b"));
    inf.start();
    await inf.waitForSync();
    // The deletion happens while the watch is down and its history is gone: only a relist can find it.
    await inf.stop();
    sim.delete("services", "ns", "b");
    sim.compact();
    inf.start();
    await waitFor(() => deleted.length === 1, "relist-found deletion");
    assert.deepEqual(deleted[0], {
      metadata: { name: "b", namespace: "ns", resourceVersion: deleted[0].metadata!.resourceVersion },
    });
    assert.equal(inf.size, 1);
  } finally {
    await inf.stop();
    client.close();
    await sim.close();
  }
});
