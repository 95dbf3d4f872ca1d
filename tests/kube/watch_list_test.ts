/**
 * The reflector's watch-list path (client-go's WatchListClient, v0.37 reflector.watchList) against the API server
 * simulator: the initial state streamed by a watch with `sendInitialEvents=true`, ended by the
 * `k8s.io/initial-events-end` bookmark, the same stream going on as the watch; and the fallback to list + watch
 * exactly where client-go falls back (an API server that rejects the request), while a 429 or a stream that
 * breaks before the bookmark streams again without a list.
 * @module
 */
import assert from "node:assert/strict";
import { ApiServerSimulator, type SimulatorOptions } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { newServiceInformer } from "../../lib/kube/informer.ts";
import { FAST, svc, waitFor } from "./helpers.ts";

async function setup(simOpts: SimulatorOptions = {}) {
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

Deno.test("watch-list: the initial state comes from one watch with client-go's parameters, no LIST, and the stream goes on", async () => {
  await using env = await setup();
  const { sim, client } = env;
  for (let i = 0; i < 5; i++) sim.upsert("services", svc("default", `web-${i}`, `10.96.0.${10 + i}`));
  const inf = newServiceInformer(client, { ...FAST, useWatchList: true });
  inf.start();
  try {
    await waitFor(() => inf.hasSynced(), "synced");
    assert.equal(inf.list().length, 5);
    assert.equal(sim.stats.lists("services"), 0, "no LIST");
    assert.equal(sim.stats.watches("services"), 1);
    const q = sim.stats.watchQueries.services[0];
    assert.equal(q.get("sendInitialEvents"), "true");
    assert.equal(q.get("resourceVersionMatch"), "NotOlderThan");
    assert.equal(q.get("allowWatchBookmarks"), "true");
    assert.equal(q.get("resourceVersion") ?? "", "", "first stream: a consistent read (no resourceVersion)");
    assert.equal(inf.reflector.counts.watchLists, 1);
    // Live events arrive on the same stream.
    sim.upsert("services", svc("default", "late", "10.96.0.99"));
    await waitFor(() => inf.list().length === 6, "live event on the watch-list stream");
    assert.equal(sim.stats.watches("services"), 1, "no second watch");
    // A stream that ends after the bookmark is re-watched as a plain watch from the last resourceVersion.
    const rv = inf.reflector.lastResourceVersion;
    sim.faults.endWatches();
    await waitFor(() => sim.stats.watches("services") === 2, "re-watch");
    const q2 = sim.stats.watchQueries.services[1];
    assert.equal(q2.get("sendInitialEvents"), null);
    assert.equal(q2.get("resourceVersion"), rv);
    assert.equal(sim.stats.lists("services"), 0);
  } finally {
    await inf.stop();
  }
});

Deno.test("watch-list: an API server with watch-list off (422) gets one LIST then a WATCH, as client-go falls back", async () => {
  await using env = await setup({ watchList: false });
  const { sim, client } = env;
  for (let i = 0; i < 3; i++) sim.upsert("services", svc("default", `web-${i}`, `10.96.0.${10 + i}`));
  const inf = newServiceInformer(client, { ...FAST, useWatchList: true });
  inf.start();
  try {
    await waitFor(() => inf.hasSynced(), "synced");
    await waitFor(() => sim.stats.watches("services") === 2, "watch after the list");
    assert.equal(inf.list().length, 3);
    assert.equal(sim.stats.lists("services"), 1, "one LIST");
    assert.equal(sim.stats.watchQueries.services[0].get("sendInitialEvents"), "true");
    assert.equal(
      sim.stats.watchQueries.services[1].get("sendInitialEvents"),
      null,
      "a plain watch after the list",
    );
    sim.upsert("services", svc("default", "late", "10.96.0.99"));
    await waitFor(() => inf.list().length === 4, "live event after the fallback");
  } finally {
    await inf.stop();
  }
});

Deno.test("watch-list: a 429 streams again after a backoff step, without a LIST", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("default", "web", "10.96.0.10"));
  sim.faults.failNext(1, 429, { kind: "watch", resource: "services" });
  const inf = newServiceInformer(client, { ...FAST, useWatchList: true });
  inf.start();
  try {
    await waitFor(() => inf.hasSynced(), "synced");
    assert.equal(sim.stats.lists("services"), 0, "no LIST after a 429");
    assert.equal(inf.reflector.counts.watchLists, 2);
    assert.equal(sim.stats.watchQueries.services.at(-1)!.get("sendInitialEvents"), "true");
  } finally {
    await inf.stop();
  }
});

Deno.test("watch-list: off by default (LIST then WATCH)", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("default", "web", "10.96.0.10"));
  const inf = newServiceInformer(client, FAST);
  inf.start();
  try {
    await waitFor(() => inf.hasSynced(), "synced");
    await waitFor(() => sim.stats.watches("services") === 1, "watch");
    assert.equal(sim.stats.lists("services"), 1);
    assert.equal(sim.stats.watchQueries.services[0].get("sendInitialEvents"), null);
  } finally {
    await inf.stop();
  }
});
