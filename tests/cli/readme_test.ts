/**
 * The README's `render` and `explain` examples stay true: each command shown (in full, not abbreviated with
 * `...`) is run, and every output line the README shows must appear in the real output, in the same order.
 */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import { runCli } from "./helpers.ts";

configureLogging({ sink: () => {} });

interface Example {
  argv: string[];
  shown: string[];
}

function examples(readme: string): Example[] {
  const lines = readme.split("\n");
  const out: Example[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!lines[i].startsWith("    $ deno task start ")) continue;
    let cmd = lines[i].slice("    $ deno task start ".length);
    while (cmd.endsWith("\\")) cmd = cmd.slice(0, -1) + lines[++i].trim();
    const shown: string[] = [];
    for (i++; i < lines.length && (lines[i].startsWith("    ") || lines[i] === ""); i++) {
      if (lines[i].startsWith("    $ ")) break;
      shown.push(lines[i].slice(4));
    }
    i--;
    if (cmd.split(/\s+/).includes("...")) continue; // abbreviated
    out.push({
      argv: cmd.split(/\s+/).filter((w) => w !== ""),
      shown: shown.filter((l) => l.trim() !== "..."),
    });
  }
  return out;
}

Deno.test("README: the render and explain examples print what the README shows", async () => {
  const readme = await Deno.readTextFile(`${PROJECT_ROOT}README.md`);
  const list = examples(readme);
  assert.ok(list.length >= 3, `found ${list.length} examples`);
  const cwd = Deno.cwd();
  Deno.chdir(PROJECT_ROOT);
  try {
    for (const ex of list) {
      const r = await runCli(ex.argv);
      const actual = (r.stderr + r.stdout).split("\n").map((l) => l.trimEnd());
      let at = 0;
      for (const want of ex.shown.map((l) => l.trimEnd())) {
        if (want === "") continue;
        const found = actual.indexOf(want, at);
        assert.ok(
          found >= 0,
          `${ex.argv.join(" ")}: README line not in the output (in order):\n${want}\n\n${actual.join("\n")}`,
        );
        at = found + 1;
      }
    }
  } finally {
    Deno.chdir(cwd);
  }
});
