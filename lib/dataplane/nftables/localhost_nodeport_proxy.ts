/**
 * Localhost NodePorts in nftables mode (KubeProxyNFTablesLocalhostNodePorts, with `nodePortAddresses` naming
 * loopback), as upstream v1.37's `pkg/proxy/localnodeportproxy`: nftables cannot DNAT traffic to 127.0.0.1 (or
 * ::1) without route_localnet, so a userspace TCP listener on the loopback address of the family takes each TCP
 * NodePort that has endpoints and copies every connection to one endpoint, chosen at random (with ClientIP
 * affinity, the last endpoint chosen while its timeout runs: all clients are the node itself). Connections stay
 * open when a listener goes; a NodePort without endpoints has no listener (connections are refused).
 * `localhostNodePorts` picks a snapshot's TCP NodePorts for the listeners.
 * @module
 */
import type { Logger } from "../../log.ts";
import { localhostNodePortListenerCreationFailuresTotal, localhostNodePortListeners } from "../../metrics.ts";
import type { IPFamily, ProxySnapshot } from "../../proxy/types.ts";

/** One TCP NodePort to serve on loopback. */
export interface LocalhostNodePort {
  /** `ns/name:port`, for logs. */
  readonly name: string;
  readonly nodePort: number;
  /** The endpoints traffic may go to (the external policy's), `{ip, port}`. */
  readonly endpoints: readonly { readonly ip: string; readonly port: number }[];
  /** ClientIP affinity timeout in seconds; 0 without affinity. */
  readonly affinitySeconds: number;
}

/** The TCP NodePorts of a snapshot the loopback listeners serve, with the external policy's endpoints (upstream's). */
export function localhostNodePorts(snapshot: ProxySnapshot): LocalhostNodePort[] {
  const out: LocalhostNodePort[] = [];
  for (const [name, st] of snapshot.servicePorts) {
    if (st.info.protocol !== "TCP" || st.info.nodePort === 0) continue;
    const eps = (st.plan.externalPolicyLocal ? st.selection.localEndpoints : st.selection.clusterEndpoints) ??
      [];
    out.push({
      name,
      nodePort: st.info.nodePort,
      endpoints: eps.map((e) => ({ ip: e.ip, port: e.port })),
      affinitySeconds: st.info.stickyMaxAgeSeconds,
    });
  }
  return out;
}

/** Upstream's dialTimeout. */
const DIAL_TIMEOUT_MS = 5000;

/** One listening NodePort. */
class Listener {
  endpoints: LocalhostNodePort["endpoints"];
  affinityMs: number;
  private pinned: { ip: string; port: number } | null = null;
  private pinnedAt = 0;
  private readonly conns = new Set<Deno.Conn>();

  constructor(
    readonly port: number,
    private readonly listener: Deno.TcpListener,
    spec: LocalhostNodePort,
    private readonly log: Logger,
  ) {
    this.endpoints = spec.endpoints;
    this.affinityMs = spec.affinitySeconds * 1000;
    void this.acceptLoop();
  }

  update(spec: LocalhostNodePort): void {
    this.endpoints = spec.endpoints;
    this.affinityMs = spec.affinitySeconds * 1000;
  }

  /** Stops accepting; connections already proxied go on. */
  close(): void {
    try {
      this.listener.close();
    } catch { /* closed already */ }
  }

  /** Closes the listener and every connection (tests, agent stop). */
  closeAll(): void {
    this.close();
    for (const c of this.conns) {
      try {
        c.close();
      } catch { /* closed already */ }
    }
  }

  private async acceptLoop(): Promise<void> {
    for (;;) {
      let conn: Deno.Conn;
      try {
        conn = await this.listener.accept();
      } catch (err) {
        if (err instanceof Deno.errors.BadResource || err instanceof Deno.errors.Interrupted) return;
        this.log.v(4).info("Accept error on localhost nodeport proxy", { err: String(err), port: this.port });
        continue;
      }
      void this.handle(conn);
    }
  }

