/**
 * The host's door to the IPVS VM: boots it once (testkit/ipvs_vm.ts, scripts/ipvs_vm.sh) and runs
 * every `*_vmtest.ts` file inside it, one step here per test and step there. A test that fails in the VM
 * fails its step; one that is ignored in the VM fails too (inside the VM every VM test must run), and so
 * does a VM that reports nothing. Skipped, with the reason printed, only where the VM cannot run at all
 * (see ipvsVmUnavailableReason: never as root on x86-64 Linux, as in CI).
 */

import assert from "node:assert/strict";
import {
  filesWithTests,
  findVmTestFiles,
  ipvsVmUnavailableReason,
  parseDenoJUnit,
  runInIpvsVm,
} from "../../testkit/ipvs_vm.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = ipvsVmUnavailableReason();
if (unavailable) console.log(`ipvs VM tests skipped: ${unavailable}`);

privilegedTest(unavailable, {
  name: "ipvs VM: every *_vmtest.ts passes inside a VM with a real IPVS kernel",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const files = findVmTestFiles();
    assert.ok(files.length > 0, "no *_vmtest.ts files under tests/");
    const run = await runInIpvsVm(files, { onLine: (line) => console.log(`[vm] ${line}`) });
    console.log(`[vm] ${run.cases.length} tests and steps, exit ${run.code}, wall ${run.wallMs} ms`);
    for (const c of run.cases) {
      await t.step(`${c.file.replace(/^\.\/tests\//, "")}: ${c.name}`, () => {
        if (c.outcome === "failed") throw new Error(`failed inside the VM:\n${c.failure}`);
        if (c.outcome === "ignored") throw new Error("ignored inside the VM, where every VM test must run");
      });
    }
    const ran = new Set([...filesWithTests(run.output)].map((f) => f.replace(/^\.\//, PROJECT_ROOT)));
    for (const file of files) assert.ok(ran.has(file), `no test of ${file} ran in the VM (exit ${run.code})`);
    assert.equal(
      run.code,
      0,
      `deno test in the VM exited ${run.code} (its output is above, lines starting "[vm] ")`,
    );
  },
});

Deno.test("ipvs VM: a file ran when deno test ran tests from it, wherever they were registered", () => {
  const output = [
    "[vm] noise running 3 tests from ./tests/x_vmtest.ts",
    "running 6 tests from ./tests/dataplane/ipvs/kernel_vmtest.ts",
    "running 1 test from ./tests/packets/ipvs_vmtest.ts\r",
    "running 0 tests from ./tests/empty_vmtest.ts",
    "packets (ipvs): the agent's rules carry real traffic ... ok (1m33s)",
  ].join("\n");
  assert.deepEqual(
    [...filesWithTests(output)],
    ["./tests/dataplane/ipvs/kernel_vmtest.ts", "./tests/packets/ipvs_vmtest.ts"],
  );
});

Deno.test("ipvs VM: parseDenoJUnit reads Deno's report of tests, steps, failures and ignored tests", () => {
  // Written by deno 2.9.6 `deno test --junit-path` (a failing step, an ignored test, a passing test).
  const xml = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="deno test" tests="5" failures="2" errors="0" time="0.007">
    <testsuite name="./t/vm/b_vmtest.ts" tests="5" disabled="1" errors="0" failures="2">
        <testcase name="vm b &lt;&amp;&gt; &quot;q&quot;" classname="./t/vm/b_vmtest.ts" time="0.003" line="1" col="6">
            <failure message="1 test step failed">1 test step failed.</failure>
        </testcase>
        <testcase name="vm c" classname="./t/vm/b_vmtest.ts" time="0.000" line="2" col="6">
            <skipped/>
        </testcase>
        <testcase name="vm d" classname="./t/vm/b_vmtest.ts" time="0.000" line="3" col="6">
        </testcase>
        <testcase name="vm b &lt;&amp;&gt; &quot;q&quot; &gt; s1" classname="./t/vm/b_vmtest.ts" time="0.000" line="1" col="52">
        </testcase>
        <testcase name="vm b &lt;&amp;&gt; &quot;q&quot; &gt; s2" classname="./t/vm/b_vmtest.ts" time="0.001" line="1" col="82">
            <failure message="Uncaught Error: boom &lt;x&gt; &amp; y">Error: boom &lt;x&gt; &amp; y
    at file:///tmp/t/vm/b_vmtest.ts:1:107</failure>
        </testcase>
    </testsuite>
</testsuites>
`;
  const file = "./t/vm/b_vmtest.ts";
  assert.deepEqual(parseDenoJUnit(xml), [
    { file, name: 'vm b <&> "q"', outcome: "failed", failure: "1 test step failed." },
    { file, name: "vm c", outcome: "ignored" },
    { file, name: "vm d", outcome: "passed" },
    { file, name: 'vm b <&> "q" > s1', outcome: "passed" },
    {
      file,
      name: 'vm b <&> "q" > s2',
      outcome: "failed",
      failure: "Error: boom <x> & y\n    at file:///tmp/t/vm/b_vmtest.ts:1:107",
    },
  ]);
  assert.deepEqual(parseDenoJUnit('<testsuites name="deno test"></testsuites>'), []);
  assert.throws(() => parseDenoJUnit("error: Module not found"), /not a JUnit report/);
});
