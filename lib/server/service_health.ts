/**
 * Per-service health-check node ports for `externalTrafficPolicy: Local` LoadBalancer services
 * (upstream `pkg/proxy/healthcheck/service_health.go`). Cloud load balancers probe
 * `http://<node>:<healthCheckNodePort>/` (any path) to learn whether this node has local endpoints:
 * 200 when it has local ready endpoints and the proxy is healthy, else 503.
 *
 * The proxier calls {@linkcode ServiceHealthServer.syncServices} and
 * {@linkcode ServiceHealthServer.syncEndpoints} after each sync; listeners open and close as services
 * come and go. A port that cannot be opened is reported (Event `FailedToStartServiceHealthcheck`) and
 * retried on the next sync.
 * @module
 */
import { log } from "../log.ts";
import { serveOn } from "./listen.ts";
import type { ServiceHealthUpdater } from "../proxy/types.ts";

/** Options of {@linkcode ServiceHealthServer}. */
export interface ServiceHealthServerOptions {
  /** Addresses to listen on for each port (node IPs matching nodePortAddresses, or "0.0.0.0" for all). */
  addresses: readonly string[];
  /** Proxy health (from the ProxyHealthServer); absent means always healthy. */
  proxyHealthy?: () => boolean;
  /** Called when a port cannot be opened (main.ts emits the Event). */
  onListenError?: (serviceKey: string, port: number, err: Error) => void;
}

interface HcInstance {
  port: number;
  servers: Deno.HttpServer<Deno.NetAddr>[];
}

/** Opens one listener per wanted health-check node port. */
export class ServiceHealthServer implements ServiceHealthUpdater {
  readonly #services = new Map<string, HcInstance>();
  /** The ports asked for by the last syncServices. */
  #wanted: ReadonlyMap<string, number> = new Map();
  /** Local ready endpoints per Service, read at request time. */
  #counts: ReadonlyMap<string, number> = new Map();
  /** Ports whose listeners are shutting down, until the port is free again. */
  readonly #closingPorts = new Map<number, Promise<void>>();
  #closing: Promise<void>[] = [];
  #stopped = false;

  constructor(private readonly opts: ServiceHealthServerOptions) {}

  /** Services with an open listener, and their ports (tests, debugging). */
  listening(): Map<string, number[]> {
    const out = new Map<string, number[]>();
    for (const [k, inst] of this.#services) out.set(k, inst.servers.map((s) => s.addr.port));
    return out;
  }

  /** Resolves when listeners waiting for a port being released (a handover) have been opened. */
  async settled(): Promise<void> {
    while (this.#closingPorts.size > 0) await Promise.all(this.#closingPorts.values());
  }

  syncServices(ports: ReadonlyMap<string, number>): void {
    this.#wanted = ports;
    for (const [key, inst] of this.#services) {
      if (ports.get(key) === inst.port) continue;
      log.v(2).info("Closing healthcheck", { service: key, port: inst.port });
      this.#close(inst);
      this.#services.delete(key);
    }
    for (const [key, port] of ports) {
      if (this.#services.has(key)) continue;
      const releasing = this.#closingPorts.get(port);
      if (releasing) {
        // The port moves from a closed listener to this one: open it once the old one has let go, as
        // upstream's synchronous Close does, instead of failing with AddrInUse until the next sync.
        void releasing.then(() => {
          if (!this.#stopped && this.#wanted.get(key) === port && !this.#services.has(key)) {
            this.#open(key, port);
          }
        });
        continue;
      }
      this.#open(key, port);
    }
  }

  syncEndpoints(counts: ReadonlyMap<string, number>): void {
    this.#counts = counts;
  }

  #open(key: string, port: number): void {
    log.v(2).info("Opening healthcheck", { service: key, port });
    const inst: HcInstance = { port, servers: [] };
    try {
      for (const hostname of this.opts.addresses) {
        inst.servers.push(serveOn(hostname, port, (req) => this.#handle(key, req)));
      }
    } catch (err) {
      const e = err instanceof Error ? err : new Error(String(err));
      log.error("Failed to start healthcheck", e, { service: key, port });
      this.#close(inst);
      try {
        this.opts.onListenError?.(key, port, e);
      } catch { /* reporting must not break the sync */ }
      return; // retried on the next sync
    }
    this.#services.set(key, inst);
  }

  #handle(key: string, _req: Request): Response {
    const [namespace, name] = key.split("/", 2);
    const count = this.#counts.get(key) ?? 0;
    const healthy = this.opts.proxyHealthy ? this.opts.proxyHealthy() : true;
    const ok = count > 0 && healthy;
    // Upstream's exact body text (a dedented, tab-indented template), so that scripts matching it keep working.
    const body = `{\n\t"service": {\n\t\t"namespace": ${JSON.stringify(namespace)},\n\t\t"name": ${
      JSON.stringify(name)
    }\n\t},\n\t"localEndpoints": ${count},\n\t"serviceProxyHealthy": ${healthy}\n}`;
    return new Response(body, {
      status: ok ? 200 : 503,
      headers: {
        "Content-Type": "application/json",
        "X-Content-Type-Options": "nosniff",
        "X-Load-Balancing-Endpoint-Weight": String(count),
      },
    });
  }

  #close(inst: HcInstance): void {
    if (inst.servers.length === 0) return;
    const done = Promise.all(inst.servers.map((s) => s.shutdown().catch(() => {}))).then(() => {
      if (this.#closingPorts.get(inst.port) === done) this.#closingPorts.delete(inst.port);
    });
    this.#closingPorts.set(inst.port, done);
    this.#closing.push(done);
    inst.servers = [];
  }

  /** Closes every listener. */
  async stop(): Promise<void> {
    this.#stopped = true;
    for (const inst of this.#services.values()) this.#close(inst);
    this.#services.clear();
    const closing = this.#closing;
    this.#closing = [];
    await Promise.all(closing);
  }
}
