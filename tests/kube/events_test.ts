import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { EventRecorder, nodeRef } from "../../lib/kube/events.ts";
import type { KubeEvent } from "../../lib/kube/types.ts";
import { logLines } from "./helpers.ts";

Deno.test("events: Starting/StartKubeProxy on the Node, as upstream; repeats become a series", async () => {
  const sim = await ApiServerSimulator.start();
  const client = new KubeClient({ server: sim.url, source: "test" }, { qps: 0 });
  try {
    const rec = new EventRecorder(client, { hostname: "node-a" });
    rec.event(nodeRef("node-a"), "Normal", "Starting", "StartKubeProxy");
    await rec.flush();
    const [ev] = sim.list<KubeEvent>("events");
    assert.equal(ev.metadata?.namespace, "default");
    assert.match(ev.metadata!.name!, /^node-a\.[0-9a-f]+$/);
    assert.equal(ev.reportingController, "kube-proxy");
    assert.equal(ev.reportingInstance, "kube-proxy-node-a");
    assert.equal(ev.reason, "Starting");
    assert.equal(ev.action, "StartKubeProxy");
    assert.equal(ev.type, "Normal");
    assert.deepEqual(ev.regarding, { kind: "Node", apiVersion: "v1", name: "node-a", uid: "node-a" });
    assert.match(ev.eventTime!, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);

    rec.event(nodeRef("node-a"), "Normal", "Starting", "StartKubeProxy");
    rec.event(nodeRef("node-a"), "Normal", "Starting", "StartKubeProxy");
    await rec.flush();
    const all = sim.list<KubeEvent>("events");
    assert.equal(all.length, 1);
    assert.equal(all[0].series?.count, 3);
    assert.deepEqual(rec.counts, { posted: 1, patched: 2, dropped: 0, failed: 0 });
  } finally {
    client.close();
    await sim.close();
  }
});

Deno.test("events: rate limited per object, and a failure to post is logged, never thrown", async () => {
  const sim = await ApiServerSimulator.start();
  const client = new KubeClient({ server: sim.url, source: "test" }, { qps: 0 });
  try {
    const rec = new EventRecorder(client, { hostname: "h", burst: 2 });
    for (let i = 0; i < 5; i++) rec.event(nodeRef("n"), "Warning", "R", "A", `note ${i}`);
    await rec.flush();
    assert.equal(rec.counts.posted, 2);
    assert.equal(rec.counts.dropped, 3);
    sim.faults.failNext(1, 500, { kind: "write" });
    logLines.length = 0;
    rec.event({ kind: "Service", apiVersion: "v1", name: "s", namespace: "ns" }, "Warning", "X", "Y");
    await rec.flush();
    assert.equal(rec.counts.failed, 1);
    assert.ok(logLines.some((l) => l.includes("Could not write event")));
  } finally {
    client.close();
    await sim.close();
  }
});
