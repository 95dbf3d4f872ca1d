/**
 * Feature gates kube-proxy knows about (the subset of Kubernetes' gates that matter to it, v1.35).
 * @module
 */

/** Maturity of a gate, as featuregate.PreRelease. */
export type PreRelease = "ALPHA" | "BETA" | "GA" | "DEPRECATED";

/** One feature gate's spec. */
export interface FeatureSpec {
  default: boolean;
  preRelease: PreRelease;
}

/** Known gates. Unknown names are accepted with a warning (see `checkFeatureGates`). */
export const KNOWN_FEATURES: Record<string, FeatureSpec> = {
  AllAlpha: { default: false, preRelease: "ALPHA" },
  AllBeta: { default: false, preRelease: "BETA" },
  ComponentFlagz: { default: false, preRelease: "ALPHA" },
  ComponentStatusz: { default: false, preRelease: "ALPHA" },
  ContextualLogging: { default: true, preRelease: "BETA" },
  LoggingAlphaOptions: { default: false, preRelease: "ALPHA" },
  LoggingBetaOptions: { default: true, preRelease: "BETA" },
  MultiCIDRServiceAllocator: { default: true, preRelease: "GA" },
  NFTablesProxyMode: { default: true, preRelease: "GA" },
  PreferSameTrafficDistribution: { default: true, preRelease: "BETA" },
  ServiceTrafficDistribution: { default: true, preRelease: "GA" },
  TopologyAwareHints: { default: true, preRelease: "GA" },
  // client-go's gate (upstream default true since v1.35). Here off by default: per agent start, LIST + gzip
  // measured cheaper for the API server than watch-list (docs/benchmarks.md, "API server cost of every agent").
  WatchListClient: { default: false, preRelease: "BETA" },
};

/** featuregate's KnownFeatures(): `Name=true|false (BETA - default=true)`, sorted, GA and deprecated left out. */
export function knownFeatures(): string[] {
  return Object.entries(KNOWN_FEATURES)
    .filter(([, s]) => s.preRelease !== "GA" && s.preRelease !== "DEPRECATED")
    .map(([name, s]) => `${name}=true|false (${s.preRelease} - default=${s.default})`)
    .sort();
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

/**
 * Returns warnings for gates upstream would treat specially: names kube-proxy does not know (upstream's binary
 * knows every Kubernetes gate, so these are accepted rather than rejected) and GA gates being set.
 */
export function checkFeatureGates(gates: Record<string, boolean>): string[] {
  const warnings: string[] = [];
  for (const [k, v] of Object.entries(gates).sort()) {
    const spec = KNOWN_FEATURES[k];
    if (!spec) warnings.push(`unrecognized feature gate: ${k}`);
    else if (spec.preRelease === "GA") {
      warnings.push(`Setting GA feature gate ${k}=${v}. It will be removed in a future release.`);
    }
  }
  return warnings;
}
