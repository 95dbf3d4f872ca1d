/** BoundedFrequencyRunner on a fake clock (no real sleeping), v1.34 semantics. */
import assert from "node:assert/strict";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { BoundedFrequencyRunner } from "../../lib/proxy/runner.ts";

interface Harness {
  clock: FakeClock;
  runner: BoundedFrequencyRunner;
  /** Start times (ms since clock start) of each run. */
  starts: number[];
  /** Set to make the next runs fail. */
  fail: { value: boolean };
  /** Resolves the current run (when runs are held). */
  release: () => void;
}

function harness(min: number, retry: number, max: number, opts: { hold?: boolean } = {}): Harness {
  const clock = new FakeClock(0);
  const starts: number[] = [];
  const fail = { value: false };
  let release = () => {};
  const runner = new BoundedFrequencyRunner("test", async () => {
    starts.push(clock.now());
    if (opts.hold) await new Promise<void>((r) => release = r);
    if (fail.value) throw new Error("boom");
  }, { minIntervalMs: min, retryIntervalMs: retry, maxIntervalMs: max, clock });
  return { clock, runner, starts, fail, release: () => release() };
}

Deno.test("BoundedFrequencyRunner rejects maxInterval < minInterval", () => {
  assert.throws(() =>
    new BoundedFrequencyRunner("x", () => Promise.resolve(), {
      minIntervalMs: 10,
      retryIntervalMs: 1,
      maxIntervalMs: 5,
    }), RangeError);
});

Deno.test("BoundedFrequencyRunner runs at once when idle and coalesces requests made during minInterval", async () => {
  const h = harness(1000, 30_000, 60_000);
  h.runner.start();
  h.runner.run();
  await h.clock.advance(0);
  assert.deepEqual(h.starts, [0]);
  // Three requests during the cooldown coalesce into one run when it ends.
  await h.clock.advance(100);
  h.runner.run();
  h.runner.run();
  await h.clock.advance(100);
  h.runner.run();
  await h.clock.advance(799);
  assert.deepEqual(h.starts, [0]);
  await h.clock.advance(1);
  assert.deepEqual(h.starts, [0, 1000]);
  await h.clock.advance(5000);
  assert.deepEqual(h.starts, [0, 1000], "no further run without a request");
  await h.runner.stop();
});

Deno.test("BoundedFrequencyRunner measures minInterval from the end of a run, and never overlaps runs", async () => {
  const h = harness(1000, 30_000, 60_000, { hold: true });
  h.runner.start();
  h.runner.run();
  await h.clock.advance(0);
  assert.equal(h.runner.running, true);
  h.runner.run(); // during the run
  await h.clock.advance(5000); // the run takes 5 s
  assert.deepEqual(h.starts, [0], "no second run while the first is in progress");
  h.release();
  await h.clock.advance(999);
  assert.deepEqual(h.starts, [0]);
  await h.clock.advance(1);
  assert.deepEqual(h.starts, [0, 6000], "next run starts minInterval after the end of the previous one");
  h.release();
  await h.runner.stop();
});

Deno.test("BoundedFrequencyRunner retries a failed run after retryInterval, and a success cancels the retry", async () => {
  const h = harness(1000, 30_000, 3_600_000);
  h.runner.start();
  h.fail.value = true;
  h.runner.run();
  await h.clock.advance(29_999);
  assert.deepEqual(h.starts, [0]);
  await h.clock.advance(1);
  assert.deepEqual(h.starts, [0, 30_000], "retried after retryInterval");
  // Still failing: another retry is armed; a requested run that succeeds cancels it.
  h.fail.value = false;
  await h.clock.advance(5000);
  h.runner.run();
  await h.clock.advance(0);
  assert.deepEqual(h.starts, [0, 30_000, 35_000]);
  await h.clock.advance(60_000);
  assert.deepEqual(h.starts, [0, 30_000, 35_000], "no retry after a success");
  await h.runner.stop();
});

Deno.test("BoundedFrequencyRunner runs periodically every maxInterval after the last run", async () => {
  const h = harness(1000, 30_000, 60_000);
  h.runner.start();
  await h.clock.advance(60_000);
  assert.deepEqual(h.starts, [60_000]);
  await h.clock.advance(10_000);
  h.runner.run();
  await h.clock.advance(0);
  assert.deepEqual(h.starts, [60_000, 70_000]);
  await h.clock.advance(59_999);
  assert.deepEqual(h.starts, [60_000, 70_000], "periodic timer restarts after every run");
  await h.clock.advance(1);
  assert.deepEqual(h.starts, [60_000, 70_000, 130_000]);
  await h.runner.stop();
});

Deno.test("BoundedFrequencyRunner keeps a request made before start() and runs it on start()", async () => {
  const h = harness(0, 30_000, 60_000);
  h.runner.run();
  await h.clock.advance(10);
  assert.deepEqual(h.starts, []);
  h.runner.start();
  await h.clock.advance(0);
  assert.deepEqual(h.starts, [10]);
  await h.runner.stop();
  assert.equal(h.clock.pendingTimers, 0, "stop() clears every timer");
});
