/**
 * Feature gates as upstream kube-proxy v1.37.2's binary knows them: every gate of the shared list (all
 * components', generated into feature_gate_list.ts from the binary by scripts/gen_feature_gates.ts), set from
 * `--feature-gates` / `featureGates` as component-base's SetFromMap: an unknown name is refused
 * (`unrecognized feature gate: Bogus`), a locked gate set against its default is refused, and setting a GA or
 * deprecated gate logs upstream's warning.
 * @module
 */

import { UPSTREAM_FEATURE_GATES, UPSTREAM_KNOWN_FEATURES } from "./feature_gate_list.ts";

/** Maturity of a gate, as featuregate.PreRelease (GA is the empty string upstream, e.g. in metric labels). */
export type PreRelease = "ALPHA" | "BETA" | "GA" | "DEPRECATED";

/** One feature gate's spec. */
export interface FeatureSpec {
  default: boolean;
  preRelease: PreRelease;
  /** Cannot be set to anything but its default. */
  lockToDefault?: boolean;
}

/**
 * Gates whose default here differs from upstream's, and why (docs/operations.md lists them too).
 * `WatchListClient` (client-go's; upstream's default is true): per agent start, LIST + gzip measured cheaper for
 * the API server than watch-list, also with the watch-list stream read gzip-compressed as upstream reads it: less
 * CPU, fewer bytes and a smaller peak RSS growth, each wave on a fresh kube-apiserver (docs/benchmarks.md, "API
 * server cost of every agent"), so watch-list is opt-in: `--feature-gates=WatchListClient=true`.
 */
export const DEFAULTS_DIFFERING_FROM_UPSTREAM: Readonly<Record<string, boolean>> = { WatchListClient: false };

/** Every gate upstream's binary knows, by name, with this agent's defaults. */
export const KNOWN_FEATURES: Readonly<Record<string, FeatureSpec>> = Object.fromEntries(
  Object.entries(UPSTREAM_FEATURE_GATES).map(([name, spec]) => {
    const own = DEFAULTS_DIFFERING_FROM_UPSTREAM[name];
    return [name, own === undefined ? spec : { ...spec, default: own }];
  }),
);

/** featuregate's KnownFeatures(): the `--feature-gates` usage lines as upstream's binary prints them, with this agent's defaults. */
export function knownFeatures(): string[] {
  return UPSTREAM_KNOWN_FEATURES.map((line) => {
    const name = line.slice(0, line.indexOf("="));
    const own = DEFAULTS_DIFFERING_FROM_UPSTREAM[name];
    return own === undefined ? line : line.replace(/default=(true|false)\)$/, `default=${own})`);
  });
}

/** The effective value of every known gate after applying `overrides` (AllAlpha/AllBeta as upstream). */
export function effectiveFeatures(overrides: Record<string, boolean>): Record<string, boolean> {
  const out: Record<string, boolean> = {};
  for (const [name, spec] of Object.entries(KNOWN_FEATURES)) {
    let v = spec.default;
    if (spec.preRelease === "ALPHA" && overrides.AllAlpha !== undefined && name !== "AllAlpha") {
      v = overrides.AllAlpha;
    }
    if (spec.preRelease === "BETA" && overrides.AllBeta !== undefined && name !== "AllBeta") {
      v = overrides.AllBeta;
    }
    out[name] = v;
  }
  for (const [k, v] of Object.entries(overrides)) out[k] = v;
  return out;
}

/** A gate setting upstream logs (at info level, as `logger.Info`). */
export interface FeatureGateWarning {
  message: string;
  featureGate: string;
  value: boolean;
}

/** `--feature-gates` refused as upstream's SetFromMap refuses it; the message is upstream's. */
export class FeatureGateError extends Error {}

/**
 * Upstream's SetFromMap: throws {@linkcode FeatureGateError} for an unknown gate (`unrecognized feature gate:
 * X`, the first one found: upstream stops there) or for gates locked to their default (`cannot set feature
 * gate X to Y, feature is locked to Z`, all of them, aggregated as `[a, b]`); returns the warnings for GA and
 * deprecated gates set. Names are visited in sorted order (upstream: Go map order).
 */
export function setFeatureGates(gates: Record<string, boolean>): FeatureGateWarning[] {
  const warnings: FeatureGateWarning[] = [];
  const errors: string[] = [];
  for (const [k, v] of Object.entries(gates).sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0)) {
    const spec = KNOWN_FEATURES[k];
    if (!spec) throw new FeatureGateError(`unrecognized feature gate: ${k}`);
    if (spec.lockToDefault && spec.default !== v) {
      errors.push(`cannot set feature gate ${k} to ${v}, feature is locked to ${spec.default}`);
      continue;
    }
    if (spec.preRelease === "DEPRECATED") {
      warnings.push({
        message: "Warning: setting deprecated feature gate. It will be removed in a future release.",
        featureGate: k,
        value: v,
      });
    } else if (spec.preRelease === "GA") {
      warnings.push({
        message: "Warning: setting GA feature gate. It will be removed in a future release.",
        featureGate: k,
        value: v,
      });
    }
  }
  if (errors.length === 1) throw new FeatureGateError(errors[0]);
  if (errors.length > 1) throw new FeatureGateError(`[${errors.join(", ")}]`);
  return warnings;
}
