/**
 * Generates lib/config/feature_gate_list.ts from upstream kube-proxy's own binary (v1.37.2, built by
 * scripts/build_k8s.sh), so that the agent knows the same gates, stages and defaults:
 *
 * 1. `kube-proxy --help`: the `--feature-gates` usage lists every ALPHA and BETA gate with its default, one
 *    line each, sorted (featuregate's KnownFeatures()); the lines are kept verbatim for our `--help`.
 * 2. `/metrics` of upstream kube-proxy started against the real kube-apiserver in a sandbox namespace:
 *    `kubernetes_feature_enabled{name,stage}` names every gate the binary knows, GA (`stage=""`) and
 *    DEPRECATED ones included, with its value (no gate set: its default).
 * 3. `kube-proxy --feature-gates=<every GA and DEPRECATED gate set against its default>`: the gates locked
 *    to their default are the ones upstream refuses (`cannot set feature gate X to Y, feature is locked to Z`);
 *    the run stops in option completion, before touching anything.
 *
 * Usage (as root; writes the module and prints a summary):
 *   deno run --allow-all scripts/gen_feature_gates.ts
 * @module
 */

import { K8S_VERSION, k8sBinary, KubeApiServer } from "../testkit/kube_apiserver.ts";
import { Sandbox } from "../testkit/sandbox.ts";
import {
  featureEnabledSamples,
  prepareProxyUser,
  startUpstreamProxy,
  waitForListener,
} from "../testkit/upstream_listener.ts";

const OUT = new URL("../lib/config/feature_gate_list.ts", import.meta.url);

type Stage = "ALPHA" | "BETA" | "GA" | "DEPRECATED";
interface Gate {
  default: boolean;
  preRelease: Stage;
  lockToDefault: boolean;
}

/** The `--feature-gates` usage lines of `kube-proxy --help` (`Name=true|false (STAGE - default=X)`). */
export function helpGateLines(help: string): string[] {
  const lines = help.split("\n");
  const start = lines.findIndex((l) => /^\s*--feature-gates\b/.test(l));
  if (start < 0) throw new Error("no --feature-gates in the help text");
  const out: string[] = [];
  for (const l of lines.slice(start + 1)) {
    const t = l.trim();
    if (/^[A-Za-z0-9]+=true\|false \(/.test(t)) out.push(t);
    else if (out.length > 0) break;
  }
  return out;
}

async function run(cmd: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const o = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { code: o.code, stdout: dec.decode(o.stdout), stderr: dec.decode(o.stderr) };
}

async function main(): Promise<void> {
  const bin = k8sBinary("kube-proxy");
  const help = await run(bin, ["--help"]);
  const helpLines = helpGateLines(help.stdout + help.stderr);
  const gates = new Map<string, Gate>();
  for (const line of helpLines) {
    const m = /^([A-Za-z0-9]+)=true\|false \((ALPHA|BETA) - default=(true|false)\)/.exec(line);
    if (!m) throw new Error(`unexpected gate line: ${line}`);
    gates.set(m[1], { default: m[3] === "true", preRelease: m[2] as Stage, lockToDefault: false });
  }

  // 2. The full list from the running binary's metric.
  await using api = await KubeApiServer.start({ tokenUsers: ["gen-gates"] });
  await using sb = await Sandbox.create();
  await api.attach(sb.node);
  await prepareProxyUser(api, "gen-gates", sb);
  const kubeconfig = await api.writeKubeconfig({ token: api.tokens.get("gen-gates") });
  const proc = startUpstreamProxy(sb, kubeconfig, ["--proxy-mode=iptables"]);
  let samples: ReturnType<typeof featureEnabledSamples> = [];
  try {
    const deadline = Date.now() + 60_000;
    while (samples.length === 0) {
      const r = await waitForListener(sb, sb.node, "http://127.0.0.1:10249/metrics", proc);
      samples = featureEnabledSamples(r.body);
      if (samples.length === 0) {
        if (Date.now() > deadline) throw new Error("no kubernetes_feature_enabled samples");
        await new Promise((r) => setTimeout(r, 500));
      }
    }
  } finally {
    await proc.stop(5000);
  }
  for (const s of samples) {
    const stage: Stage = s.stage === "" ? "GA" : s.stage as Stage;
    const known = gates.get(s.name);
    if (known) {
      if (known.preRelease !== stage || known.default !== s.enabled) {
        throw new Error(
          `${s.name}: --help says ${known.preRelease}/${known.default}, /metrics ${stage}/${s.enabled}`,
        );
      }
      continue;
    }
    if (stage === "ALPHA" || stage === "BETA") {
      // Hidden from --help only when its help string is empty, which ALPHA/BETA never are (AllAlpha/AllBeta
      // are listed too): a mismatch means the parsing is wrong.
      throw new Error(`${s.name} (${stage}) is in /metrics but not in --help`);
    }
    gates.set(s.name, { default: s.enabled, preRelease: stage, lockToDefault: false });
  }

  // 3. Which GA/DEPRECATED gates are locked to their default.
  const hidden = [...gates].filter(([, g]) => g.preRelease === "GA" || g.preRelease === "DEPRECATED");
  const flip = hidden.map(([n, g]) => `${n}=${!g.default}`).join(",");
  const r = await run(bin, [`--feature-gates=${flip}`, "--hostname-override=x", "--cleanup=false", "--v=0"]);
  for (const m of r.stderr.matchAll(/cannot set feature gate (\w+) to (true|false), feature is locked to/g)) {
    const g = gates.get(m[1]);
    if (!g) throw new Error(`locked gate ${m[1]} unknown`);
    g.lockToDefault = true;
  }
  if (!/failed complete/.test(r.stderr)) {
    throw new Error(`the locked-gate probe did not fail as expected:\n${r.stderr}`);
  }

  const names = [...gates.keys()].sort();
  const body = names.map((n) => {
    const g = gates.get(n)!;
    return `  ${n}: { default: ${g.default}, preRelease: "${g.preRelease}"${
      g.lockToDefault ? ", lockToDefault: true" : ""
    } },`;
  });
  const text = `/**
 * Every feature gate upstream kube-proxy v${K8S_VERSION}'s binary knows (the shared list of all components), with
 * its stage, default and lock. GENERATED by scripts/gen_feature_gates.ts from the binary's \`--help\`, its
 * \`kubernetes_feature_enabled\` metric and its answer to locked gates: do not edit by hand.
 * @module
 */

import type { FeatureSpec } from "./feature_gates.ts";

/** Upstream's release the list was read from. */
export const FEATURE_GATES_VERSION = "v${K8S_VERSION}";

/** Every gate, by name. */
export const UPSTREAM_FEATURE_GATES: Readonly<Record<string, FeatureSpec>> = {
${body.join("\n")}
};

/** The \`--feature-gates\` usage lines of upstream's \`--help\`, verbatim (ALPHA and BETA gates, sorted). */
export const UPSTREAM_KNOWN_FEATURES: readonly string[] = [
${helpLines.map((l) => `  ${JSON.stringify(l)},`).join("\n")}
];
`;
  await Deno.writeTextFile(OUT, text);
  const count = (s: Stage) => [...gates.values()].filter((g) => g.preRelease === s).length;
  console.log(
    `${names.length} gates (${count("ALPHA")} alpha, ${count("BETA")} beta, ${count("GA")} GA, ` +
      `${count("DEPRECATED")} deprecated; ${
        [...gates.values()].filter((g) => g.lockToDefault).length
      } locked), ` +
      `${helpLines.length} --help lines -> ${OUT.pathname}`,
  );
}

if (import.meta.main) await main();
