/**
 * The metrics every Kubernetes component serves through component-base: `kubernetes_build_info` (the
 * version this agent reports, `--version`'s) and `kubernetes_feature_enabled` (each known feature gate's
 * stage and effective value, as featuregate's AddMetrics records them at start-up).
 * @module
 */
import client from "prom-client";
import { COMPONENT_REGISTRIES } from "../metrics.ts";
import { GIT_VERSION, KUBERNETES_VERSION } from "../config/version.ts";
import { effectiveFeatures, KNOWN_FEATURES, type PreRelease } from "../config/feature_gates.ts";

/** `kubernetes_build_info{major,minor,git_version,...}`: constant 1. */
export const buildInfo = new client.Gauge({
  name: "kubernetes_build_info",
  help:
    "[BETA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree " +
    "state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it " +
    "is running.",
  labelNames: [
    "major",
    "minor",
    "git_version",
    "git_commit",
    "git_tree_state",
    "build_date",
    "go_version",
    "compiler",
    "platform",
  ] as const,
  registers: COMPONENT_REGISTRIES,
});

const [, major, minor] = /^v(\d+)\.(\d+)/.exec(KUBERNETES_VERSION)!;
const arch = Deno.build.arch === "x86_64"
  ? "amd64"
  : Deno.build.arch === "aarch64"
  ? "arm64"
  : Deno.build.arch;
// No git commit, tree state or build date is recorded in this build, and no Go toolchain built it: those
// labels are empty rather than made up; the compiler is Deno (its version in denokubeproxy_runtime_info).
buildInfo.set({
  major,
  minor,
  git_version: GIT_VERSION,
  git_commit: "",
  git_tree_state: "",
  build_date: "",
  go_version: "",
  compiler: "deno",
  platform: `${Deno.build.os}/${arch}`,
}, 1);

/** `kubernetes_feature_enabled{name,stage}`: 1 when the gate is on, 0 when off. */
export const featureEnabled = new client.Gauge({
  name: "kubernetes_feature_enabled",
  help: "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
  labelNames: ["name", "stage"] as const,
  registers: COMPONENT_REGISTRIES,
});

/** featuregate's stage label: its PreRelease string, empty for GA. */
export function stageLabel(p: PreRelease): string {
  return p === "GA" ? "" : p;
}

/** Records every known gate's stage and effective value under the given `--feature-gates` overrides. */
export function recordFeatureGates(overrides: Record<string, boolean>): void {
  featureEnabled.reset();
  const effective = effectiveFeatures(overrides);
  for (const [name, spec] of Object.entries(KNOWN_FEATURES)) {
    featureEnabled.set({ name, stage: stageLabel(spec.preRelease) }, effective[name] ? 1 : 0);
  }
}
