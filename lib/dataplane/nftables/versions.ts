/**
 * Version requirements of the nftables mode, as upstream states them: the `nft` binary must be
 * v1.0.1 or later (knftables.New: older nft parses the whole ruleset and can crash on other tables), and
 * the kernel 5.13 or later unless `KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK` is set to anything
 * non-empty (the kernel stands in for the host's nft version, https://issues.k8s.io/122743). Only the
 * parsing and comparing live here; wiring comes with the mode.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import { NftablesError } from "./errors.ts";

/** Oldest `nft` the mode accepts. */
export const MIN_NFT_VERSION: readonly number[] = [1, 0, 1];

/** Oldest kernel the mode accepts (upstream `utilkernel.NFTablesKubeProxyKernelVersion`). */
export const MIN_KERNEL_VERSION = "5.13";

/** The environment variable that skips the kernel check when non-empty. */
export const SKIP_KERNEL_CHECK_ENV = "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK";

/** Compares two dotted versions component by component (missing components count as 0). */
export function compareVersions(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d < 0 ? -1 : 1;
  }
  return 0;
}

/**
 * Parses `nft --version` output (`nftables v1.0.6 (Lester Gooch #5)`).
 * @returns the version components, or undefined when the output has no version
 */
export function parseNftVersion(output: string): number[] | undefined {
  const m = /^nftables v(\d+(?:\.\d+)*)/.exec(output.trim());
  return m ? m[1].split(".").map(Number) : undefined;
}

/**
 * Runs `nft --version` and checks it against {@linkcode MIN_NFT_VERSION}.
 * @returns the version text, e.g. `1.0.6`
 * @throws {NftablesError} when nft cannot run, prints no version, or is too old
 */
export async function checkNftVersion(runner: CommandRunner, nft = "nft"): Promise<string> {
  let out: string;
  try {
    out = (await runner.run({ cmd: nft, args: ["--version"], timeoutMs: 30_000 })).stdout;
  } catch (err) {
    throw new NftablesError(`could not run nftables command: ${(err as Error).message}`, { cause: err });
  }
  const v = parseNftVersion(out);
  if (!v) throw new NftablesError(`could not parse nft version from ${JSON.stringify(out.trim())}`);
  if (compareVersions(v, MIN_NFT_VERSION) < 0) {
    throw new NftablesError(`nft version must be v${MIN_NFT_VERSION.join(".")} or later (got ${out.trim()})`);
  }
  return v.join(".");
}

/**
 * Parses a kernel release (`6.18.44-fc-v1147`) the way apimachinery's `version.ParseGeneric` does: the
 * leading dotted numbers, at least two of them, no leading zero in the first; the rest is ignored.
 * @returns the components, or undefined when the release is not a version
 */
export function parseKernelVersion(release: string): number[] | undefined {
  const m = /^\s*v?([0-9]+(?:\.[0-9]+)*)/.exec(release);
  if (!m) return undefined;
  const parts = m[1].split(".");
  if (parts.length < 2) return undefined;
  if (parts[0].length > 1 && parts[0].startsWith("0")) return undefined;
  return parts.map(Number);
}

/**
 * Upstream's kernel check for the nftables mode.
 * @param release the kernel release (`Deno.osRelease()`, or /proc/sys/kernel/osrelease)
 * @param skip the value of {@linkcode SKIP_KERNEL_CHECK_ENV} (undefined when unset)
 * @returns the error message upstream would fail with, or undefined when the kernel is fine
 */
export function kernelVersionProblem(release: string, skip: string | undefined): string | undefined {
  if (skip !== undefined && skip !== "") return undefined;
  const v = parseKernelVersion(release.trim());
  if (!v) {
    return `could not check kernel version: failed to parse kernel version: illegal version string ${
      JSON.stringify(release.trim())
    }`;
  }
  if (compareVersions(v, MIN_KERNEL_VERSION.split(".").map(Number)) < 0) {
    return `kube-proxy in nftables mode requires kernel ${MIN_KERNEL_VERSION} or later`;
  }
  return undefined;
}
