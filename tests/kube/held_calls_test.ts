import assert from "node:assert/strict";
import { HeldCalls } from "../../lib/kube/held_calls.ts";
import { configureLogging } from "../../lib/log.ts";

Deno.test("held calls: queued until the receiver is released, then run on it in order; after it, at once", () => {
  const held = new HeldCalls<string[]>();
  const seen: string[] = [];
  held.run((r) => r.push("add a"));
  held.run((r) => r.push("add b"));
  held.run((r) => r.push("synced"));
  assert.equal(seen.length, 0);
  assert.equal(held.held, 3);
  held.release(seen);
  assert.deepEqual(seen, ["add a", "add b", "synced"]);
  assert.equal(held.held, 0);
  held.run((r) => r.push("update a"));
  assert.deepEqual(seen, ["add a", "add b", "synced", "update a"]);
});

Deno.test("held calls: a call queued while the release runs comes after the held ones", () => {
  const held = new HeldCalls<string[]>();
  held.run((r) => {
    r.push("first");
    held.run((r2) => r2.push("queued during the release"));
  });
  held.run((r) => r.push("second"));
  const seen: string[] = [];
  held.release(seen);
  assert.deepEqual(seen, ["first", "second", "queued during the release"]);
});

Deno.test("held calls: one that throws is logged and the later ones still run", () => {
  const lines: string[] = [];
  configureLogging({ sink: (l) => lines.push(l) });
  try {
    const held = new HeldCalls<string[]>();
    held.run((r) => r.push("a"));
    held.run(() => {
      throw new Error("bad object");
    });
    held.run((r) => r.push("c"));
    const seen: string[] = [];
    held.release(seen);
    assert.deepEqual(seen, ["a", "c"]);
    assert.ok(
      lines.some((l) => l.includes("A held informer callback failed") && l.includes("bad object")),
      lines.join("\n"),
    );
  } finally {
    configureLogging({ sink: (l) => console.error(l) });
  }
});
