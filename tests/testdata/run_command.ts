/**
 * Runs one program through the agent's own command runner (lib/exec.ts) and prints `{code, stderr}` as
 * JSON: tests/permissions_test.ts starts it under the `start` task's permission flags to see what the
 * agent's children get (e.g. the inherited XTABLES_LOCKFILE).
 * @module
 */
import { DenoCommandRunner } from "../../lib/exec.ts";

const [cmd, ...args] = Deno.args;
const r = await new DenoCommandRunner().tryRun({ cmd, args, timeoutMs: 20_000 });
console.log(JSON.stringify({ code: r.code, stderr: r.stderr }));
