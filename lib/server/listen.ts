/**
 * A stoppable `Deno.serve` listener that retries a failed bind every 5 s (upstream's
 * `wait.Until(..., 5*time.Second, ...)` around the health and metrics servers), logging each failure,
 * and that treats a failure as fatal only when `bindAddressHardFail` is set.
 * @module
 */
import { log } from "../log.ts";
import { splitHostPort } from "../net/ip.ts";
import { type Clock, realClock, type TimerId } from "../proxy/clock.ts";

/** A host and port split from `host:port` / `[v6]:port`. */
export interface HostPort {
  hostname: string;
  port: number;
}

/**
 * Splits a bind address `host:port`, `[v6]:port` or `:port` (host defaults to 0.0.0.0).
 * @throws {TypeError} When the port is missing or not a number in 0..65535.
 */
export function parseBindAddress(addr: string): HostPort {
  let host: string;
  let port: string;
  try {
    [host, port] = splitHostPort(addr);
  } catch (err) {
    throw new TypeError((err as Error).message);
  }
  const n = Number(port);
  if (port === "" || !Number.isInteger(n) || n < 0 || n > 65535) {
    throw new TypeError(`Invalid port in "${addr}"`);
  }
  return { hostname: host === "" ? "0.0.0.0" : host, port: n };
}

/**
 * `Deno.serve` on `hostname:port`, where the wildcard `0.0.0.0` (or `::`) means every address of both
 * families, as Go's `net.Listen` treats it: Deno binds `0.0.0.0` as IPv4 only, so a wildcard is bound as
 * `::` (dual-stack unless net.ipv6.bindv6only=1), falling back to `0.0.0.0` where IPv6 is unavailable.
 * @throws {Error} When the address cannot be bound.
 */
export function serveOn(
  hostname: string,
  port: number,
  handler: (req: Request) => Response | Promise<Response>,
  onError?: (err: unknown) => Response | Promise<Response>,
): Deno.HttpServer<Deno.NetAddr> {
  const serve = (h: string) => Deno.serve({ hostname: h, port, onListen: () => {}, onError }, handler);
  if (hostname !== "0.0.0.0" && hostname !== "::") return serve(hostname);
  try {
    return serve("::");
  } catch (err) {
    if (err instanceof Deno.errors.AddrInUse) throw err;
    return serve("0.0.0.0");
  }
}

/** Options of {@linkcode RetryingListener}. */
export interface RetryingListenerOptions {
  /** Name in logs (e.g. "healthz", "metrics"). */
  name: string;
  hostname: string;
  port: number;
  handler: (req: Request) => Response | Promise<Response>;
  /** Stop retrying and call onFatal on the first bind failure. */
  hardFail?: boolean;
  /** Called with the error when hardFail is set. */
  onFatal?: (err: Error) => void;
  /** Retry interval; @default 5000 */
  retryMs?: number;
  clock?: Clock;
}

/** One HTTP listener with bind retries. */
export class RetryingListener {
  #server: Deno.HttpServer<Deno.NetAddr> | null = null;
  #timer: TimerId | null = null;
  #stopped = false;
  #ready: Promise<void>;
  #resolveReady!: () => void;
  readonly #clock: Clock;

  constructor(private readonly opts: RetryingListenerOptions) {
    this.#clock = opts.clock ?? realClock;
    this.#ready = new Promise((r) => this.#resolveReady = r);
  }

  /** Tries to bind now; on failure logs and retries (or reports fatal). */
  start(): void {
    this.#stopped = false;
    this.#tryListen();
  }

  /** Resolves once bound. */
  get ready(): Promise<void> {
    return this.#ready;
  }

  /** The bound port (useful with port 0), or null when not bound. */
  get port(): number | null {
    return this.#server?.addr.port ?? null;
  }

  /** True when bound. */
  get listening(): boolean {
    return this.#server !== null;
  }

  #tryListen(): void {
    if (this.#stopped) return;
    try {
      this.#server = serveOn(this.opts.hostname, this.opts.port, this.opts.handler, (err) => {
        log.error("HTTP handler failed", err, { server: this.opts.name });
        return new Response("internal error", { status: 500 });
      });
      log.v(3).info(`Starting ${this.opts.name} HTTP server`, {
        address: `${this.opts.hostname}:${this.#server.addr.port}`,
      });
      this.#resolveReady();
    } catch (err) {
      const e = err instanceof Error ? err : new Error(String(err));
      const msg = `failed to start ${this.opts.name} server on ${this.opts.hostname}:${this.opts.port}`;
      if (this.opts.hardFail) {
        log.error(msg, e);
        this.opts.onFatal?.(new Error(`${msg}: ${e.message}`, { cause: e }));
        return;
      }
      log.error(msg + "; retrying in 5 s", e);
      this.#timer = this.#clock.setTimeout(() => {
        this.#timer = null;
        this.#tryListen();
      }, this.opts.retryMs ?? 5000);
    }
  }

  /** Stops retrying and closes the listener. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) this.#clock.clearTimeout(this.#timer);
    this.#timer = null;
    const s = this.#server;
    this.#server = null;
    if (s) await s.shutdown();
  }
}

/** Bind settings shared by the health and metrics servers. */
export interface BindOptions {
  /** `host:port`; port 0 picks a free port (tests). */
  bindAddress: string;
  bindAddressHardFail?: boolean;
  /** Called when binding fails and bindAddressHardFail is set. */
  onFatal?: (err: Error) => void;
  clock?: Clock;
}

/** A server on one {@linkcode RetryingListener}: the start/ready/port/stop every such server has. */
export abstract class SingleListenerServer {
  readonly #listener: RetryingListener;

  protected constructor(name: string, opts: BindOptions) {
    const { hostname, port } = parseBindAddress(opts.bindAddress);
    this.#listener = new RetryingListener({
      name,
      hostname,
      port,
      handler: (req) => this.handle(req),
      hardFail: opts.bindAddressHardFail,
      onFatal: opts.onFatal,
      clock: opts.clock,
    });
  }

  /** Handles one request (exposed for tests without sockets). */
  abstract handle(req: Request): Response | Promise<Response>;

  /** Starts listening (bind failures are retried every 5 s unless hard-fail). */
  start(): void {
    this.#listener.start();
  }

  /** Resolves once bound. */
  get ready(): Promise<void> {
    return this.#listener.ready;
  }

  /** The bound port, null when not bound. */
  get port(): number | null {
    return this.#listener.port;
  }

  /** Closes the listener. */
  stop(): Promise<void> {
    return this.#listener.stop();
  }
}
