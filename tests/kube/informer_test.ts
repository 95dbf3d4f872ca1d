import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import {
  type EventHandler,
  type Informer,
  newEndpointSliceInformer,
  newNodeInformer,
  newServiceCIDRInformer,
  newServiceInformer,
} from "../../lib/kube/informer.ts";
import type { KubeObject, Service } from "../../lib/kube/types.ts";
import { FAST, logLines, node, sleep, slice, svc, waitFor } from "./helpers.ts";

function recorder<T extends KubeObject>(): { events: string[]; handler: EventHandler<T> } {
  const events: string[] = [];
  return {
    events,
    handler: {
      onAdd: (o) => events.push(`add ${o.metadata?.namespace ?? ""}/${o.metadata?.name}`),
      onUpdate: (_old, o) => events.push(`update ${o.metadata?.namespace ?? ""}/${o.metadata?.name}`),
      onDelete: (o) => events.push(`delete ${o.metadata?.namespace ?? ""}/${o.metadata?.name}`),
    },
  };
}

async function setup(simOpts = {}) {
  const sim = await ApiServerSimulator.start({ token: "secret", ...simOpts });
  const client = new KubeClient({ server: sim.url, token: "secret", source: "test" }, { qps: 0 });
  return {
    sim,
    client,
    async [Symbol.asyncDispose]() {
      client.close();
      await sim.close();
    },
  };
}

Deno.test("informers: initial sync of services, endpointslices and the own node, with upstream selectors", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("default", "web"));
  sim.upsert("services", { ...svc("default", "headless"), spec: { clusterIP: "None" } });
  sim.upsert(
    "services",
    svc("default", "other-proxy", "10.96.0.11", { "service.kubernetes.io/service-proxy-name": "x" }),
  );
  sim.upsert("endpointslices", slice("default", "web", "web-abc"));
  const hs = slice("default", "headless", "headless-abc");
  hs.metadata!.labels!["service.kubernetes.io/headless"] = "";
  sim.upsert("endpointslices", hs);
  sim.upsert("nodes", node("node-a"));
  sim.upsert("nodes", node("node-b"));

  const svcs = newServiceInformer(client, FAST);
  const slices = newEndpointSliceInformer(client, FAST);
  const nodes = newNodeInformer(client, "node-a", FAST);
  const rec = recorder<Service>();
  svcs.addEventHandler(rec.handler);
  let synced = false;
  svcs.onSynced(() => synced = true);
  for (const i of [svcs, slices, nodes]) (i as Informer<KubeObject>).start();
  try {
    assert.equal(await svcs.waitForSync(), true);
    assert.equal(await slices.waitForSync(), true);
    assert.equal(await nodes.waitForSync(), true);
    assert.equal(synced, true);
    assert.deepEqual(svcs.list().map((s) => s.metadata?.name), ["web"]);
    assert.deepEqual(rec.events, ["add default/web"]);
    assert.deepEqual(slices.list().map((s) => s.metadata?.name), ["web-abc"]);
    assert.deepEqual(nodes.list().map((s) => s.metadata?.name), ["node-a"]);
    assert.ok(svcs.get("default/web"));
    assert.ok(nodes.get("node-a"));
    const q = sim.stats.listQueries.services[0];
    // v1.37's selectors: one label each (v1.35 put both on Services and EndpointSlices).
    assert.equal(q.get("labelSelector"), "!service.kubernetes.io/service-proxy-name");
    assert.equal(q.get("fieldSelector"), "spec.clusterIP!=None");
    const sq = sim.stats.listQueries.endpointslices[0];
    assert.equal(sq.get("labelSelector"), "!service.kubernetes.io/headless");
    assert.equal(sq.get("fieldSelector"), null);
    assert.equal(q.get("limit"), "500");
    assert.equal(sim.stats.listQueries.nodes[0].get("fieldSelector"), "metadata.name=node-a");
    await waitFor(() => sim.openWatches() === 3, "three watches");
    const wq = sim.stats.watchQueries.services[0];
    assert.equal(wq.get("allowWatchBookmarks"), "true");
    assert.equal(wq.get("resourceVersion"), svcs.lastResourceVersion);
    const t = Number(wq.get("timeoutSeconds"));
    assert.ok(t >= 30 && t < 60, `timeoutSeconds ${t}`);
    assert.match(
      [...sim.stats.userAgents][0],
      /^kube-proxy\/v[\d.]+ \(linux\/(amd64|arm64)\) deno-kube-proxy$/,
    );
  } finally {
    await Promise.all([svcs.stop(), slices.stop(), nodes.stop()]);
  }
});

