import assert from "node:assert/strict";

const denoJson = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));

/** A task's command line (a task is a string, or an object with `command` and `description`). */
function taskCommand(task: string | { command: string }): string {
  return typeof task === "string" ? task : task.command;
}

function permissionFlags(task: string): string[] {
  return task.split(/\s+/).filter((w) => w.startsWith("--allow-"));
}

function runtimeFlags(task: string): string[] {
  return task.split(/\s+/).filter((w) => w.startsWith("--v8-flags="));
}

function allowRun(flags: string[]): Set<string> {
  const flag = flags.find((f) => f.startsWith("--allow-run="));
  return new Set(flag ? flag.slice("--allow-run=".length).split(",") : []);
}

async function* sourceFiles(dir: URL): AsyncGenerator<URL> {
  for await (const e of Deno.readDir(dir)) {
    if (e.isDirectory) yield* sourceFiles(new URL(`${e.name}/`, dir));
    else if (e.name.endsWith(".ts")) yield new URL(e.name, dir);
  }
}

Deno.test("start and compile tasks grant exactly the same permissions and V8 settings", () => {
  const compile = taskCommand(denoJson.tasks.compile);
  assert.deepEqual(permissionFlags(compile), permissionFlags(denoJson.tasks.start));
  assert.deepEqual(runtimeFlags(compile), runtimeFlags(denoJson.tasks.start));
  assert.ok(!denoJson.tasks.start.includes("--allow-all"), "the agent must not run with --allow-all");
});

Deno.test("every program the agent spawns is in --allow-run", async () => {
  const allowed = allowRun(permissionFlags(denoJson.tasks.start));
  const spawned = new Set<string>();
  for await (const file of sourceFiles(new URL("../lib/", import.meta.url))) {
    const text = await Deno.readTextFile(file);
    for (const m of text.matchAll(/\bcmd:\s*"([^"]+)"/g)) spawned.add(m[1]);
  }
  assert.ok(spawned.size > 0, "expected to find spawned programs in lib/");
  const missing = [...spawned].filter((c) => !allowed.has(c));
  assert.deepEqual(missing, [], `programs spawned but not allowed: ${missing.join(", ")}`);
});

Deno.test("the compile task documents DENORT_BIN and the Dockerfile passes it through as a build argument", async () => {
  const compile = denoJson.tasks.compile;
  assert.equal(typeof compile, "object", "compile is a task with a description");
  assert.match(compile.description, /DENORT_BIN/);
  const dockerfile = await Deno.readTextFile(new URL("../Dockerfile", import.meta.url));
  assert.match(dockerfile, /^ARG DENORT_BIN=?$/m);
  assert.match(dockerfile, /export DENORT_BIN=.*deno task compile/s);
});