  private pick(): { ip: string; port: number } | null {
    if (this.endpoints.length === 0) return null;
    const now = Date.now();
    if (this.affinityMs > 0 && this.pinned !== null && now - this.pinnedAt <= this.affinityMs) {
      const p = this.pinned;
      if (this.endpoints.some((e) => e.ip === p.ip && e.port === p.port)) {
        this.pinnedAt = now;
        return p;
      }
    }
    const ep = this.endpoints[Math.floor(Math.random() * this.endpoints.length)];
    if (this.affinityMs > 0) {
      this.pinned = ep;
      this.pinnedAt = now;
    }
    return ep;
  }

  private async handle(client: Deno.Conn): Promise<void> {
    this.conns.add(client);
    let backend: Deno.Conn | undefined;
    try {
      const ep = this.pick();
      if (ep === null) return;
      backend = await dial(ep.ip, ep.port).catch((err) => {
        this.log.v(4).info("Failed to connect to backend", {
          err: String(err),
          port: this.port,
          endpoint: `${ep.ip}:${ep.port}`,
        });
        return undefined;
      });
      if (backend === undefined) return;
      this.conns.add(backend);
      await Promise.all([copy(client, backend), copy(backend, client)]);
    } finally {
      for (const c of [client, backend]) {
        if (c === undefined) continue;
        this.conns.delete(c);
        try {
          c.close();
        } catch { /* closed already */ }
      }
    }
  }
}

/** Connects within DIAL_TIMEOUT_MS. */
async function dial(hostname: string, port: number): Promise<Deno.Conn> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const pending = Deno.connect({ hostname, port, transport: "tcp" });
  try {
    return await Promise.race([
      pending,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`dial ${hostname}:${port}: timeout`)), DIAL_TIMEOUT_MS);
      }),
    ]);
  } catch (err) {
    pending.then((c) => c.close(), () => {});
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** Copies `src` to `dst` until EOF, then half-closes `dst` (as Go's io.Copy + CloseWrite). */
async function copy(src: Deno.Conn, dst: Deno.Conn): Promise<void> {
  const buf = new Uint8Array(32 * 1024);
  try {
    for (;;) {
      const n = await src.read(buf);
      if (n === null) break;
      let off = 0;
      while (off < n) off += await dst.write(buf.subarray(off, n));
    }
  } catch { /* the other side went; closing below */ }
  try {
    await dst.closeWrite();
  } catch { /* closed already */ }
}

/** The loopback TCP listeners of one family. */
export class LocalhostNodePortProxy {
  private readonly address: string;
  private readonly active = new Map<number, Listener>();

  constructor(private readonly family: IPFamily, private readonly log: Logger) {
    this.address = family === "IPv6" ? "::1" : "127.0.0.1";
  }

  /** Listening NodePorts now. */
  get ports(): number[] {
    return [...this.active.keys()].sort((a, b) => a - b);
  }

  /** Makes the listeners those of `wanted` that have endpoints (upstream's SyncNodePorts). */
  sync(wanted: readonly LocalhostNodePort[]): void {
    const byPort = new Map<number, LocalhostNodePort>();
    for (const w of wanted) if (w.endpoints.length > 0) byPort.set(w.nodePort, w);
    for (const [port, l] of this.active) {
      if (byPort.has(port)) continue;
      this.log.v(2).info("Removing localhost nodeport proxy", { protocol: "TCP", port });
      l.close();
      this.active.delete(port);
    }
    for (const [port, spec] of byPort) {
      const existing = this.active.get(port);
      if (existing !== undefined) {
        existing.update(spec);
        continue;
      }
      let listener: Deno.TcpListener;
      try {
        listener = Deno.listen({ hostname: this.address, port, transport: "tcp" });
      } catch (err) {
        this.log.error("Failed to create localhost nodeport proxy", String(err), {
          protocol: "TCP",
          port,
          service: spec.name,
        });
        localhostNodePortListenerCreationFailuresTotal.inc({ ip_family: this.family });
        continue;
      }
      this.active.set(port, new Listener(port, listener, spec, this.log));
      this.log.v(4).info("Created localhost nodeport proxy", {
        protocol: "TCP",
        port,
        endpoints: spec.endpoints.length,
      });
    }
    localhostNodePortListeners.set({ ip_family: this.family }, this.active.size);
  }

  /** Closes every listener and connection. */
  shutdown(): void {
    for (const l of this.active.values()) l.closeAll();
    this.active.clear();
    localhostNodePortListeners.set({ ip_family: this.family }, 0);
  }
}