Deno.test("informers: ServiceCIDRs are watched without a label selector, labelled ones included (v1.37)", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("servicecidrs", {
    apiVersion: "networking.k8s.io/v1",
    kind: "ServiceCIDR",
    metadata: { name: "labelled", labels: { "service.kubernetes.io/service-proxy-name": "x" } },
    spec: { cidrs: ["10.97.0.0/16"] },
  } as KubeObject);
  const cidrs = newServiceCIDRInformer(client, FAST);
  cidrs.start();
  try {
    assert.equal(await cidrs.waitForSync(), true);
    assert.deepEqual(cidrs.list().map((c) => c.metadata?.name), ["labelled"]);
    assert.equal(sim.stats.listQueries.servicecidrs[0].get("labelSelector"), null);
  } finally {
    await cidrs.stop();
  }
});

Deno.test("informer: add, update and delete propagate through the watch", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, FAST);
  const rec = recorder<Service>();
  inf.addEventHandler(rec.handler);
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.upsert("services", svc("ns", "b", "10.96.0.2"));
    sim.upsert("services", svc("ns", "a", "10.96.0.3"));
    sim.delete("services", "ns", "b");
    // becoming headless is a delete for a filtered watch
    sim.upsert("services", { ...svc("ns", "a"), spec: { clusterIP: "None" } });
    await waitFor(() => rec.events.length === 5, "5 events");
    assert.deepEqual(rec.events, ["add ns/a", "add ns/b", "update ns/a", "delete ns/b", "delete ns/a"]);
    assert.equal(inf.size, 0);
    assert.equal(sim.stats.lists("services"), 1);
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: a dropped watch resumes from the last resourceVersion without a new list", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, FAST);
  const rec = recorder<Service>();
  inf.addEventHandler(rec.handler);
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.upsert("services", svc("ns", "b"));
    await waitFor(() => inf.size === 2, "b");
    const rvBefore = inf.lastResourceVersion;
    sim.faults.dropWatches();
    sim.upsert("services", svc("ns", "c")); // happens while disconnected
    await waitFor(() => inf.size === 3, "c after reconnect");
    assert.equal(sim.stats.lists("services"), 1, "no new list");
    assert.ok(sim.stats.watches("services") >= 2);
    assert.equal(sim.stats.watchQueries.services.at(-1)!.get("resourceVersion"), rvBefore);
    // clean end of stream (timeoutSeconds) also re-watches without a list
    sim.faults.endWatches();
    sim.upsert("services", svc("ns", "d"));
    await waitFor(() => inf.size === 4, "d");
    assert.equal(sim.stats.lists("services"), 1);
    assert.deepEqual(rec.events, ["add ns/a", "add ns/b", "add ns/c", "add ns/d"]);
  } finally {
    await inf.stop();
  }
});

for (const expiredAs of ["event", "http"] as const) {
  Deno.test(`informer: 410 (${expiredAs}) gives exactly one relist and converges with deletes`, async () => {
    await using env = await setup({ expiredAs });
    const { sim, client } = env;
    for (const n of ["a", "b", "c"]) sim.upsert("services", svc("ns", n));
    const inf = newServiceInformer(client, FAST);
    const rec = recorder<Service>();
    inf.addEventHandler(rec.handler);
    inf.start();
    try {
      await inf.waitForSync();
      await waitFor(() => sim.openWatches() === 1, "watch");
      // An event first: a watch that ends within a second without any is a "very short watch", which
      // client-go (and we) answer with a list.
      sim.upsert("services", svc("ns", "c", "10.96.0.98"));
      await waitFor(() => inf.get("ns/c")?.spec?.clusterIP === "10.96.0.98", "event");
      const lastRv = inf.lastResourceVersion;
      // 429 keeps the watch down without a list (client-go backs off and re-watches); a 5xx would relist.
      sim.faults.failNext(1_000_000, 429, { kind: "watch" });
      sim.faults.dropWatches();
      await waitFor(() => sim.stats.count("watch") >= 3, "failing re-watches");
      assert.equal(sim.stats.lists("services"), 1, "no list while the watch is refused with 429");
      sim.delete("services", "ns", "a");
      sim.upsert("services", svc("ns", "b", "10.96.0.99"));
      sim.upsert("services", svc("ns", "d"));
      sim.compact();
      rec.events.length = 0;
      sim.faults.clear();
      await waitFor(() => rec.events.length === 3, "relist diff");
      assert.deepEqual(rec.events.toSorted(), ["add ns/d", "delete ns/a", "update ns/b"]);
      await waitFor(() => sim.openWatches() === 1, "watch again");
      assert.equal(sim.stats.lists("services"), 2, "exactly one relist");
      assert.equal(
        sim.stats.listQueries.services[1].get("resourceVersion"),
        lastRv,
        "relist from the last resourceVersion seen, as client-go (not older than it)",
      );
      assert.deepEqual(inf.list().map((s) => s.metadata?.name).sort(), ["b", "c", "d"]);
    } finally {
      await inf.stop();
    }
  });
}

