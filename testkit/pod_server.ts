/**
 * A tiny "pod" program for the dataplane tests: it tells every caller who answered and which source
 * address it saw, so a test can tell which endpoint a Service sent it to and whether the client's IP
 * was masqueraded or preserved.
 *
 * ```
 * ip netns exec POD deno run -A testkit/pod_server.ts --name pod-a --tcp 8080 --udp 8081 [--tcp 9090 ...]
 * ```
 *
 * - TCP: on accept it writes one line `<name> <peer-ip>:<peer-port>\n`; every line the client sends
 *   afterwards is answered with the same line again (so a held connection can be checked later).
 * - UDP: every datagram is answered with `<name> <peer-ip>:<peer-port>\n`.
 * - `--bind ADDR` (default 0.0.0.0) chooses the listen address; `--bind ::` serves IPv6 and IPv4 (peers of
 *   the latter then show as `::ffff:a.b.c.d`).
 * - Once every socket listens it prints `ready` on stdout; it runs until killed.
 * @module
 */

import dgram from "node:dgram";

/** Parsed command line of the pod server. */
export interface PodServerOptions {
  name: string;
  bind: string;
  tcpPorts: number[];
  udpPorts: number[];
}

/** Parses `--name N --tcp P --udp P --bind A` (each port flag may repeat, `--flag=value` works too). */
export function parsePodServerArgs(args: string[]): PodServerOptions {
  const opts: PodServerOptions = { name: "pod", bind: "0.0.0.0", tcpPorts: [], udpPorts: [] };
  for (let i = 0; i < args.length; i++) {
    let flag = args[i];
    let value: string | undefined;
    const eq = flag.indexOf("=");
    if (eq > 0) {
      value = flag.slice(eq + 1);
      flag = flag.slice(0, eq);
    } else {
      value = args[++i];
    }
    if (value === undefined) throw new Error(`flag ${flag} needs a value`);
    switch (flag) {
      case "--name":
        opts.name = value;
        break;
      case "--bind":
        opts.bind = value;
        break;
      case "--tcp":
        opts.tcpPorts.push(parsePort(value));
        break;
      case "--udp":
        opts.udpPorts.push(parsePort(value));
        break;
      default:
        throw new Error(`unknown flag ${flag}`);
    }
  }
  return opts;
}

function parsePort(s: string): number {
  const n = Number(s);
  if (!Number.isInteger(n) || n < 1 || n > 65535) throw new Error(`bad port ${s}`);
  return n;
}

const encoder = new TextEncoder();

async function serveTcpConn(conn: Deno.TcpConn, name: string): Promise<void> {
  const peer = conn.remoteAddr;
  const line = encoder.encode(`${name} ${peer.hostname}:${peer.port}\n`);
  try {
    await conn.write(line);
    const buf = new Uint8Array(4096);
    while (true) {
      const n = await conn.read(buf);
      if (n === null) break;
      // One answer per newline received.
      for (let i = 0; i < n; i++) if (buf[i] === 10) await conn.write(line);
    }
  } catch {
    // Peer reset or went away: nothing to do.
  } finally {
    try {
      conn.close();
    } catch { /* already closed */ }
  }
}

async function serveTcp(listener: Deno.TcpListener, name: string): Promise<void> {
  for await (const conn of listener) {
    conn.setNoDelay(true);
    serveTcpConn(conn, name);
  }
}

function serveUdp(bind: string, port: number, name: string): Promise<void> {
  // An IPv6 bind address (e.g. `::`, which also takes IPv4 unless net.ipv6.bindv6only=1) needs a udp6 socket.
  const sock = dgram.createSocket(bind.includes(":") ? "udp6" : "udp4");
  sock.on("message", (_msg, rinfo) => {
    sock.send(`${name} ${rinfo.address}:${rinfo.port}\n`, rinfo.port, rinfo.address);
  });
  return new Promise((resolve, reject) => {
    sock.once("error", reject);
    sock.bind(port, bind, () => resolve());
  });
}

/** Starts every listener of `opts`; resolves once all listen. */
export async function startPodServer(opts: PodServerOptions): Promise<void> {
  for (const port of opts.tcpPorts) {
    const listener = Deno.listen({ hostname: opts.bind, port, transport: "tcp" });
    serveTcp(listener, opts.name);
  }
  for (const port of opts.udpPorts) await serveUdp(opts.bind, port, opts.name);
}

if (import.meta.main) {
  const opts = parsePodServerArgs(Deno.args);
  await startPodServer(opts);
  await Deno.stdout.write(encoder.encode("ready\n"));
}
