/**
 * The agent's command line exactly as the `start` task in deno.json runs it (same permission flags), so
 * tests, the demo and the scale harness exercise the agent under its production permissions.
 * @module
 */

const root = new URL("../", import.meta.url);

/** Absolute path of the project root (ends with "/"). */
export const PROJECT_ROOT: string = root.pathname;

/** The flags between `deno run` and `main.ts` in deno.json's `start` task (permissions and V8 settings). */
export function startTaskFlags(): string[] {
  const denoJson = JSON.parse(Deno.readTextFileSync(new URL("deno.json", root)));
  const words = (denoJson.tasks.start as string).trim().split(/\s+/);
  if (words[0] !== "deno" || words[1] !== "run" || words.at(-1) !== "main.ts") {
    throw new Error(`unexpected start task: ${denoJson.tasks.start}`);
  }
  return words.slice(2, -1);
}

/**
 * `[denoPath, "run", ...permission flags, "<root>/main.ts", ...agentArgs]`, read from deno.json's `start`
 * task so that there is only one list of permissions.
 */
export function agentCommand(agentArgs: string[]): string[] {
  return [Deno.execPath(), "run", ...startTaskFlags(), new URL("main.ts", root).pathname, ...agentArgs];
}
