/**
 * Traffic probe for the dataplane tests.
 *
 * The program half runs long-lived inside one network namespace
 * (`ip netns exec NS deno run -A testkit/probe.ts`) and serves JSON-line requests on stdin,
 * one JSON-line answer per request on stdout, so that a test can make hundreds of connections
 * without paying Deno's start-up for each. The {@linkcode Probe} class is the test-side half.
 *
 * Requests (`id` is echoed back):
 * - `{op:"tcp", host, port, timeoutMs?, localAddress?, localPort?}`: connect, read the first line.
 * - `{op:"udp", ...same}`: send one datagram, wait for one answer datagram.
 * - `{op:"open", host, port, timeoutMs?}`: like tcp but keeps the connection; answers `conn`.
 * - `{op:"send", conn, timeoutMs?}`: writes `ping\n` on a held connection and reads one line.
 * - `{op:"close", conn, reset?}`: closes a held connection (with `reset`, by a TCP RST instead of a FIN).
 *
 * Outcomes: `ok` (with `answer`, the line without its newline), `refused`, `timeout`, `closed`
 * (the peer closed or reset a held connection), `error` (with `error`).
 * @module
 */

import dgram from "node:dgram";
import net from "node:net";
import type { Buffer } from "node:buffer";

/** A probe request (see the module doc). */
export interface ProbeRequest {
  op: "tcp" | "udp" | "open" | "send" | "close";
  host?: string;
  port?: number;
  timeoutMs?: number;
  localAddress?: string;
  localPort?: number;
  conn?: number;
  /** For `close`: abort the connection with an RST. */
  reset?: boolean;
}

/** How a probe ended. */
export type ProbeOutcome = "ok" | "refused" | "timeout" | "closed" | "error";

/** The answer to one probe request. */
export interface ProbeResult {
  result: ProbeOutcome;
  /** The server's line (`<name> <peer-ip>:<peer-port>`) when result is ok. */
  answer?: string;
  /** Held-connection id for `open`. */
  conn?: number;
  /** Error text for result `error`. */
  error?: string;
  /**
   * For a `tcp` timeout: the TCP handshake had completed (the path and the rules carried it; the server did not
   * answer in time, e.g. on a loaded machine). Absent when the connection was never established.
   */
  connected?: boolean;
  /** For `tcp` and `udp`: ms from the start of the probe to its outcome, measured in the probe process. */
  elapsedMs?: number;
  /**
   * For a `tcp` timeout: how late the probe's timer fired, when at least {@linkcode STARVED_MS} (the probe
   * process was starved of CPU; see `tcpProbe`).
   */
  timerLateMs?: number;
}

const DEFAULT_TIMEOUT_MS = 1000;
/**
 * A timer firing this many ms after it was due means the probe process was not running meanwhile (a busy
 * machine), not that the path was slow: the answer records it, and I/O that completed meanwhile is seen.
 */
export const STARVED_MS = 250;
/** After such a wake-up, how long I/O that completed while the process was not running gets to land. */
const WAKE_GRACE_MS = 100;

// ---------------------------------------------------------------------------------------------
// Program half (runs inside the namespace).

const held = new Map<
  number,
  { sock: net.Socket; lines: string[]; waiters: ((l: string | null) => void)[] }
>();
let nextConn = 1;

function errorOutcome(err: unknown): ProbeResult {
  const code = (err as { code?: string })?.code;
  if (code === "ECONNREFUSED") return { result: "refused" };
  if (code === "ECONNRESET" || code === "EPIPE") return { result: "closed" };
  if (code === "EHOSTUNREACH" || code === "ENETUNREACH") return { result: "error", error: code };
  return { result: "error", error: String((err as Error)?.message ?? err) };
}

