/**
 * The agent's command line exactly as the `start` task in deno.json runs it (same permission flags), so
 * tests, the demo and the scale harness exercise the agent under its production permissions.
 * @module
 */

const root = new URL("../", import.meta.url);

/** Absolute path of the project root (ends with "/"). */
export const PROJECT_ROOT: string = root.pathname;

/** The variable the `start` and `compile` tasks expand for operator-granted extra permissions. */
export const EXTRA_PERMISSIONS_VAR = "DKP_EXTRA_PERMISSIONS";

/** Options of {@link agentCommand}. */
export interface AgentCommandOptions {
  /**
   * What `$DKP_EXTRA_PERMISSIONS` expands to (e.g. `["--allow-run=/usr/local/bin/plugin"]`); default: the
   * variable's value in this process, split on whitespace as the task shell does (usually empty).
   */
  extraPermissions?: string[];
}

/**
 * The flags between `deno run` and `main.ts` in deno.json's `start` task (permissions and V8 settings), with
 * `$DKP_EXTRA_PERMISSIONS` expanded.
 */
export function startTaskFlags(opts: AgentCommandOptions = {}): string[] {
  const denoJson = JSON.parse(Deno.readTextFileSync(new URL("deno.json", root)));
  const words = (denoJson.tasks.start as string).trim().split(/\s+/);
  if (words[0] !== "deno" || words[1] !== "run" || words.at(-1) !== "main.ts") {
    throw new Error(`unexpected start task: ${denoJson.tasks.start}`);
  }
  const flags: string[] = [];
  for (const w of words.slice(2, -1)) {
    if (w === `$${EXTRA_PERMISSIONS_VAR}`) {
      flags.push(
        ...(opts.extraPermissions ??
          (Deno.env.get(EXTRA_PERMISSIONS_VAR) ?? "").split(/\s+/).filter((x) => x !== "")),
      );
    } else if (w.includes("$")) {
      throw new Error(`unexpected variable in the start task: ${w}`);
    } else flags.push(w);
  }
  return flags;
}

/**
 * `[denoPath, "run", ...permission flags, "<root>/main.ts", ...agentArgs]`, read from deno.json's `start`
 * task so that there is only one list of permissions.
 */
export function agentCommand(agentArgs: string[], opts: AgentCommandOptions = {}): string[] {
  return [Deno.execPath(), "run", ...startTaskFlags(opts), new URL("main.ts", root).pathname, ...agentArgs];
}
