/**
 * klog-compatible structured logging to stderr.
 *
 * Text format (klog): `I1202 14:36:20.123456   12345 file.ts:42] "message" key="value"`.
 * JSON format (`--logging-format=json`, as component-base): `{"ts":1733150180.123,"caller":"file.ts:42",
 * "msg":"message","v":0,"key":"value"}` (errors add `"err"`).
 * Verbosity: `log.v(4).info(...)` is printed only when `-v` is 4 or more, as klog's `V(4).Info`.
 * @module
 */

/** Output format: klog text or JSON lines. */
export type LogFormat = "text" | "json";

/** Log severities, as klog's I/W/E. */
export type Severity = "info" | "warning" | "error";

interface LogSettings {
  format: LogFormat;
  verbosity: number;
  /** Where lines go; tests replace it. */
  sink: (line: string) => void;
  /** Wall clock; tests replace it. */
  now: () => Date;
}

const encoder = new TextEncoder();
const settings: LogSettings = {
  format: "text",
  verbosity: 0,
  sink: (line) => Deno.stderr.writeSync(encoder.encode(line + "\n")),
  now: () => new Date(),
};

/** Sets the format, verbosity and (for tests) the sink of every logger. */
export function configureLogging(opts: Partial<LogSettings>): void {
  Object.assign(settings, opts);
}

/** The current -v level. */
export function verbosity(): number {
  return settings.verbosity;
}

/** Key/value pairs attached to a log line. */
export type KV = Record<string, unknown>;

function pad(n: number, width = 2): string {
  return String(n).padStart(width, "0");
}

/**
 * An error's message followed by those of its causes that it does not already contain, e.g. Deno's
 * `fetch failed: error sending request ...: tcp connect error: Connection refused`.
 */
export function errorText(e: Error): string {
  let text = e.message;
  let c: unknown = e.cause;
  for (let i = 0; i < 5 && c !== undefined && c !== null; i++) {
    const m = c instanceof Error ? c.message : typeof c === "object" ? "" : String(c);
    if (m && !text.includes(m)) text += `: ${m}`;
    c = c instanceof Error ? c.cause : undefined;
  }
  return text;
}

function quote(v: unknown): string {
  if (v instanceof Error) return JSON.stringify(errorText(v));
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "number" || typeof v === "boolean" || v === null || v === undefined) return String(v);
  if (v instanceof Set) return JSON.stringify([...v]);
  try {
    return JSON.stringify(v);
  } catch {
    return JSON.stringify(String(v));
  }
}

function caller(): string {
  // Frame 0 is Error, then caller(), emit(), the Logger method, then the real call site.
  const stack = new Error().stack?.split("\n") ?? [];
  const frame = stack[4] ?? "";
  const m = frame.match(/([^/\\(\s]+\.[jt]s):(\d+):\d+\)?$/);
  return m ? `${m[1]}:${m[2]}` : "???:0";
}

function emit(sev: Severity, level: number, msg: string, kv: KV | undefined, err?: unknown): void {
  const t = settings.now();
  const where = caller();
  if (settings.format === "json") {
    const rec: Record<string, unknown> = { ts: t.getTime() / 1000, caller: where, msg, v: level };
    if (sev === "error" && err !== undefined) rec.err = err instanceof Error ? errorText(err) : String(err);
    for (const [k, v] of Object.entries(kv ?? {})) {
      rec[k] = v instanceof Error ? errorText(v) : v instanceof Set ? [...v] : v;
    }
    settings.sink(JSON.stringify(rec));
    return;
  }
  const letter = sev === "info" ? "I" : sev === "warning" ? "W" : "E";
  const head = `${letter}${pad(t.getMonth() + 1)}${pad(t.getDate())} ${pad(t.getHours())}:${
    pad(t.getMinutes())
  }:${pad(t.getSeconds())}.${pad(t.getMilliseconds(), 3)}000 ${String(Deno.pid).padStart(7)} ${where}]`;
  let line = `${head} ${JSON.stringify(msg)}`;
  if (err !== undefined) line += ` err=${quote(err)}`;
  for (const [k, v] of Object.entries(kv ?? {})) line += ` ${k}=${quote(v)}`;
  settings.sink(line);
}

/** A logger at one verbosity level. */
export class Logger {
  constructor(private readonly level = 0, private readonly base: KV = {}) {}

  /** True when lines of this logger's level are printed. */
  get enabled(): boolean {
    return this.level <= settings.verbosity;
  }

  /** A logger printed only at `-v=level` or above. */
  v(level: number): Logger {
    return new Logger(level, this.base);
  }

  /** A logger that adds these pairs to every line. */
  with(kv: KV): Logger {
    return new Logger(this.level, { ...this.base, ...kv });
  }

  info(msg: string, kv?: KV): void {
    if (this.enabled) emit("info", this.level, msg, { ...this.base, ...kv });
  }

  warn(msg: string, kv?: KV): void {
    emit("warning", this.level, msg, { ...this.base, ...kv });
  }

  error(msg: string, err?: unknown, kv?: KV): void {
    emit("error", this.level, msg, { ...this.base, ...kv }, err);
  }
}

/** The root logger. */
export const log: Logger = new Logger();