Deno.test("informer: an API server behind our resourceVersion (restored or replaced) answers 504 and we relist", async () => {
  const first = await ApiServerSimulator.start({ token: "secret" });
  const port = Number(new URL(first.url).port);
  for (const n of ["a", "b", "c", "d", "e"]) first.upsert("services", svc("ns", n));
  const client = new KubeClient({ server: first.url, token: "secret", source: "test" }, { qps: 0 });
  const inf = newServiceInformer(client, FAST);
  const rec = recorder<Service>();
  inf.addEventHandler(rec.handler);
  inf.start();
  let second: ApiServerSimulator | undefined;
  try {
    await inf.waitForSync();
    await waitFor(() => first.openWatches() === 1, "watch");
    await first.close();
    // A new server on the same address, with a lower resourceVersion and different objects (an etcd restore).
    second = await ApiServerSimulator.start({ token: "secret", port });
    second.upsert("services", svc("ns", "a"));
    second.upsert("services", svc("ns", "z"));
    assert.ok(second.rv < Number(inf.lastResourceVersion), "the new server is behind the informer");
    rec.events.length = 0;
    await waitFor(
      () => inf.size === 2 && inf.get("ns/z") !== undefined,
      "converged on the new server's state",
    );
    // ns/a has the same resourceVersion on both servers, but versions of two histories prove nothing: it is
    // delivered as an update (handlers drop it if nothing changed).
    assert.deepEqual(rec.events.toSorted(), [
      "add ns/z",
      "delete ns/b",
      "delete ns/c",
      "delete ns/d",
      "delete ns/e",
      "update ns/a",
    ]);
    // As client-go: the watch from our resourceVersion is answered 504, the list from it too, and the list
    // is repeated at once without a resourceVersion.
    assert.equal(second.stats.lists("services"), 2, "one list refused as too new, one consistent list");
    assert.ok(
      Number(second.stats.listQueries.services[0].get("resourceVersion")) > second.rv,
      "first list: from our resourceVersion",
    );
    assert.equal(
      second.stats.listQueries.services[1].get("resourceVersion"),
      null,
      "relisted with no resourceVersion",
    );
  } finally {
    await inf.stop();
    client.close();
    await second?.close();
  }
});

Deno.test("informer: bookmarks advance the resourceVersion used to re-watch", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, FAST);
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    const rv0 = inf.lastResourceVersion;
    // changes the informer does not see (filtered out)
    for (let i = 0; i < 5; i++) {
      sim.upsert("services", { ...svc("ns", `h${i}`), spec: { clusterIP: "None" } });
    }
    sim.bookmark();
    await waitFor(() => inf.lastResourceVersion === String(sim.rv), "bookmark rv");
    assert.notEqual(inf.lastResourceVersion, rv0);
    assert.equal(inf.reflector.counts.bookmarks, 1);
    sim.faults.endWatches();
    await waitFor(() => sim.stats.watches("services") === 2, "re-watch");
    assert.equal(sim.stats.watchQueries.services[1].get("resourceVersion"), String(sim.rv));
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: periodic bookmarks from the server are honoured", async () => {
  await using env = await setup({ bookmarkIntervalMs: 20 });
  const { sim, client } = env;
  const inf = newNodeInformer(client, "n1", FAST);
  inf.start();
  try {
    await inf.waitForSync();
    sim.upsert("nodes", node("n2"));
    await waitFor(() => inf.lastResourceVersion === String(sim.rv), "bookmark");
    assert.equal(inf.size, 0);
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: a list of 5 objects with page size 2 takes 3 pages", async () => {
  await using env = await setup();
  const { sim, client } = env;
  for (const n of ["a", "b", "c", "d", "e"]) sim.upsert("endpointslices", slice("ns", n, n));
  const inf = newEndpointSliceInformer(client, { ...FAST, pageSize: 2 });
  inf.start();
  try {
    await inf.waitForSync();
    assert.equal(inf.size, 5);
    assert.equal(sim.stats.lists("endpointslices"), 3);
    const qs = sim.stats.listQueries.endpointslices;
    assert.equal(qs[0].get("continue"), null);
    assert.equal(qs[0].get("resourceVersion"), "0");
    assert.ok(qs[1].get("continue"));
    assert.equal(qs[1].get("resourceVersion"), null);
    assert.ok(qs[2].get("continue"));
    assert.ok(qs.every((q) => q.get("limit") === "2"));
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: 401 is logged clearly and retried until the credentials work", async () => {
  await using env = await setup();
  const { sim } = env;
  sim.token = "other";
  const client = new KubeClient({ server: sim.url, token: "secret", source: "test" }, { qps: 0 });
  const inf = newServiceInformer(client, FAST);
  logLines.length = 0;
  inf.start();
  try {
    await waitFor(() => sim.stats.unauthorized >= 3, "retries");
    assert.equal(inf.hasSynced(), false);
    assert.ok(
      logLines.some((l) => l.includes("Unauthorized (401)") && l.includes("check the token")),
      logLines[0],
    );
    sim.token = "secret";
    assert.equal(await inf.waitForSync(AbortSignal.timeout(3000)), true);
  } finally {
    await inf.stop();
    client.close();
  }
});

