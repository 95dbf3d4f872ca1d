/**
 * The command line against upstream kube-proxy v1.37.2's own binary (built by scripts/build_k8s.sh): the
 * `--help` flags and feature gate list, and the refusal of an unknown gate, by `deno task start` itself.
 */
import assert from "node:assert/strict";
import { k8sBinary, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import {
  DEFAULTS_DIFFERING_FROM_UPSTREAM,
  KNOWN_FEATURES,
  knownFeatures,
} from "../../lib/config/feature_gates.ts";

const unavailable = kubeApiServerUnavailableReason(["kube-proxy"]);

async function run(cmd: string, args: string[], cwd?: string) {
  const o = await new Deno.Command(cmd, {
    args,
    cwd,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  })
    .output();
  const dec = new TextDecoder();
  return { code: o.code, stdout: dec.decode(o.stdout), stderr: dec.decode(o.stderr) };
}

/** `--name` of every flag line of a cobra/pflag usage text. */
function flagNames(help: string): string[] {
  return [...help.matchAll(/^\s+(?:-\w, )?--([a-z0-9-]+)/gm)].map((m) => m[1]).sort();
}

Deno.test({
  name: "--help lists upstream v1.37.2's flags, and its feature gate lines verbatim",
  ignore: unavailable !== undefined,
  async fn() {
    const upstream = await run(k8sBinary("kube-proxy"), ["--help"]);
    const ours = await run(Deno.execPath(), ["task", "-q", "start", "--help"], PROJECT_ROOT);
    assert.equal(upstream.code, 0);
    assert.equal(ours.code, 0, ours.stderr);
    const names = flagNames(upstream.stdout);
    assert.equal(names.length, 55, "upstream v1.37.2 has 55 flags");
    assert.deepEqual(flagNames(ours.stdout), names);
    const gateLines = (s: string) =>
      s.split("\n").map((l) => l.trim()).filter((l) => /^\w+=true\|false \(/.test(l));
    // Upstream's text with this agent's documented default differences applied: nothing else may differ.
    const withOurDefaults = (line: string) => {
      const own = DEFAULTS_DIFFERING_FROM_UPSTREAM[line.slice(0, line.indexOf("="))];
      return own === undefined ? line : line.replace(/default=(true|false)\)$/, `default=${own})`);
    };
    const differing = gateLines(upstream.stdout).filter((l) => withOurDefaults(l) !== l);
    assert.deepEqual(
      differing.map((l) => l.slice(0, l.indexOf("="))).sort(),
      Object.keys(DEFAULTS_DIFFERING_FROM_UPSTREAM).sort(),
      "every documented default difference is a real one",
    );
    assert.deepEqual(gateLines(ours.stdout), gateLines(upstream.stdout).map(withOurDefaults));
    assert.equal(gateLines(upstream.stdout).length, knownFeatures().length);
    // The whole text, line for line, once both are trimmed of the column padding.
    const lines = (s: string) => s.split("\n").map((l) => l.trim()).filter((l) => l !== "");
    assert.deepEqual(lines(ours.stdout), lines(upstream.stdout).map(withOurDefaults));
  },
});

Deno.test({
  name: "deno task start --feature-gates=Bogus=true exits 1 with upstream's message, as upstream's binary",
  ignore: unavailable !== undefined,
  async fn() {
    const upstream = await run(k8sBinary("kube-proxy"), [
      "--feature-gates=Bogus=true",
      "--hostname-override=x",
    ]);
    assert.equal(upstream.code, 1);
    assert.match(upstream.stderr, /failed complete: unrecognized feature gate: Bogus/);
    const ours = await run(
      Deno.execPath(),
      ["task", "-q", "start", "--feature-gates=Bogus=true"],
      PROJECT_ROOT,
    );
    assert.equal(ours.code, upstream.code, ours.stderr);
    assert.match(ours.stderr, /failed complete: unrecognized feature gate: Bogus/);
  },
});

Deno.test({
  name: "a gate locked to its default is refused with upstream's message, as upstream's binary",
  ignore: unavailable !== undefined,
  async fn() {
    const locked = Object.entries(KNOWN_FEATURES).find(([, s]) => s.lockToDefault)!;
    assert.ok(locked, "the list has locked gates");
    const arg = `--feature-gates=${locked[0]}=${!locked[1].default}`;
    const want = `cannot set feature gate ${locked[0]} to ${!locked[1].default}, feature is locked to ${
      locked[1].default
    }`;
    const upstream = await run(k8sBinary("kube-proxy"), [arg, "--hostname-override=x"]);
    assert.equal(upstream.code, 1);
    assert.ok(upstream.stderr.includes(want), upstream.stderr);
    const ours = await run(Deno.execPath(), ["task", "-q", "start", arg], PROJECT_ROOT);
    assert.equal(ours.code, 1, ours.stderr);
    assert.ok(ours.stderr.includes(`failed complete: ${want}`), ours.stderr);
  },
});
