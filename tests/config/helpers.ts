/** Shared test helpers for tests/config. */
import { configureLogging } from "../../lib/log.ts";
import { type CommandResult, parseCommandLine, type ProxyOptions } from "../../lib/config/command.ts";

/** Captured output of one parseCommandLine run. */
export interface Run {
  result: CommandResult;
  stdout: string;
  stderr: string;
  /** klog lines logged during the run. */
  logs: string[];
}

/** Runs parseCommandLine with captured stdout/stderr/logs and a fixed machine hostname. */
export async function run(argv: string[], hostname = "Node-A.Example"): Promise<Run> {
  let stdout = "";
  let stderr = "";
  const logs: string[] = [];
  configureLogging({ sink: (l) => logs.push(l), verbosity: 0, format: "text" });
  try {
    const result = await parseCommandLine(argv, {
      stdout: (s) => stdout += s,
      stderr: (s) => stderr += s,
      hostname: () => hostname,
    });
    return { result, stdout, stderr, logs };
  } finally {
    configureLogging({ verbosity: 0, format: "text" });
  }
}

/** Runs and expects options (fails with the captured stderr otherwise). */
export async function runOK(argv: string[]): Promise<ProxyOptions> {
  const r = await run(argv);
  if (!("options" in r.result)) {
    throw new Error(`expected options for ${argv.join(" ")}, got ${JSON.stringify(r.result)}: ${r.stderr}`);
  }
  return r.result.options;
}

/** A fresh temporary directory. */
export function tempDir(): string {
  return Deno.makeTempDirSync({ prefix: "kp-config-test-" });
}
