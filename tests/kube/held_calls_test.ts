import assert from "node:assert/strict";
import { HeldCalls } from "../../lib/kube/held_calls.ts";
import { configureLogging } from "../../lib/log.ts";

Deno.test("held calls: queued until the release, then run in order; after it, run at once", () => {
  const held = new HeldCalls();
  const seen: string[] = [];
  held.run(() => seen.push("add a"));
  held.run(() => seen.push("add b"));
  held.run(() => seen.push("synced"));
  assert.equal(seen.length, 0);
  assert.equal(held.held, 3);
  held.release();
  assert.deepEqual(seen, ["add a", "add b", "synced"]);
  assert.equal(held.held, 0);
  held.run(() => seen.push("update a"));
  assert.deepEqual(seen, ["add a", "add b", "synced", "update a"]);
});

Deno.test("held calls: one that throws is logged and the later ones still run", () => {
  const lines: string[] = [];
  configureLogging({ sink: (l) => lines.push(l) });
  try {
    const held = new HeldCalls();
    const seen: string[] = [];
    held.run(() => seen.push("a"));
    held.run(() => {
      throw new Error("bad object");
    });
    held.run(() => seen.push("c"));
    held.release();
    assert.deepEqual(seen, ["a", "c"]);
    assert.ok(
      lines.some((l) => l.includes("A held informer callback failed") && l.includes("bad object")),
      lines.join("\n"),
    );
  } finally {
    configureLogging({ sink: (l) => console.error(l) });
  }
});
