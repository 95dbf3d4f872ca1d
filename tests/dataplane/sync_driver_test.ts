// The sync driver every mode runs its syncs through: full-sync bookkeeping, failures, the success line and the
// lock, pinned without a mode (each mode's own tests pin what it does inside the driver).
import assert from "node:assert/strict";
import { configureLogging, log, verbosity } from "../../lib/log.ts";
import { type ModeSyncOutcome, SyncDriver } from "../../lib/dataplane/sync_driver.ts";
import { snapshot } from "../../testkit/fixtures.ts";

function outcome(full: boolean, extra: Partial<ModeSyncOutcome> = {}): ModeSyncOutcome {
  return { full, bytes: 10, generateMs: 1.234, applyMs: 5.6, ...extra };
}

function newDriver() {
  return new SyncDriver({ mode: "testmode", family: "IPv4", logger: log.with({ ipFamily: "IPv4" }) });
}

Deno.test("sync driver: the first sync is full, later ones partial unless the snapshot asks for a full one", async () => {
  const d = newDriver();
  const asked: boolean[] = [];
  const body = (full: boolean) => {
    asked.push(full);
    return Promise.resolve(outcome(full));
  };
  assert.equal(d.knownNeedsFull(), false, "nothing to check before the first sync");
  await d.sync(snapshot([], { changed: [] }), body);
  assert.equal(d.everSynced, true);
  await d.sync(snapshot([], { changed: [] }), body);
  await d.sync(snapshot([], { changed: null }), body);
  assert.deepEqual(asked, [true, false, true]);
  assert.equal(d.knownNeedsFull(), null, "after a success the mode must look");
  d.requestFull();
  assert.equal(d.knownNeedsFull(), true);
  await d.sync(snapshot([], { changed: [] }), body);
  assert.deepEqual(asked, [true, false, true, true]);
});

Deno.test("sync driver: a failed sync rejects, runs onFailure once, and makes the next sync full", async () => {
  const d = newDriver();
  const asked: boolean[] = [];
  await d.sync(snapshot([]), (full) => Promise.resolve(outcome(full)));
  const failures: unknown[] = [];
  await assert.rejects(
    d.sync(snapshot([], { changed: [] }), (full) => {
      asked.push(full);
      return Promise.reject(new Error("tool refused"));
    }, (err) => failures.push(err)),
    /tool refused/,
  );
  assert.equal(failures.length, 1);
  assert.equal(d.knownNeedsFull(), true);
  await d.sync(snapshot([], { changed: [] }), (full) => {
    asked.push(full);
    return Promise.resolve(outcome(full));
  });
  assert.deepEqual(asked, [false, true]);
});

Deno.test("sync driver: nextFull keeps the next sync full after a success; a mode's own full upgrade is returned", async () => {
  const d = newDriver();
  const asked: boolean[] = [];
  await d.sync(snapshot([]), (full) => Promise.resolve(outcome(full, { nextFull: true })));
  assert.equal(d.knownNeedsFull(), true);
  await d.sync(snapshot([], { changed: [] }), (full) => {
    asked.push(full);
    return Promise.resolve(outcome(full));
  });
  assert.deepEqual(asked, [true]);
  // The driver asks for a partial sync; the mode wrote everything (its settings changed): the result says so.
  const r = await d.sync(snapshot([], { changed: [] }), (full) => {
    asked.push(full);
    return Promise.resolve(outcome(true));
  });
  assert.deepEqual(asked, [true, false]);
  assert.deepEqual(r, { full: true, payloadBytes: 10, generateMs: 1.234, applyMs: 5.6 });
});

Deno.test("sync driver: a snapshot of the other family is refused before the mode runs", async () => {
  const d = newDriver();
  let ran = false;
  await assert.rejects(
    d.sync(snapshot([], { family: "IPv6" }), () => {
      ran = true;
      return Promise.resolve(outcome(true));
    }),
    /testmode dataplane for IPv4 got a IPv6 snapshot/,
  );
  assert.equal(ran, false);
  assert.equal(d.everSynced, false);
});

Deno.test("sync driver: syncs and the mode's other writes run one at a time, in call order", async () => {
  const d = newDriver();
  const events: string[] = [];
  let release!: () => void;
  const held = new Promise<void>((r) => release = r);
  const first = d.sync(snapshot([]), async (full) => {
    events.push("sync1 start");
    await held;
    events.push("sync1 end");
    return outcome(full);
  });
  const write = d.exclusive(() => {
    events.push("write");
    return Promise.resolve();
  });
  const second = d.sync(snapshot([], { changed: [] }), (full) => {
    events.push(`sync2 full=${full}`);
    return Promise.resolve(outcome(full));
  });
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(events, ["sync1 start"]);
  release();
  await Promise.all([first, write, second]);
  assert.deepEqual(events, ["sync1 start", "sync1 end", "write", "sync2 full=false"]);
});

Deno.test("sync driver: the success line carries the mode's fields and rounded timings", async () => {
  const lines: Record<string, unknown>[] = [];
  const v = verbosity();
  configureLogging({ format: "json", verbosity: 2, sink: (l) => lines.push(JSON.parse(l)) });
  try {
    const d = newDriver();
    await d.sync(
      snapshot([]),
      (full) => Promise.resolve(outcome(full, { logFields: { virtualServers: 3 } })),
    );
  } finally {
    configureLogging({
      format: "text",
      verbosity: v,
      sink: (l) => Deno.stderr.writeSync(new TextEncoder().encode(l + "\n")),
    });
  }
  const done = lines.find((l) => l.msg === "SyncProxyRules complete");
  assert.ok(done, JSON.stringify(lines));
  assert.equal(done.full, true);
  assert.equal(done.virtualServers, 3);
  assert.equal(done.bytes, 10);
  assert.equal(done.generateMs, 1.2);
  assert.equal(done.applyMs, 6);
  assert.equal(done.ipFamily, "IPv4");
});
