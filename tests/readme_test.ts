/**
 * The README's commands, literally: every command in its code blocks is recognised and checked, so the
 * README cannot drift from the repository. Cheap ones run (`deno task start --help`, `--version`); the
 * demo, the full test suite and `deno task compile` are only checked to exist and parse (not run
 * recursively); agent command lines are checked against the agent's own flag parser. The README must not
 * point at files outside the repository.
 */
import assert from "node:assert/strict";
import { PROJECT_ROOT } from "../testkit/agent_command.ts";
import { Options } from "../lib/config/options.ts";

const readme = await Deno.readTextFile(`${PROJECT_ROOT}README.md`);
const denoJson = JSON.parse(await Deno.readTextFile(`${PROJECT_ROOT}deno.json`));

/**
 * Lines of indented (4 spaces, after a blank line) and fenced code blocks; ```text blocks are listings and an
 * indented block that starts with `$ ` is a transcript, both skipped.
 */
export function codeBlockLines(md: string): string[] {
  const out: string[] = [];
  const lines = md.split("\n");
  let fenced = false;
  let prose = false; // a ```text block (a listing, not commands)
  let indented = false;
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    if (/^```/.test(l)) {
      fenced = !fenced;
      prose = fenced && /^```\s*text\b/.test(l);
      continue;
    }
    if (fenced) {
      if (prose) continue;
      if (l.trim()) out.push(l.trim());
      continue;
    }
    if (/^ {4}\S/.test(l) && (indented || lines[i - 1]?.trim() === "")) {
      if (!indented && l.startsWith("    $ ")) {
        // A transcript (`$ command` then its output): tests/cli/readme_test.ts runs it and compares.
        while (i + 1 < lines.length && (lines[i + 1].startsWith("    ") || lines[i + 1].trim() === "")) i++;
        continue;
      }
      indented = true;
      out.push(l.trim());
      continue;
    }
    if (l.trim() !== "") indented = false;
  }
  return out;
}

