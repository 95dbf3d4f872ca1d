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
  /**
   * Written to the child's stdin, which is then closed: text, bytes, or chunks produced while the child reads
   * (each chunk is written before the next is requested, and is only valid until then).
   */
  stdin?: string | Uint8Array | Iterable<Uint8Array>;
  /** Kill the child after this many milliseconds (default 60 000). */
  timeoutMs?: number;
  /** Capture stdout (default true). Set false for programs that echo large input. */
  captureStdout?: boolean;
  /**
   * Receives stdout line by line as it arrives instead of capturing it (`CommandResult.stdout` is then ""), so
   * that a large output (an `iptables-save` of a big table) is never held whole.
   */
  stdoutLines?: (line: string) => void;
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

/** Feeds a byte stream to `onLine` line by line (a last line without newline included). */
export async function readLines(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of stream) {
    buf += dec.decode(chunk, { stream: true });
    let start = 0;
    let nl: number;
    while ((nl = buf.indexOf("\n", start)) !== -1) {
      onLine(buf.slice(start, nl));
      start = nl + 1;
    }
    buf = buf.slice(start);
  }
  buf += dec.decode();
  if (buf !== "") onLine(buf);
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<string> {
  const dec = new TextDecoder();
  let s = "";
  for await (const chunk of stream) s += dec.decode(chunk, { stream: true });
  return s + dec.decode();
}

/**
 * Writes stdin (text, bytes or chunks as they are produced) and closes it. A write that fails means the child
 * exited before reading everything (its exit code and stderr say why): writing stops quietly. An error of the
 * chunk producer is thrown.
 */
async function writeStdin(
  stdin: WritableStream<Uint8Array>,
  data: string | Uint8Array | Iterable<Uint8Array>,
  kill: () => void,
) {
  const writer = stdin.getWriter();
  const write = async (b: Uint8Array): Promise<boolean> => {
    try {
      await writer.write(b);
      return true;
    } catch {
      return false;
    }
  };
  let open = true;
  if (typeof data === "string") open = await write(encoder.encode(data));
  else if (data instanceof Uint8Array) open = await write(data);
  else {
    const it = data[Symbol.iterator]();
    while (open) {
      let r: IteratorResult<Uint8Array>;
      try {
        r = it.next();
      } catch (err) {
        // The producer failed: the child must not apply a truncated input. Kill it first, then let go of the
        // pipe (closing it first could let the child read an end-of-file and commit what it has).
        kill();
        await writer.abort(err).catch(() => {});
        throw err;
      }
      if (r.done) break;
      if (r.value.length > 0) open = await write(r.value);
    }
    if (!open) it.return?.();
  }
  if (open) await writer.close().catch(() => {});
  else writer.releaseLock();
}

/** Runs programs with `Deno.Command`: stdin written then closed, stderr captured, a timeout kills the child. */
export class DenoCommandRunner implements CommandRunner {
  async run(spec: CommandSpec): Promise<CommandResult> {
    const result = await this.tryRun(spec);
    if (result.code !== 0) throw new CommandError(spec, result.code, result.stderr, result.stdout);
    return result;
  }

  async tryRun(spec: CommandSpec): Promise<CommandResult> {
    const capture = spec.captureStdout ?? true;
    const lines = spec.stdoutLines;
    let child: Deno.ChildProcess;
    try {
      child = new Deno.Command(spec.cmd, {
        args: spec.args,
        stdin: spec.stdin !== undefined ? "piped" : "null",
        stdout: capture || lines ? "piped" : "null",
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
    const kill = () => {
      try {
        child.kill("SIGKILL");
      } catch { /* already gone */ }
    };
    const timer = setTimeout(() => {
      timedOut = true;
      kill();
    }, timeoutMs);
    // Output is read while stdin is written so that a child echoing its input cannot deadlock.
    const stderr = readAll(child.stderr);
    const stdout = lines
      ? readLines(child.stdout, lines).then(() => "")
      : capture
      ? readAll(child.stdout)
      : "";
    try {
      if (spec.stdin !== undefined) {
        try {
          await writeStdin(child.stdin, spec.stdin, kill);
        } catch (err) {
          // The producer of the chunks failed; writeStdin killed the child.
          await child.status.catch(() => {});
          throw err;
        }
      }
      const [status, errText, outText] = await Promise.all([child.status, stderr, stdout]);
      if (timedOut) {
        return { code: 124, stdout: "", stderr: `${spec.cmd}: timed out after ${timeoutMs} ms` };
      }
      return { code: status.code, stdout: outText, stderr: errText };
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
    let stdin = "";
    if (typeof spec.stdin === "string") stdin = spec.stdin;
    else if (spec.stdin instanceof Uint8Array) stdin = decoder.decode(spec.stdin);
    else if (spec.stdin !== undefined) {
      const dec = new TextDecoder();
      for (const chunk of spec.stdin) stdin += dec.decode(chunk, { stream: true });
      stdin += dec.decode();
    }
    const call = { cmd: spec.cmd, args: [...spec.args], stdin };
    this.calls.push(call);
    const r = this.responder(call) ?? {};
    let stdout = r.stdout ?? "";
    if (spec.stdoutLines) {
      const lines = stdout.split("\n");
      if (lines.at(-1) === "") lines.pop();
      for (const l of lines) spec.stdoutLines(l);
      stdout = "";
    }
    return Promise.resolve({ code: r.code ?? 0, stdout, stderr: r.stderr ?? "" });
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