function tcpProbe(req: ProbeRequest, keep: boolean): Promise<ProbeResult> {
  return new Promise((resolve) => {
    let buf = "";
    let done = false;
    const sock = net.connect({
      host: req.host!,
      port: req.port!,
      localAddress: req.localAddress,
      localPort: req.localPort,
    });
    sock.setNoDelay(true);
    const finish = (r: ProbeResult, destroy: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (destroy) sock.destroy();
      resolve(r);
    };
    const timeoutMs = req.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const armed = performance.now();
    const timeout = () =>
      finish({ result: "timeout", ...(sock.connecting ? {} : { connected: true }) }, true);
    const timer = setTimeout(() => {
      const lateMs = Math.round(performance.now() - armed - timeoutMs);
      if (lateMs < STARVED_MS) {
        timeout();
        return;
      }
      // This process was not scheduled when its timer was due: the timer did not measure the path, and I/O
      // that completed meanwhile is still queued behind it (the event loop runs due timers first; the
      // connection's completion landed within 2 turns, 12 ms, of waking in tests/testkit/probe_test.ts). It
      // gets WAKE_GRACE_MS to land; the answer says how late the timer was.
      const woke = performance.now();
      const verdict = () => {
        if (done) return;
        if (sock.connecting && performance.now() - woke < WAKE_GRACE_MS) {
          setTimeout(verdict, 0);
          return;
        }
        finish(
          { result: "timeout", timerLateMs: lateMs, ...(sock.connecting ? {} : { connected: true }) },
          true,
        );
      };
      setTimeout(verdict, 0);
    }, timeoutMs);
    sock.on("error", (err) => finish(errorOutcome(err), true));
    sock.on("close", () => finish({ result: "closed" }, false));
    sock.on("data", (chunk: Buffer) => {
      buf += chunk.toString();
      const nl = buf.indexOf("\n");
      if (nl < 0 || done) return;
      const answer = buf.slice(0, nl);
      if (!keep) {
        finish({ result: "ok", answer }, true);
        return;
      }
      const conn = nextConn++;
      const entry = { sock, lines: [] as string[], waiters: [] as ((l: string | null) => void)[] };
      let rest = buf.slice(nl + 1);
      sock.removeAllListeners("data");
      sock.removeAllListeners("close");
      sock.removeAllListeners("error");
      sock.on("error", () => {});
      sock.on("data", (c: Buffer) => {
        rest += c.toString();
        let i;
        while ((i = rest.indexOf("\n")) >= 0) {
          const line = rest.slice(0, i);
          rest = rest.slice(i + 1);
          const w = entry.waiters.shift();
          if (w) w(line);
          else entry.lines.push(line);
        }
      });
      sock.on("close", () => {
        for (const w of entry.waiters.splice(0)) w(null);
        held.delete(conn);
      });
      held.set(conn, entry);
      finish({ result: "ok", answer, conn }, false);
    });
  });
}

function sendOnHeld(req: ProbeRequest): Promise<ProbeResult> {
  const entry = held.get(req.conn ?? -1);
  if (!entry) return Promise.resolve({ result: "closed" });
  return new Promise((resolve) => {
    const queued = entry.lines.shift();
    if (queued !== undefined) {
      resolve({ result: "ok", answer: queued });
      return;
    }
    let done = false;
    const waiter = (line: string | null) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(line === null ? { result: "closed" } : { result: "ok", answer: line });
    };
    const timer = setTimeout(() => {
      if (done) return;
      done = true;
      entry.waiters.splice(entry.waiters.indexOf(waiter), 1);
      resolve({ result: "timeout" });
    }, req.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    entry.waiters.push(waiter);
    entry.sock.write("ping\n");
  });
}

function udpProbe(req: ProbeRequest): Promise<ProbeResult> {
  return new Promise((resolve) => {
    // An IPv6 destination needs an IPv6 socket (the IPv4 default is unchanged).
    const v6 = req.host!.includes(":");
    const sock = dgram.createSocket(v6 ? "udp6" : "udp4");
    let done = false;
    const finish = (r: ProbeResult) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      try {
        sock.close();
      } catch { /* closed */ }
      resolve(r);
    };
    const timer = setTimeout(() => finish({ result: "timeout" }), req.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    sock.on("error", (err) => finish(errorOutcome(err)));
    sock.on("message", (msg: Buffer) => finish({ result: "ok", answer: msg.toString().replace(/\n$/, "") }));
    sock.bind(req.localPort ?? 0, req.localAddress ?? (v6 ? "::" : "0.0.0.0"), () => {
      sock.send("probe\n", req.port!, req.host!, (err) => {
        if (err) finish(errorOutcome(err));
      });
    });
  });
}

async function handle(req: ProbeRequest): Promise<ProbeResult> {
  switch (req.op) {
    case "tcp": {
      const t0 = performance.now();
      return { ...(await tcpProbe(req, false)), elapsedMs: Math.round(performance.now() - t0) };
    }
    case "open":
      return await tcpProbe(req, true);
    case "udp": {
      const t0 = performance.now();
      return { ...(await udpProbe(req)), elapsedMs: Math.round(performance.now() - t0) };
    }
    case "send":
      return await sendOnHeld(req);
    case "close": {
      const entry = held.get(req.conn ?? -1);
      if (req.reset) entry?.sock.resetAndDestroy();
      else entry?.sock.destroy();
      held.delete(req.conn ?? -1);
      return { result: "ok" };
    }
    default:
      return { result: "error", error: `unknown op ${(req as { op: string }).op}` };
  }
}

async function serveStdin(): Promise<void> {
  const encoder = new TextEncoder();
  const write = (obj: unknown) => Deno.stdout.writeSync(encoder.encode(JSON.stringify(obj) + "\n"));
  write({ ready: true });
  let buf = "";
  for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      const msg = JSON.parse(line) as ProbeRequest & { id: number };
      handle(msg).then(
        (r) => write({ id: msg.id, ...r }),
        (err) => write({ id: msg.id, result: "error", error: String(err) }),
      );
    }
  }
  Deno.exit(0);
}