Deno.test("informer: a malformed watch line is logged, answered by a relist (last resourceVersion, no limit), and the cache converges", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, FAST);
  inf.start();
  logLines.length = 0;
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.faults.malformed();
    sim.upsert("services", svc("ns", "b"));
    await waitFor(() => sim.stats.lists("services") === 2, "relist");
    await waitFor(() => inf.size === 2, "b");
    assert.ok(
      logLines.some((l) => l.includes("watch ended with error") && l.includes("malformed watch event")),
    );
    // The relist asks for at least the last resourceVersion, without a limit (client-go's pager): with
    // one, kube-apiserver reads that exact revision from etcd instead of its watch cache.
    const relist = sim.stats.listQueries.services[1];
    assert.notEqual(relist.get("resourceVersion") ?? "0", "0");
    assert.equal(relist.get("limit"), null);
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.upsert("services", svc("ns", "c"));
    await waitFor(() => inf.size === 3, "c");
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: a throwing handler is logged and neither stops the informer nor later handlers", async () => {
  await using env = await setup();
  const { sim, client } = env;
  const inf = newServiceInformer(client, FAST);
  inf.addEventHandler({
    onAdd() {
      throw new Error("boom");
    },
  });
  const rec = recorder<Service>();
  inf.addEventHandler(rec.handler);
  logLines.length = 0;
  inf.start();
  try {
    await inf.waitForSync();
    sim.upsert("services", svc("ns", "a"));
    sim.upsert("services", svc("ns", "b"));
    await waitFor(() => rec.events.length === 2, "events after a throw");
    assert.ok(logLines.some((l) => l.includes("Event handler failed") && l.includes("boom")));
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: resync re-delivers every cached object as onUpdate(obj, obj); late handlers get adds", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, { ...FAST, resyncMs: 30 });
  const same: boolean[] = [];
  inf.addEventHandler({ onUpdate: (o, n) => same.push(o === n) });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => same.length >= 2, "resyncs");
    assert.ok(same.every((x) => x));
    const late = recorder<Service>();
    inf.addEventHandler(late.handler);
    assert.equal(late.events[0], "add ns/a");
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: a half-open watch is aborted by the inactivity timeout and re-established", async () => {
  await using env = await setup();
  const { sim, client } = env;
  const inf = newServiceInformer(client, { ...FAST, inactivityMs: 80 });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.stats.watches("services") >= 3, "re-watches after silence");
    assert.equal(sim.stats.lists("services"), 1);
    await sleep(10);
  } finally {
    await inf.stop();
  }
});

Deno.test("informer: 5xx and 429 back off and retry; stop() ends the loop", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  sim.faults.failNext(2, 500, { kind: "list" });
  sim.faults.failNext(2, 429, { kind: "watch" });
  const inf = newServiceInformer(client, FAST);
  inf.start();
  await inf.waitForSync();
  await waitFor(() => sim.openWatches() === 1, "watch after 429s");
  assert.equal(sim.stats.lists("services"), 3);
  assert.equal(sim.stats.watches("services"), 3);
  await inf.stop();
  await waitFor(() => sim.openWatches() === 0, "watch closed by stop");
});

Deno.test("informer: metadata.managedFields is dropped on ingest (list and watch), as kube-proxy's transform", async () => {
  await using env = await setup();
  const { sim, client } = env;
  const withMF = (s: Service): Service => ({
    ...s,
    metadata: {
      ...s.metadata,
      managedFields: [{ manager: "kubectl", operation: "Apply" }],
    } as Service["metadata"],
  });
  sim.upsert("services", withMF(svc("ns", "a")));
  const inf = newServiceInformer(client, FAST);
  const seen: Service[] = [];
  inf.addEventHandler({ onAdd: (o) => seen.push(o), onUpdate: (_old, o) => seen.push(o) });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.upsert("services", withMF(svc("ns", "b", "10.96.0.2")));
    await waitFor(() => seen.length === 2, "2 events");
    for (const o of [...seen, ...inf.list()]) {
      assert.equal("managedFields" in (o.metadata ?? {}), false, `${o.metadata?.name} kept managedFields`);
      assert.ok(o.spec?.clusterIP, "spec kept");
    }
  } finally {
    await inf.stop();
  }
});
