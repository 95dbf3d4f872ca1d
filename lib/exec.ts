/**
 * The one place that spawns external programs (iptables-restore, nft, ipset, conntrack, sysctl, ...).
 *
 * Every dataplane and helper takes a {@linkcode CommandRunner}; production code uses
 * {@linkcode DenoCommandRunner}, tests swap in {@linkcode RecordingCommandRunner}.
 * @module
 */

/** One program invocation. */
export interface CommandSpec {
  /** Program name, looked up in PATH (must be in the agent's --allow-run list). */
  cmd: string;
  args: string[];
  /** Bytes or text written to the child's stdin, which is then closed. */
  stdin?: string | Uint8Array;
  /** Kill the child after this many milliseconds (default 60 000). */
  timeoutMs?: number;
  /** Capture stdout (default true). Set false for programs that echo large input. */
  captureStdout?: boolean;
}

/** What a finished program left behind. */
export interface CommandResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Raised when a program exits non-zero, cannot be started, or times out. */
export class CommandError extends Error {
  constructor(
    readonly spec: CommandSpec,
    readonly code: number,
    readonly stderr: string,
    readonly stdout = "",
    options?: ErrorOptions,
  ) {
    super(
      `${spec.cmd} ${spec.args.join(" ")} failed (exit ${code})${stderr ? ": " + stderr.trim() : ""}`,
      options,
    );
    this.name = "CommandError";
  }

  /** True when the program could not be found or started at all. */
  get notFound(): boolean {
    return this.code === 127;
  }
}

/** Runs programs. */
export interface CommandRunner {
  /** Runs the program; resolves with its output on exit 0, rejects with {@linkcode CommandError} otherwise. */
  run(spec: CommandSpec): Promise<CommandResult>;
  /** Like run() but resolves with the result whatever the exit code (still rejects if it cannot start). */
  tryRun(spec: CommandSpec): Promise<CommandResult>;
}

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** Runs programs with `Deno.Command`: stdin written then closed, stderr captured, a timeout kills the child. */
export class DenoCommandRunner implements CommandRunner {
  async run(spec: CommandSpec): Promise<CommandResult> {
    const result = await this.tryRun(spec);
    if (result.code !== 0) throw new CommandError(spec, result.code, result.stderr, result.stdout);
    return result;
  }

  async tryRun(spec: CommandSpec): Promise<CommandResult> {
    const capture = spec.captureStdout ?? true;
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(spec.cmd, {
        args: spec.args,
        stdin: spec.stdin !== undefined ? "piped" : "null",
        stdout: capture ? "piped" : "null",
        stderr: "piped",
      }).spawn();
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) {
        throw new CommandError(spec, 127, `${spec.cmd}: command not found`, "", { cause: err });
      }
      throw new CommandError(spec, 126, String(err), "", { cause: err });
    }
    const timeoutMs = spec.timeoutMs ?? 60_000;
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try {
        child.kill("SIGKILL");
      } catch { /* already gone */ }
    }, timeoutMs);
    try {
      // Write stdin while output is collected so that a child echoing its input cannot deadlock.
      const outputPromise = child.output();
      if (spec.stdin !== undefined) {
        const bytes = typeof spec.stdin === "string" ? encoder.encode(spec.stdin) : spec.stdin;
        const writer = child.stdin.getWriter();
        try {
          await writer.write(bytes);
          await writer.close();
        } catch {
          // The child exited before reading everything; its exit code and stderr say why.
        }
      }
      const out = await outputPromise;
      if (timedOut) {
        return { code: 124, stdout: "", stderr: `${spec.cmd}: timed out after ${timeoutMs} ms` };
      }
      return {
        code: out.code,
        stdout: capture ? decoder.decode(out.stdout) : "",
        stderr: decoder.decode(out.stderr),
      };
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A recorded call and the canned answer it got. */
export interface RecordedCall {
  cmd: string;
  args: string[];
  stdin: string;
}

/** Answers a recorded call; return undefined for "exit 0, no output". */
export type Responder = (call: RecordedCall) => Partial<CommandResult> | undefined;

/** A test double: records every call and answers from a responder. Spawns nothing. */
export class RecordingCommandRunner implements CommandRunner {
  readonly calls: RecordedCall[] = [];
  constructor(public responder: Responder = () => undefined) {}

  tryRun(spec: CommandSpec): Promise<CommandResult> {
    const stdin = spec.stdin === undefined
      ? ""
      : typeof spec.stdin === "string"
      ? spec.stdin
      : decoder.decode(spec.stdin);
    const call = { cmd: spec.cmd, args: [...spec.args], stdin };
    this.calls.push(call);
    const r = this.responder(call) ?? {};
    return Promise.resolve({ code: r.code ?? 0, stdout: r.stdout ?? "", stderr: r.stderr ?? "" });
  }

  async run(spec: CommandSpec): Promise<CommandResult> {
    const result = await this.tryRun(spec);
    if (result.code !== 0) throw new CommandError(spec, result.code, result.stderr, result.stdout);
    return result;
  }

  /** Calls whose program name is `cmd`. */
  callsOf(cmd: string): RecordedCall[] {
    return this.calls.filter((c) => c.cmd === cmd);
  }
}
