/**
 * The reflector's retry timing against client-go v0.35's (tools/cache/reflector.go with
 * wait.NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)), with a fake clock: the exact sequence of
 * waits, its jitter bounds, the reset after two quiet minutes, and which failures relist and which only
 * re-watch. The reflector talks to the API server simulator over real HTTP; only time is fake.
 */
import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { newServiceInformer } from "../../lib/kube/informer.ts";
import { Backoff, type ReflectorClock } from "../../lib/kube/reflector.ts";
import { svc, waitFor } from "./helpers.ts";

/** A clock whose sleeps return at once (after a real macrotask) and move time forward. */
class FakeClock implements ReflectorClock {
  t = 1_000_000;
  readonly sleeps: number[] = [];
  now(): number {
    return this.t;
  }
  async sleep(ms: number, _signal: AbortSignal): Promise<void> {
    this.sleeps.push(ms);
    this.t += ms;
    await new Promise((r) => setTimeout(r, 1));
  }
}

/** client-go's sequence of base delays (before jitter), in ms. */
const CLIENT_GO_BASE = [800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000, 30_000];

Deno.test("backoff: 800 ms doubling to a 30 s cap; jitter multiplies each step by [1, 2), as client-go", () => {
  const table: { name: string; random: () => number; expect: (base: number) => number }[] = [
    { name: "no jitter drawn", random: () => 0, expect: (b) => b },
    { name: "half jitter", random: () => 0.5, expect: (b) => b * 1.5 },
    { name: "almost full jitter", random: () => 0.999, expect: (b) => b * 1.999 },
  ];
  for (const { name, random, expect } of table) {
    const clock = new FakeClock();
    const b = new Backoff({}, clock, random);
    const got = CLIENT_GO_BASE.map(() => b.next());
    assert.deepEqual(got.map((x) => Math.round(x)), CLIENT_GO_BASE.map((x) => Math.round(expect(x))), name);
  }
  // Real randomness stays within the bounds.
  const b = new Backoff({}, new FakeClock());
  for (const base of CLIENT_GO_BASE) {
    const d = b.next();
    assert.ok(d >= base && d < 2 * base, `${d} in [${base}, ${2 * base})`);
  }
});

Deno.test("backoff: resets to 800 ms only when the previous step is more than 2 minutes old", () => {
  const clock = new FakeClock();
  const b = new Backoff({}, clock, () => 0);
  for (let i = 0; i < 5; i++) b.next(); // 800 .. 12 800
  clock.t += 120_000; // exactly 2 minutes: no reset (client-go compares with >)
  assert.equal(b.next(), 25_600);
  clock.t += 120_001;
  assert.equal(b.next(), 800, "reset after a quiet period");
  assert.equal(b.next(), 1600);
});

async function setup() {
  const sim = await ApiServerSimulator.start({ token: "t" });
  const client = new KubeClient({ server: sim.url, token: "t", source: "test" }, { qps: 0 });
  return {
    sim,
    client,
    async [Symbol.asyncDispose]() {
      client.close();
      await sim.close();
    },
  };
}

function assertClientGoWaits(waits: number[], from = 0): void {
  waits.forEach((w, i) => {
    const base = CLIENT_GO_BASE[Math.min(from + i, CLIENT_GO_BASE.length - 1)];
    assert.ok(w >= base && w < 2 * base, `wait ${i + 1}: ${Math.round(w)} ms not in [${base}, ${2 * base})`);
  });
}

Deno.test("reflector: 8 failed lists wait 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30 s (x [1,2) jitter), then sync", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  sim.faults.failNext(8, 500, { kind: "list", resource: "services" });
  const clock = new FakeClock();
  const inf = newServiceInformer(client, { clock });
  inf.start();
  try {
    assert.equal(await inf.waitForSync(AbortSignal.timeout(10_000)), true);
    assert.equal(sim.stats.lists("services"), 9);
    assert.equal(clock.sleeps.length, 8, `waits: ${clock.sleeps.map(Math.round)}`);
    assertClientGoWaits(clock.sleeps);
    const total = clock.sleeps.reduce((a, b) => a + b, 0);
    assert.ok(total >= 110_400 && total < 220_800, `total ${total}`);
  } finally {
    await inf.stop();
  }
});

