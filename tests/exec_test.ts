/**
 * DenoCommandRunner with streamed input and output: chunks written as they are produced, stdout delivered line
 * by line, a child that stops reading early, and a chunk producer that fails (the child is killed, never fed a
 * truncated input as if it were whole).
 */
import assert from "node:assert/strict";
import { DenoCommandRunner, RecordingCommandRunner } from "../lib/exec.ts";

const enc = new TextEncoder();

Deno.test("exec: chunked stdin reaches the child in order; stdoutLines gets every line, stdout is not kept", async () => {
  const runner = new DenoCommandRunner();
  let produced = 0;
  function* chunks(): Generator<Uint8Array> {
    for (let i = 0; i < 2000; i++) {
      produced++;
      yield enc.encode(`line ${i}\n`);
    }
  }
  const lines: string[] = [];
  const r = await runner.run({ cmd: "cat", args: [], stdin: chunks(), stdoutLines: (l) => lines.push(l) });
  assert.equal(produced, 2000);
  assert.equal(r.stdout, "");
  assert.equal(lines.length, 2000);
  assert.equal(lines[0], "line 0");
  assert.equal(lines[1999], "line 1999");
});

Deno.test("exec: a child that exits before reading everything stops the producer; its exit code is reported", async () => {
  const runner = new DenoCommandRunner();
  let produced = 0;
  function* chunks(): Generator<Uint8Array> {
    for (let i = 0; i < 10_000; i++) {
      produced++;
      yield new Uint8Array(64 * 1024);
    }
  }
  const r = await runner.tryRun({
    cmd: "sh",
    args: ["-c", "head -c 10 >/dev/null; exit 3"],
    stdin: chunks(),
  });
  assert.equal(r.code, 3);
  assert.ok(produced < 10_000, `stopped producing after ${produced} chunks`);
});

Deno.test("exec: a failing chunk producer kills the child and the error is thrown", async () => {
  const runner = new DenoCommandRunner();
  const marker = await Deno.makeTempFile();
  function* chunks(): Generator<Uint8Array> {
    yield enc.encode("partial\n");
    throw new Error("render failed");
  }
  try {
    // The child (a shell reading with its builtin, so that killing it leaves nothing behind) would write the
    // marker only after reading its input to the end.
    await assert.rejects(
      runner.tryRun({
        cmd: "sh",
        args: ["-c", `while read -r l; do :; done; echo done > ${marker}`],
        stdin: chunks(),
      }),
      /render failed/,
    );
    assert.equal(await Deno.readTextFile(marker), "", "the child never saw the end of its input");
  } finally {
    await Deno.remove(marker);
  }
});

Deno.test("exec: the recording runner joins chunks and splits canned stdout into lines", async () => {
  const rec = new RecordingCommandRunner(() => ({ stdout: "a\nb\n" }));
  const lines: string[] = [];
  const r = await rec.run({
    cmd: "x",
    args: [],
    stdin: [enc.encode("he"), enc.encode("llo")],
    stdoutLines: (l) => lines.push(l),
  });
  assert.equal(rec.calls[0].stdin, "hello");
  assert.deepEqual(lines, ["a", "b"]);
  assert.equal(r.stdout, "");
});
