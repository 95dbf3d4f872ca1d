/**
 * What the service health server is told after each sync (upstream's `SyncServices(HealthCheckNodePorts())`
 * and `SyncEndpoints(LocalReadyEndpoints())`), kept per Service and brought up to date only for the Services a
 * sync rebuilt: at 10k Services x 10 endpoints, recomputing both maps from every endpoint after every sync took
 * ~5 ms (p50) and ~23 ms (p99, the garbage of 10k sets) of the agent's share of a one-endpoint change. The
 * server is still told of the ports after every sync: it retries then a listener it could not open.
 *
 * The count is upstream's per-family one (distinct local ready IPs of one family), the larger of the two
 * families when dual-stack, so a dual-stack pod counts once, as each of upstream's per-family servers reports it.
 * @module
 */
import type { IPFamily, ServiceHealthUpdater, ServicePortState } from "./types.ts";

/** One Service's health facts in one family. */
interface Entry {
  /** Its health-check node port, 0 for none. */
  readonly port: number;
  /** Distinct local ready endpoint IPs. */
  readonly local: number;
}

/** The health-check node ports and local ready endpoint counts of every Service, updated per Service. */
export class ServiceHealthBook {
  readonly #families = new Map<IPFamily, Map<string, Entry>>();
  /** The merged maps handed to the server (kept and updated in place). */
  readonly #ports = new Map<string, number>();
  readonly #counts = new Map<string, number>();
  /** Services whose entries changed since the last {@linkcode flush}. */
  readonly #dirty = new Set<string>();

  /** Records Service `key`'s ports in `family` as a sync built them; `undefined` when it has none (gone). */
  set(family: IPFamily, key: string, states: readonly ServicePortState[] | undefined): void {
    let entries = this.#families.get(family);
    if (entries === undefined) this.#families.set(family, entries = new Map());
    this.#dirty.add(key);
    if (states === undefined) {
      entries.delete(key);
      return;
    }
    let port = 0;
    const localIPs = new Set<string>();
    for (const { info, endpoints } of states) {
      if (info.healthCheckNodePort !== 0) port = info.healthCheckNodePort;
      for (const e of endpoints) if (e.isLocal && e.ready) localIPs.add(e.ip);
    }
    entries.set(key, { port, local: localIPs.size });
  }

  /** Forgets every Service of `family` (each is marked changed); the caller sets them again. */
  clear(family: IPFamily): void {
    const entries = this.#families.get(family);
    if (entries === undefined) return;
    for (const key of entries.keys()) this.#dirty.add(key);
    entries.clear();
  }

  /**
   * Merges the changed Services into the server's maps and tells `server` (after a successful sync); the ports
   * every time, since the server retries a listener that failed to open when it is told of the ports.
   */
  flush(server: ServiceHealthUpdater): void {
    for (const key of this.#dirty) {
      let port = 0, local = 0;
      for (const entries of this.#families.values()) {
        const e = entries.get(key);
        if (e === undefined) continue;
        if (e.port !== 0) port = e.port;
        if (e.local > local) local = e.local;
      }
      if (port === 0) this.#ports.delete(key);
      else this.#ports.set(key, port);
      if (local === 0) this.#counts.delete(key);
      else this.#counts.set(key, local);
    }
    this.#dirty.clear();
    server.syncServices(this.#ports);
    server.syncEndpoints(this.#counts);
  }
}
