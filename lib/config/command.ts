/**
 * The `kube-proxy` command line, end to end: parse flags, print help/version, load `--config`, validate,
 * `--write-config-to`, configure logging, and return the resolved ProxyOptions.
 *
 * Output and exit codes:
 * - `--help` / `-h`: help on stdout, exit 0. `--version`: `Kubernetes <version>` on stdout, exit 0.
 * - Flag errors: cobra's usage then `Error: <pflag message>` on stderr, exit 2 (upstream's cli.Run exits 1;
 *   2 is the conventional usage-error code and lets scripts tell the two apart).
 * - Config load, completion and validation errors: `Error: failed complete: ...` / `Error: failed validate: ...`
 *   (every validation error, upstream's aggregate format) on stderr, exit 1.
 * @module
 */

import { configureLogging, log } from "../log.ts";
import { formatDuration } from "./duration.ts";
import { FlagError, type FlagSet, HelpRequested } from "./flag_set.ts";
import { writeConfigFile } from "./load.ts";
import { AGENT_ONLY_FLAGS, buildProxyOptions, Options, type ProxyOptions } from "./options.ts";
import { aggregateMessage } from "./validate.ts";
import { GIT_VERSION } from "./version.ts";

export type { ApiSource, EffectiveProxyMode, ProxyOptions } from "./options.ts";

/** Where the command writes; defaults to the process's stdout and stderr. */
export interface CommandIO {
  stdout(s: string): void;
  stderr(s: string): void;
  /** The machine hostname (defaults to Deno.hostname()); injectable for tests. */
  hostname?: () => string;
}

/**
 * A subcommand (`kube-proxy render`, `kube-proxy explain`) that takes the agent's flags and configuration plus
 * flags of its own, parsed by the same flag set so that the two cannot drift apart.
 */
export interface Subcommand {
  /** The word after `kube-proxy`. */
  readonly name: string;
  /** What `--help` prints before the flags. */
  readonly description: string;
  /** Registers the subcommand's own flags on the agent's flag set. */
  addFlags(fs: FlagSet): void;
}

/** Either the process should exit with `exit`, or it should run with `options`. */
export type CommandResult = { exit: number } | { options: ProxyOptions };

const encoder = new TextEncoder();
const defaultIO: CommandIO = {
  stdout: (s) => Deno.stdout.writeSync(encoder.encode(s)),
  stderr: (s) => Deno.stderr.writeSync(encoder.encode(s)),
};

function versionInfoRaw(v: string): string {
  const m = /^v(\d+)\.(\d+)/.exec(v);
  return `version.Info{Major:"${m?.[1] ?? ""}", Minor:"${m?.[2] ?? ""}", GitVersion:"${v}", GitCommit:"", ` +
    `GitTreeState:"", BuildDate:"", GoVersion:"deno ${Deno.version.deno}", Compiler:"deno", ` +
    `Platform:"${Deno.build.os}/${Deno.build.arch}"}\n`;
}

/**
 * Every flag's value for `/flagz`, as upstream reads them after Complete(): without `--config` the flags are
 * bound to the configuration in use, so upstream's platformApplyDefaults shows through them (mode
 * `iptables`, detectLocalMode `ClusterCIDR`, `primary` NodePort addresses in nftables mode).
 */
function flagzValues(o: Options): Record<string, string> {
  const agentOnly: readonly string[] = AGENT_ONLY_FLAGS;
  const flags: Record<string, string> = Object.fromEntries(
    o.fs.all().filter((f) => !agentOnly.includes(f.name)).map((f) => [f.name, f.value.string()]),
  );
  if (o.configFile === "") {
    if (flags["proxy-mode"] === "") flags["proxy-mode"] = "iptables";
    if (flags["detect-local-mode"] === "") flags["detect-local-mode"] = "ClusterCIDR";
    if (flags["proxy-mode"] === "nftables" && flags["nodeport-addresses"] === "[]") {
      flags["nodeport-addresses"] = "[primary]";
    }
  }
  return flags;
}