Deno.test("reflector: a 500 on the watch goes back through the backoff and a list; a 429 only re-watches", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  sim.faults.failNext(3, 500, { kind: "watch", resource: "services" });
  const clock = new FakeClock();
  const inf = newServiceInformer(client, { clock });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches("services") === 1, "watch");
    // list ok, watch 500, wait, list, watch 500, wait, list, watch 500, wait, list, watch ok
    assert.equal(sim.stats.lists("services"), 4);
    assert.equal(sim.stats.watches("services"), 4);
    assert.equal(clock.sleeps.length, 3);
    assertClientGoWaits(clock.sleeps);

    // 429s: backoff (the same manager, so the sequence continues) and re-watch, no list. The stream
    // lasted more than a second (fake time), so its end is not a "very short watch".
    clock.t += 5_000;
    sim.faults.failNext(2, 429, { kind: "watch", resource: "services" });
    sim.faults.dropWatches();
    await waitFor(() => sim.openWatches("services") === 1 && sim.stats.watches("services") === 7, "re-watch");
    assert.equal(sim.stats.lists("services"), 4, "no list after 429s");
    assert.equal(clock.sleeps.length, 5);
    assertClientGoWaits(clock.sleeps.slice(3), 3);
  } finally {
    await inf.stop();
  }
});

Deno.test("reflector: connection refused on the watch backs off and re-watches without a list", async () => {
  const first = await ApiServerSimulator.start({ token: "t" });
  const port = Number(new URL(first.url).port);
  first.upsert("services", svc("ns", "a"));
  const client = new KubeClient({ server: first.url, token: "t", source: "test" }, { qps: 0 });
  const clock = new FakeClock();
  const inf = newServiceInformer(client, { clock });
  inf.start();
  let second: ApiServerSimulator | undefined;
  try {
    await inf.waitForSync();
    await waitFor(() => first.openWatches() === 1, "watch");
    clock.t += 5_000; // the watch has lasted a while
    await first.close();
    await waitFor(() => clock.sleeps.length >= 4, "backoff while refused");
    // The same port again, with the same history (the informer's resourceVersion is still valid there).
    second = await ApiServerSimulator.start({ token: "t", port });
    second.rv = first.rv;
    second.upsert("services", svc("ns", "b"));
    await waitFor(() => inf.size === 2, "b after reconnect");
    assert.equal(second.stats.lists("services"), 0, "resumed with a watch, no list");
    assert.ok(second.stats.watches("services") >= 1);
    assertClientGoWaits(clock.sleeps);
  } finally {
    await inf.stop();
    client.close();
    await second?.close();
  }
});

Deno.test("reflector: after 2 quiet minutes the next failure waits 0.8-1.6 s again; without them the sequence goes on", async () => {
  for (const quietMs of [60_000, 121_000]) {
    await using env = await setup();
    const { sim, client } = env;
    sim.upsert("services", svc("ns", "a"));
    sim.faults.failNext(6, 500, { kind: "list", resource: "services" });
    const clock = new FakeClock();
    const inf = newServiceInformer(client, { clock });
    inf.start();
    try {
      await inf.waitForSync();
      await waitFor(() => sim.openWatches("services") === 1, "watch");
      assert.equal(clock.sleeps.length, 6);
      clock.t += quietMs;
      sim.faults.failNext(1, 500, { kind: "watch", resource: "services" });
      sim.faults.dropWatches();
      await waitFor(() => clock.sleeps.length === 7 && sim.openWatches("services") === 1, "retry");
      const w = clock.sleeps[6];
      if (quietMs > 120_000) assert.ok(w >= 800 && w < 1600, `after ${quietMs} ms quiet: ${w}`);
      else assert.ok(w >= 30_000 && w < 60_000, `after ${quietMs} ms quiet: ${w}`);
    } finally {
      await inf.stop();
    }
  }
});

Deno.test("reflector: a watch that ends within a second without events is answered by backoff and a list", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const clock = new FakeClock();
  const inf = newServiceInformer(client, { clock });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches("services") === 1, "watch");
    sim.faults.endWatches(); // no fake time passed: a "very short watch"
    await waitFor(() => sim.stats.lists("services") === 2 && sim.openWatches("services") === 1, "relist");
    assert.equal(clock.sleeps.length, 1);
    assertClientGoWaits(clock.sleeps);
  } finally {
    await inf.stop();
  }
});

Deno.test("reflector: resync runs every resyncMs while watching, counted from each list-and-watch", async () => {
  await using env = await setup();
  const { sim, client } = env;
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, { resyncMs: 40, minWatchTimeoutSeconds: 30 });
  const updates: string[] = [];
  inf.addEventHandler({ onUpdate: (o, n) => o === n && updates.push(n.metadata!.name!) });
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => updates.length >= 2, "two resyncs");
    assert.ok(inf.reflector.counts.resyncs >= 2);
  } finally {
    await inf.stop();
  }
  const after = inf.reflector.counts.resyncs;
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(inf.reflector.counts.resyncs, after, "no resync after stop");
});
