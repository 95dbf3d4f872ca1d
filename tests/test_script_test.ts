/**
 * Honest totals from scripts/test.sh: the summary (scripts/test_summary.sh) lists ignored tests and keeps
 * `N passed, N failed` as its own last line for CI, and DKP_REQUIRE_PRIVILEGED_TESTS=1 (which test.sh sets)
 * turns a privileged test that cannot run into a failure instead of a skip.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../testkit/agent_command.ts";

const summaryScript = `${PROJECT_ROOT}scripts/test_summary.sh`;

async function summarize(output: string): Promise<string[]> {
  const f = await Deno.makeTempFile();
  try {
    await Deno.writeTextFile(f, output);
    const out = await new Deno.Command("bash", { args: [summaryScript, f], stdout: "piped" }).output();
    assert.equal(out.code, 0);
    return new TextDecoder().decode(out.stdout).trimEnd().split("\n");
  } finally {
    await Deno.remove(f);
  }
}

/** Runs `deno test` on a throwaway test file; returns its output and exit code. */
async function denoTest(source: string, env: Record<string, string> = {}) {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/x_test.ts`, source);
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["test", "--allow-all", "--no-check", `${dir}/x_test.ts`],
      env: { NO_COLOR: "1", DKP_REQUIRE_PRIVILEGED_TESTS: "", ...env },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const dec = new TextDecoder();
    return { code: out.code, output: dec.decode(out.stdout) + dec.decode(out.stderr) };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("test summary: canned deno outputs give the ignored list and a plain last line", async () => {
  const table: [string, string[]][] = [
    ["ok | 2 passed | 0 failed (26ms)\n", ["2 passed, 0 failed"]],
    [
      "ignored one ... ignored (0ms)\nFAILED | 2 passed (1 step) | 1 failed | 1 ignored (24ms)\n",
      ["1 ignored:", "  ignored one", "2 passed, 1 failed"],
    ],
    ["ok | 0 passed | 0 failed | 2 filtered out (0ms)\n", ["0 passed, 0 failed"]],
    ["error: Module not found\n", ["0 passed, 1 failed"]],
  ];
  for (const [output, want] of table) assert.deepEqual(await summarize(output), want, output);
});

Deno.test("test summary: a real deno test run with an ignored test and steps", async () => {
  const r = await denoTest(`
Deno.test("passes", () => {});
Deno.test({ name: "cannot run here", ignore: true, fn: () => {} });
Deno.test("with a step", async (t) => { await t.step("s", () => {}); });
`);
  assert.equal(r.code, 0, r.output);
  assert.deepEqual(await summarize(r.output), ["1 ignored:", "  cannot run here", "2 passed, 0 failed"]);
});

Deno.test("privilegedTest: ignored where it cannot run, a failure naming the reason under DKP_REQUIRE_PRIVILEGED_TESTS=1", async () => {
  const src = `
import { privilegedTest } from "${new URL("../testkit/privileged.ts", import.meta.url).href}";
privilegedTest("netfilter tools are missing", { name: "needs the kernel", fn: () => {} });
privilegedTest(undefined, { name: "can run", fn: () => {} });
`;
  const skipped = await denoTest(src);
  assert.equal(skipped.code, 0, skipped.output);
  assert.deepEqual(await summarize(skipped.output), [
    "1 ignored:",
    "  needs the kernel",
    "1 passed, 0 failed",
  ]);

  const required = await denoTest(src, { DKP_REQUIRE_PRIVILEGED_TESTS: "1" });
  assert.notEqual(required.code, 0);
  assert.match(required.output, /cannot run here: netfilter tools are missing/);
  assert.deepEqual(await summarize(required.output), ["1 passed, 1 failed"]);
});

Deno.test("scripts/test.sh requires the privileged tests and prints the summary last", async () => {
  const text = await Deno.readTextFile(`${PROJECT_ROOT}scripts/test.sh`);
  assert.match(text, /export DKP_REQUIRE_PRIVILEGED_TESTS=\$\{DKP_REQUIRE_PRIVILEGED_TESTS:-1\}/);
  assert.match(text, /XTABLES_LOCKFILE/);
  const lines = text.trimEnd().split("\n");
  assert.deepEqual(lines.slice(-2), ['bash scripts/test_summary.sh "$out"', 'exit "$rc"']);
});