/**
 * Parses `argv` (without the program name) as upstream `kube-proxy` does. Returns `{ exit }` when the process
 * should stop (help, version, errors, `--write-config-to`), otherwise `{ options }` for the agent to run with.
 * With `sub`, argv is a subcommand's (without its name): the agent's flags plus the subcommand's own.
 */
export async function parseCommandLine(
  argv: string[],
  io: CommandIO = defaultIO,
  sub?: Subcommand,
): Promise<CommandResult> {
  const o = new Options();
  o.fs.output = io.stderr;
  if (sub) {
    o.commandName = `kube-proxy ${sub.name}`;
    o.description = sub.description;
    sub.addFlags(o.fs);
  }
  try {
    o.parse(argv);
  } catch (e) {
    if (e instanceof HelpRequested) {
      io.stdout(o.helpText());
      return { exit: 0 };
    }
    if (e instanceof FlagError) {
      io.stderr(o.usage() + "\n");
      io.stderr(`Error: ${e.message}\n`);
      return { exit: 2 };
    }
    throw e;
  }
  if (o.help) {
    io.stdout(o.helpText());
    return { exit: 0 };
  }
  // --version=vX.Y.Z only overrides the reported version (verflag) and keeps running.
  if (o.version === "true" || o.version === "raw") {
    io.stdout(o.version === "raw" ? versionInfoRaw(GIT_VERSION) : `Kubernetes ${GIT_VERSION}\n`);
    return { exit: 0 };
  }
  const positional = o.fs.args.filter((a) => a.length > 0);
  if (positional.length > 0) {
    io.stderr(`Error: "${o.commandName}" does not take any arguments, got ${JSON.stringify(o.fs.args)}\n`);
    return { exit: 2 };
  }

  try {
    await o.complete();
  } catch (e) {
    // ConfigLoadError, read errors, "empty hostname-override is invalid", refused feature gates.
    io.stderr(`Error: failed complete: ${(e as Error).message}\n`);
    return { exit: 1 };
  }

  const l = o.config.logging;
  if (l.format === "text" || l.format === "json") {
    configureLogging({ format: l.format, verbosity: l.verbosity });
  }
  for (const w of o.featureGateWarnings) log.info(w.message, { featureGate: w.featureGate, value: w.value });
  if (log.v(1).enabled) {
    for (const f of o.fs.all()) log.v(1).info(`FLAG: --${f.name}=${JSON.stringify(f.value.string())}`);
  }

  const errs = o.validate();
  if (errs.length > 0) {
    io.stderr(`Error: failed validate: ${aggregateMessage(errs)}\n`);
    return { exit: 1 };
  }

  if (o.writeConfigTo !== "") {
    try {
      await writeConfigFile(o.writeConfigTo, o.config);
    } catch (e) {
      // The daemon holds no write permission (docs/operations.md, "Threat model"): this one-shot action asks.
      const hint = e instanceof Deno.errors.NotCapable
        ? ` (the agent runs without write permission; grant this file only: DKP_EXTRA_PERMISSIONS=--allow-write=${o.writeConfigTo} deno task start ..., or deno run --allow-write=${o.writeConfigTo} ...)`
        : "";
      io.stderr(`Error: ${(e as Error).message}${hint}\n`);
      return { exit: 1 };
    }
    log.info("Wrote configuration", { file: o.writeConfigTo });
    return { exit: 0 };
  }

  let options: ProxyOptions;
  try {
    options = buildProxyOptions(o, io.hostname ?? (() => Deno.hostname()));
  } catch (e) {
    io.stderr(`Error: ${(e as Error).message}\n`);
    return { exit: 1 };
  }
  options.flagz = flagzValues(o);
  log.v(2).info("Effective proxy settings", {
    mode: options.mode,
    syncPeriod: formatDuration(options.syncPeriod),
    minSyncPeriod: formatDuration(options.minSyncPeriod),
    masqueradeAll: options.masqueradeAll,
    masqueradeBit: options.masqueradeBit,
  });
  return { options };
}
