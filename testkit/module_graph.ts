/**
 * main.ts's module graph as Deno sees it (`deno info --json`), for the tests that pin what the program loads.
 * `import type` edges are not followed: they are erased at run time.
 * @module
 */
import { PROJECT_ROOT } from "./agent_command.ts";

interface ModuleInfo {
  readonly specifier: string;
  readonly dependencies?: readonly { code?: { specifier: string }; isDynamic?: boolean }[];
}

interface GraphInfo {
  readonly roots: readonly string[];
  readonly modules: readonly ModuleInfo[];
  readonly redirects: Readonly<Record<string, string>>;
}

/**
 * The specifiers (`file:///...`, `npm:/name@version`, `node:...`) reachable from main.ts through run-time
 * imports: static ones only (what the agent loads at start), or dynamic ones too (what any subcommand may
 * load: render, explain).
 */
export async function mainModules(withDynamic: boolean): Promise<string[]> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "main.ts"],
    cwd: PROJECT_ROOT,
  })
    .output();
  if (!out.success) throw new Error(`deno info failed: ${new TextDecoder().decode(out.stderr)}`);
  const info: GraphInfo = JSON.parse(new TextDecoder().decode(out.stdout));
  const bySpec = new Map(info.modules.map((m) => [m.specifier, m]));
  const seen = new Set<string>();
  const todo = [...info.roots];
  while (todo.length > 0) {
    const s = todo.pop()!;
    const spec = info.redirects[s] ?? s;
    if (seen.has(spec)) continue;
    seen.add(spec);
    for (const d of bySpec.get(spec)?.dependencies ?? []) {
      if ((withDynamic || !d.isDynamic) && d.code?.specifier) todo.push(d.code.specifier);
    }
  }
  return [...seen];
}
