/**
 * Version information printed by `--version`.
 * @module
 */

/** The upstream Kubernetes release whose kube-proxy behaviour this agent follows. */
export const KUBERNETES_VERSION = "v1.37.2";

/** This project's own version. */
export const AGENT_VERSION = "0.1.0";

/** The git version string reported by `--version` (semver build suffix naming this implementation). */
export const GIT_VERSION = `${KUBERNETES_VERSION}-deno-kube-proxy-${AGENT_VERSION}`;

/** `major.minor` of the followed release, e.g. "1.37". */
export function minorVersion(): string {
  const m = /^v(\d+)\.(\d+)/.exec(KUBERNETES_VERSION)!;
  return `${m[1]}.${m[2]}`;
}

/** The only value `showHiddenMetricsForVersion` may take: the previous minor release, e.g. "1.36". */
export function previousMinorVersion(): string {
  const m = /^v(\d+)\.(\d+)/.exec(KUBERNETES_VERSION)!;
  return `${m[1]}.${Number(m[2]) - 1}`;
}
