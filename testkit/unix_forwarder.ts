/**
 * A byte-for-byte forwarder from a Unix socket to a TCP address, and the TCP-to-Unix half that runs in the
 * test process. Filesystem Unix sockets are not tied to a network namespace, so the pair carries
 * connections from the host namespace (where the tests run) into a namespace the tests created, without an
 * address or a route on the host: `ip netns exec NS deno run -A testkit/unix_forwarder.ts SOCKET HOST PORT`
 * listens on SOCKET and connects each client to HOST:PORT inside NS; {@linkcode TcpToUnixRelay} listens on
 * the host's loopback and connects each client to SOCKET. TLS passes through untouched.
 * @module
 */

/** Copies both directions until either side ends, then closes both. */
async function splice(a: Deno.Conn, b: Deno.Conn): Promise<void> {
  await Promise.allSettled([a.readable.pipeTo(b.writable), b.readable.pipeTo(a.writable)]);
  for (const c of [a, b]) {
    try {
      c.close();
    } catch { /* closed by pipeTo */ }
  }
}

/** Listens on 127.0.0.1 (a free port) in this process and forwards every connection to a Unix socket. */
export class TcpToUnixRelay {
  readonly #listener: Deno.TcpListener;
  readonly #conns = new Set<Deno.Conn>();
  readonly #loop: Promise<void>;

  private constructor(listener: Deno.TcpListener, socketPath: string) {
    this.#listener = listener;
    this.#loop = (async () => {
      for await (const conn of listener) {
        this.#conns.add(conn);
        (async () => {
          let up: Deno.Conn | undefined;
          try {
            up = await Deno.connect({ transport: "unix", path: socketPath });
            this.#conns.add(up);
            await splice(conn, up);
          } catch {
            try {
              conn.close();
            } catch { /* closed */ }
          } finally {
            this.#conns.delete(conn);
            if (up) this.#conns.delete(up);
          }
        })();
      }
    })().catch(() => {});
  }

  /** Starts relaying 127.0.0.1:<port> to `socketPath`. */
  static start(socketPath: string): TcpToUnixRelay {
    return new TcpToUnixRelay(Deno.listen({ hostname: "127.0.0.1", port: 0 }), socketPath);
  }

  /** The local port clients connect to. */
  get port(): number {
    return this.#listener.addr.port;
  }

  /** Stops listening and closes every relayed connection. */
  async close(): Promise<void> {
    try {
      this.#listener.close();
    } catch { /* closed */ }
    for (const c of this.#conns) {
      try {
        c.close();
      } catch { /* closed */ }
    }
    this.#conns.clear();
    await this.#loop;
  }
}

async function main(args: string[]): Promise<void> {
  const [path, host, port] = args;
  if (!path || !host || !port) throw new Error("usage: unix_forwarder.ts SOCKET HOST PORT");
  await Deno.remove(path).catch(() => {});
  const listener = Deno.listen({ transport: "unix", path });
  console.log("ready");
  for await (const conn of listener) {
    Deno.connect({ hostname: host, port: Number(port) })
      .then((up) => splice(conn, up))
      .catch(() => {
        try {
          conn.close();
        } catch { /* closed */ }
      });
  }
}

if (import.meta.main) await main(Deno.args);