/** Splits a shell command into words: double/single quotes, `$(hostname)` and `$HOME` expanded. */
function shellWords(cmd: string): string[] {
  const expanded = cmd.replaceAll("$(hostname)", "node1").replaceAll(
    "$HOME",
    Deno.env.get("HOME") ?? "/root",
  );
  const words: string[] = [];
  // A word is a run of unquoted characters and quoted parts ("a"b'c' is one word: abc).
  for (const m of expanded.matchAll(/(?:"[^"]*"|'[^']*'|[^\s"']+)+/g)) {
    words.push(m[0].replace(/"([^"]*)"|'([^']*)'/g, (_, d, q) => d ?? q));
  }
  return words;
}

async function run(cmd: string, args: string[], env: Record<string, string> = {}) {
  const out = await new Deno.Command(cmd, { args, cwd: PROJECT_ROOT, env, stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** Checks one README command; returns what was done, for the test's log. */
async function check(command: string): Promise<string> {
  const words = shellWords(command);
  const env: Record<string, string> = {};
  while (words.length > 0 && /^[A-Z_][A-Z0-9_]*=/.test(words[0])) {
    const [k, ...v] = words.shift()!.split("=");
    env[k] = v.join("=");
  }
  const [prog, ...args] = words;
  if (prog === "bash" && args.length === 1 && /^scripts\/[\w-]+\.sh$/.test(args[0])) {
    const r = await run("bash", ["-n", args[0]]);
    assert.equal(r.code, 0, `${command}: ${r.stderr}`);
    return "exists and parses (not run)";
  }
  if (prog === "export" && args.length === 1 && args[0].startsWith("PATH=")) {
    const dir = args[0].slice("PATH=".length).split(":")[0];
    const install = await Deno.readTextFile(`${PROJECT_ROOT}scripts/install.sh`);
    assert.ok(install.includes("DKP_TOOLS=${DKP_TOOLS:-$HOME/.cache/deno-kube-proxy}"), "install.sh default");
    assert.ok(install.includes('ln -sf "$deno_bin" "$DKP_TOOLS/bin/deno"'), "install.sh links bin/deno");
    assert.equal(dir, `${Deno.env.get("HOME")}/.cache/deno-kube-proxy/bin`);
    if (!Deno.env.get("DKP_TOOLS")) {
      const st = await Deno.stat(`${dir}/deno`);
      assert.ok(st.isFile && (st.mode ?? 0) & 0o111, `${dir}/deno is executable`);
    }
    return "the directory install.sh links deno into";
  }
  assert.equal(prog, "deno", `README command not understood by tests/readme_test.ts: ${command}`);
  for (const k of Object.keys(env)) {
    assert.equal(k, "DKP_EXTRA_PERMISSIONS", `${command}: unexpected variable ${k}`);
  }
  if (args[0] === "test") {
    const paths = args.filter((a) => !a.startsWith("-")).slice(1);
    assert.ok(paths.length > 0, command);
    for (const p of paths) await Deno.stat(`${PROJECT_ROOT}${p}`);
    return "test paths exist (not run)";
  }
  assert.equal(args[0], "task", `README command not understood: ${command}`);
  const task = args[1];
  assert.ok(denoJson.tasks[task], `deno task ${task} does not exist`);
  const taskDef = denoJson.tasks[task];
  const taskCommand: string = typeof taskDef === "string" ? taskDef : taskDef.command;
  if (env.DKP_EXTRA_PERMISSIONS !== undefined) {
    assert.ok(taskCommand.includes("$DKP_EXTRA_PERMISSIONS"), `task ${task} ignores the variable`);
    assert.match(env.DKP_EXTRA_PERMISSIONS, /^--allow-run=\/\S+$/, "grants exactly one program");
  }
  const agentArgs = args.slice(2);
  if (task !== "start") {
    assert.deepEqual(agentArgs, [], command);
    return "task exists (not run)";
  }
  assert.ok(!agentArgs.includes("--"), `${command}: Deno 2 passes "--" on to the agent, which refuses it`);
  if (agentArgs.every((a) => a === "--help" || a === "--version")) {
    const r = await run(Deno.execPath(), args, { NO_COLOR: "1", ...env });
    assert.equal(r.code, 0, `${command} exited ${r.code}: ${r.stderr}`);
    if (agentArgs.includes("--help")) assert.match(r.stdout, /Usage:\s+kube-proxy \[flags\]/);
    else assert.match(r.stdout, /^Kubernetes v\d+\.\d+\.\d+/);
    return "ran, exit 0";
  }
  // An agent command line: every flag must exist and there must be no positional argument.
  const o = new Options();
  o.fs.output = () => {};
  o.parse(agentArgs);
  assert.deepEqual(o.fs.args.filter((a) => a !== ""), [], `${command}: positional arguments`);
  return "flags parse with the agent's parser (not run)";
}

Deno.test("README: every command in its code blocks is understood and checked; the cheap ones run", async (t) => {
  const commands = codeBlockLines(readme);
  assert.ok(commands.length >= 8, `found ${commands.length} commands`);
  for (const c of ["bash scripts/test.sh", "bash scripts/demo.sh", "deno task start --help"]) {
    assert.ok(commands.includes(c), `README shows ${c}`);
  }
  for (const command of commands) {
    await t.step(command, async () => {
      await check(command);
    });
  }
});

Deno.test("README: no pointer to files outside the repository, and every repository path it names exists", async () => {
  assert.ok(!/\.\.\//.test(readme), "a ../ path");
  assert.ok(!/\/work\//.test(readme), "an absolute path of this machine");
  const paths = new Set<string>();
  for (
    const m of readme.matchAll(/`((?:lib|testkit|tests|scripts|docs|deploy|examples|bench)\/[\w./-]*)`/g)
  ) {
    paths.add(m[1]);
  }
  for (const f of ["Dockerfile", "main.ts"]) if (readme.includes(`\`${f}\``)) paths.add(f);
  assert.ok(paths.size >= 5, [...paths].join(", "));
  for (const p of paths) {
    await Deno.stat(`${PROJECT_ROOT}${p}`).catch(() =>
      assert.fail(`README names ${p}, which does not exist`)
    );
  }
});

Deno.test("README: the code-block reader finds indented and fenced blocks, not indented list text", () => {
  const md =
    "text\n\n    bash scripts/a.sh\n    deno task b\n\n- item\n    continued\n\n```\ndeno task c\n```\n";
  assert.deepEqual(codeBlockLines(md), ["bash scripts/a.sh", "deno task b", "deno task c"]);
});