// ---------------------------------------------------------------------------------------------
// Test half.

/** Something that starts a long-running program inside a namespace (the Sandbox does). */
export type SpawnInNs = (cmd: string, args: string[], opts: { stdin: "piped" }) => Deno.ChildProcess;

/**
 * Test-side handle of one probe process. Requests may run concurrently; each resolves with its own
 * answer. Created by `Sandbox.probe(ns)`; killed with the sandbox.
 */
export class Probe {
  #child: Deno.ChildProcess;
  #writer: WritableStreamDefaultWriter<Uint8Array>;
  #pending = new Map<number, (r: ProbeResult) => void>();
  #nextId = 1;
  #ready: Promise<void>;
  #closed = false;

  /** Starts the probe program with `spawn` (which runs it inside the wanted namespace). */
  constructor(spawn: SpawnInNs, denoPath = Deno.execPath()) {
    const script = new URL("./probe.ts", import.meta.url).pathname;
    const child = spawn(denoPath, ["run", "-A", "--no-check", script], { stdin: "piped" });
    this.#child = child;
    this.#writer = this.#child.stdin.getWriter();
    let readyResolve!: () => void;
    let readyReject!: (e: Error) => void;
    this.#ready = new Promise((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    (async () => {
      let buf = "";
      for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
        buf += chunk;
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          const msg = JSON.parse(line) as ProbeResult & { id?: number; ready?: boolean };
          if (msg.ready) {
            readyResolve();
            continue;
          }
          const cb = this.#pending.get(msg.id!);
          this.#pending.delete(msg.id!);
          const { id: _id, ...rest } = msg;
          cb?.(rest);
        }
      }
    })().catch(() => {}).finally(() => {
      this.#closed = true;
      readyReject(new Error("probe process exited before it was ready"));
      for (const cb of this.#pending.values()) cb({ result: "error", error: "probe process exited" });
      this.#pending.clear();
    });
    this.#ready.catch(() => {});
  }

  /** Resolves once the probe process serves requests. */
  ready(): Promise<void> {
    return this.#ready;
  }

  /** Sends one request and resolves with its answer. */
  async request(req: ProbeRequest): Promise<ProbeResult> {
    await this.#ready;
    if (this.#closed) return { result: "error", error: "probe process exited" };
    const id = this.#nextId++;
    const p = new Promise<ProbeResult>((resolve) => this.#pending.set(id, resolve));
    await this.#writer.write(new TextEncoder().encode(JSON.stringify({ id, ...req }) + "\n"));
    return await p;
  }

  /** TCP connect to host:port and read the first line. */
  tcp(
    host: string,
    port: number,
    opts: Omit<ProbeRequest, "op" | "host" | "port"> = {},
  ): Promise<ProbeResult> {
    return this.request({ op: "tcp", host, port, ...opts });
  }

  /** One UDP datagram to host:port, waiting for one answer. */
  udp(
    host: string,
    port: number,
    opts: Omit<ProbeRequest, "op" | "host" | "port"> = {},
  ): Promise<ProbeResult> {
    return this.request({ op: "udp", host, port, ...opts });
  }

  /** Opens a TCP connection that stays open; `result.conn` names it for {@linkcode send}. */
  open(
    host: string,
    port: number,
    opts: Omit<ProbeRequest, "op" | "host" | "port"> = {},
  ): Promise<ProbeResult> {
    return this.request({ op: "open", host, port, ...opts });
  }

  /** Sends `ping` on a held connection and reads the server's line. */
  send(conn: number, timeoutMs?: number): Promise<ProbeResult> {
    return this.request({ op: "send", conn, timeoutMs });
  }

  /** Closes a held connection; `reset` aborts it with an RST (no FIN, no TIME_WAIT). */
  async closeConn(conn: number, opts: { reset?: boolean } = {}): Promise<void> {
    await this.request({ op: "close", conn, reset: opts.reset });
  }

  /**
   * Makes `count` sequential requests and returns the answering pod names (the first word of each
   * answer) or the outcome (`refused`, `timeout`, ...) for failed ones.
   */
  async repeat(req: ProbeRequest, count: number): Promise<string[]> {
    const out: string[] = [];
    for (let i = 0; i < count; i++) {
      const r = await this.request(req);
      out.push(r.result === "ok" ? r.answer!.split(" ")[0] : r.result);
    }
    return out;
  }

  /** Kills the probe process. Idempotent. */
  async close(): Promise<void> {
    if (!this.#closed) {
      try {
        await this.#writer.close();
      } catch { /* gone */ }
      try {
        this.#child.kill("SIGKILL");
      } catch { /* gone */ }
    }
    try {
      await this.#child.status;
    } catch { /* gone */ }
  }
}

if (import.meta.main) {
  await serveStdin();
}
