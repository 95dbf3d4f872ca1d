/**
 * What the shipped program loads, read from Deno's own module graph of main.ts (`deno info --json`): no test
 * code (fakes, test helpers, testkit) in it, and only the npm packages the program uses at run time.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../testkit/agent_command.ts";
import { mainModules } from "../testkit/module_graph.ts";

/** Project files as paths from the checkout's root. */
function projectFiles(specs: readonly string[]): string[] {
  const root = new URL(`file://${PROJECT_ROOT.endsWith("/") ? PROJECT_ROOT : PROJECT_ROOT + "/"}`).href;
  return specs.filter((s) => s.startsWith(root)).map((s) => s.slice(root.length)).sort();
}

/** Test code by its place or name: tests/, testkit/, bench/, `*_test.ts`, fakes, mocks and stubs. */
function isTestCode(path: string): boolean {
  return /^(tests|testkit|bench)\//.test(path) || /_test\.ts$/.test(path) ||
    /(^|[/_])(fake|fakes|mock|mocks|stub|stubs)(_[^/]*)?\.ts$/.test(path);
}

Deno.test("module graph: the test-code pattern recognises fakes, test helpers and testkit modules", () => {
  for (
    const p of [
      "lib/dataplane/nftables/fake.ts",
      "testkit/sandbox.ts",
      "tests/cli/helpers.ts",
      "lib/x_test.ts",
    ]
  ) {
    assert.ok(isTestCode(p), p);
  }
  for (const p of ["lib/agent.ts", "lib/cli/simulated_host.ts", "lib/proxy/clock.ts"]) {
    assert.ok(!isTestCode(p), p);
  }
});

Deno.test("module graph: the agent's start path holds no test code and from npm only prom-client, yaml and @bufbuild/protobuf", async () => {
  const statics = await mainModules(false);
  const files = projectFiles(statics);
  assert.ok(files.includes("lib/agent.ts"));
  assert.deepEqual(files.filter(isTestCode), []);
  assert.deepEqual(
    // npm:/name@version/subpath -> name (a scoped name keeps its leading @)
    statics.filter((s) => s.startsWith("npm:")).map((s) =>
      s.replace(/^npm:\/?/, "").replace(/(.)@[^@/]+(\/.*)?$/, "$1")
    ).sort(),
    ["@bufbuild/protobuf", "prom-client", "yaml"],
  );
});

Deno.test("module graph: nothing main.ts can load, render and explain included, is test code or client-node", async () => {
  const all = await mainModules(true);
  const files = projectFiles(all);
  assert.ok(files.includes("lib/cli/run.ts") && files.includes("lib/cli/schema.ts"));
  // lib/dataplane/nftables/fake.ts (FakeNftables) is exported by nftables/mod.ts, which nothing in the program
  // imports: it is not in the graph, and this assertion keeps it out.
  assert.deepEqual(files.filter(isTestCode), []);
  // client-node's model types reach render only as lib/cli/api_schema.json (scripts/gen_api_schema.ts).
  assert.deepEqual(all.filter((s) => s.includes("client-node")), []);
});
