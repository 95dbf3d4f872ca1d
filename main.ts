/**
 * The `kube-proxy` command: parse, validate, wire, run; or the `render` / `explain` subcommand (lib/cli/). No
 * logic lives here.
 * @module
 */
import { parseCommandLine } from "./lib/config/command.ts";
import { platformInit, runAgent, runCleanup } from "./lib/agent.ts";
import { DenoCommandRunner } from "./lib/exec.ts";
import { KubeConfigError } from "./lib/kube/kubeconfig.ts";
import { log } from "./lib/log.ts";
import { isSubcommand } from "./lib/cli/subcommands.ts";

if (import.meta.main && isSubcommand(Deno.args)) {
  // render / explain: loaded only when named, so that the agent's start path stays as it is.
  const { runSubcommand } = await import("./lib/cli/run.ts");
  Deno.exit(await runSubcommand(Deno.args));
}

if (import.meta.main) {
  const parsed = await parseCommandLine(Deno.args);
  if ("exit" in parsed) Deno.exit(parsed.exit);
  const opts = parsed.options;
  if (opts.cleanup) Deno.exit(await runCleanup());
  if (opts.initOnly) {
    await platformInit(opts, new DenoCommandRunner());
    Deno.exit(0);
  }
  try {
    const agent = await runAgent(opts);
    Deno.exit(await agent.done);
  } catch (err) {
    if (err instanceof KubeConfigError) log.error("Invalid kubeconfig", err);
    else log.error("Error running ProxyServer", err);
    Deno.exit(1);
  }
}
