/**
 * EndpointSlices merged per Service for one IP family (upstream `pkg/proxy/endpointslicecache.go`).
 *
 * Rules: a slice belongs to the Service named by its `kubernetes.io/service-name` label; ports with no
 * name or port 0 are ignored; of each endpoint only `addresses[0]` is used; endpoints of the other
 * family (and FQDN slices) are ignored; conditions default as upstream (ready/serving true when unset,
 * terminating false); an endpoint is local when its nodeName is this node; the same `ip:port` in two
 * slices keeps the non-terminating copy; each port's list is sorted by the `ip:port` string.
 * @module
 */
import { type EndpointSlice, LABEL_SERVICE_NAME } from "../kube/types.ts";
import { log } from "../log.ts";
import { familyOf, joinHostPort } from "../net/ip.ts";
import type { EndpointInfo, IPFamily, Protocol } from "./types.ts";

/** Key of a port inside one Service: `portName/protocol` (the ServicePortName minus the Service). */
export function portKey(portName: string, protocol: string): string {
  return `${portName}/${protocol}`;
}

/** Endpoints of one Service, per {@linkcode portKey}, each list sorted by `endpoint`. */
export type ServiceEndpoints = ReadonlyMap<string, readonly EndpointInfo[]>;

interface SlicePort {
  name: string;
  port: number;
  protocol: Protocol;
}

interface SliceEndpoint {
  ip: string;
  nodeName: string;
  zone: string;
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  zoneHints: string[] | null;
  nodeHints: string[] | null;
}

/**
 * A parsed slice. Its endpoints are kept only as the {@linkcode EndpointInfo}s of each port (sorted by IP),
 * built once per slice version and shared by every merge, so that the merged lists of unchanged endpoints are
 * the same objects from one checkout to the next and the endpoint data is held once.
 */
interface SliceInfo {
  ports: SlicePort[];
  /** One list per port (index as `ports`); a slice without usable ports keeps one list for port 0. */
  byPort: EndpointInfo[][];
}

/**
 * Field-wise equality of two parsed slices, for no-op detection (upstream's reflect.DeepEqual). Compared
 * instead of keeping a canonical text per slice, which cost about 1.3 KiB per 10-endpoint slice. Every
 * port's list is derived from the same endpoints, so equal ports and equal first lists mean equal slices.
 */
function sameSliceInfo(a: SliceInfo, b: SliceInfo): boolean {
  if (a.ports.length !== b.ports.length) return false;
  for (let i = 0; i < a.ports.length; i++) {
    const x = a.ports[i], y = b.ports[i];
    if (x.name !== y.name || x.port !== y.port || x.protocol !== y.protocol) return false;
  }
  const p = a.byPort[0], q = b.byPort[0];
  if (p.length !== q.length) return false;
  for (let i = 0; i < p.length; i++) {
    const x = p[i], y = q[i];
    if (
      x.ip !== y.ip || x.nodeName !== y.nodeName || x.zone !== y.zone || x.ready !== y.ready ||
      x.serving !== y.serving || x.terminating !== y.terminating || !setEq(x.zoneHints, y.zoneHints) ||
      !setEq(x.nodeHints, y.nodeHints)
    ) return false;
  }
  return true;
}

/** Cache keys of a slice: owning Service `ns/name` and slice name, or null when unusable. */
export function sliceKeys(slice: EndpointSlice): { serviceKey: string; sliceName: string } | null {
  const svcName = slice.metadata?.labels?.[LABEL_SERVICE_NAME];
  const ns = slice.metadata?.namespace;
  const name = slice.metadata?.name;
  if (!svcName) {
    log.error(
      "Error getting endpoint slice cache keys",
      `no ${LABEL_SERVICE_NAME} label set on endpoint slice: ${name}`,
    );
    return null;
  }
  if (!ns || !name) {
    log.error(
      "Error getting endpoint slice cache keys",
      "expected EndpointSlice name and namespace to be set",
    );
    return null;
  }
  return { serviceKey: `${ns}/${svcName}`, sliceName: name };
}

/** The slices of every Service of one family, and the merged endpoints built from them. */
export class EndpointSliceCache {
  readonly #slices = new Map<string, Map<string, SliceInfo>>();

  /**
   * @param nodeName This node's name (for `isLocal`).
   * @param family The family this cache serves.
   */
  constructor(readonly nodeName: string, readonly family: IPFamily) {}

  /**
   * Records a slice (or its removal). Returns the owning Service key when this changed the cached
   * content, null for no-ops, slices of another family and unusable slices.
   */
  update(slice: EndpointSlice, remove: boolean): string | null {
    const keys = sliceKeys(slice);
    if (!keys) return null;
    if (slice.addressType !== undefined && slice.addressType !== this.family) return null;
    const bySlice = this.#slices.get(keys.serviceKey);
    if (remove) {
      if (!bySlice?.has(keys.sliceName)) return null;
      bySlice.delete(keys.sliceName);
      if (bySlice.size === 0) this.#slices.delete(keys.serviceKey);
      return keys.serviceKey;
    }
    const info = this.#sliceInfo(slice);
    const prev = bySlice?.get(keys.sliceName);
    if (prev && sameSliceInfo(prev, info)) return null;
    if (bySlice) bySlice.set(keys.sliceName, info);
    else this.#slices.set(keys.serviceKey, new Map([[keys.sliceName, info]]));
    return keys.serviceKey;
  }

  /** Number of Services with at least one slice. */
  get serviceCount(): number {
    return this.#slices.size;
  }

  /** Merged endpoints of one Service from its current slices. */
  endpointsFor(serviceKey: string): Map<string, EndpointInfo[]> {
    const out = new Map<string, EndpointInfo[]>();
    const bySlice = this.#slices.get(serviceKey);
    if (!bySlice) return out;
    // Slices in name order so that the result does not depend on arrival order.
    const names = [...bySlice.keys()].sort();
    const sets = new Map<string, Map<string, EndpointInfo>>();
    for (const sliceName of names) {
      const info = bySlice.get(sliceName)!;
      for (let j = 0; j < info.ports.length; j++) {
        const port = info.ports[j];
        const key = portKey(port.name, port.protocol);
        let set = sets.get(key);
        if (!set) sets.set(key, set = new Map());
        for (const e of info.byPort[j]) {
          const existing = set.get(e.endpoint);
          // Duplicates across slices happen while an endpoint moves between slices: a non-terminating
          // copy wins over a terminating one; otherwise the first one (in slice-name order) stays.
          if (existing && !(existing.terminating && !e.terminating)) continue;
          set.set(e.endpoint, e);
        }
      }
    }
    for (const [key, set] of sets) {
      if (set.size === 0) continue;
      const list = [...set.values()];
      list.sort((a, b) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
      out.set(key, list);
    }
    return out;
  }

  #endpointInfo(e: SliceEndpoint, port: number): EndpointInfo {
    const endpoint = joinHostPort(e.ip, port);
    return {
      ip: e.ip,
      port,
      endpoint,
      isLocal: this.nodeName !== "" && e.nodeName === this.nodeName,
      ready: e.ready,
      serving: e.serving,
      terminating: e.terminating,
      zoneHints: e.zoneHints ? new Set(e.zoneHints) : null,
      nodeHints: e.nodeHints ? new Set(e.nodeHints) : null,
      nodeName: e.nodeName,
      zone: e.zone,
    };
  }

  #sliceInfo(slice: EndpointSlice): SliceInfo {
    const ports: SlicePort[] = [];
    for (const p of slice.ports ?? []) {
      if (!p) continue;
      if (p.name === undefined || p.name === null) {
        log.error("Ignoring port with nil name", undefined, { slice: slice.metadata?.name });
        continue;
      }
      if (typeof p.port !== "number" || p.port <= 0 || p.port > 65535) {
        log.error("Ignoring invalid endpoint port", undefined, {
          portName: p.name,
          slice: slice.metadata?.name,
        });
        continue;
      }
      ports.push({ name: p.name, port: p.port, protocol: (p.protocol ?? "TCP") as Protocol });
    }
    ports.sort((a, b) => a.port - b.port);
    const endpoints: SliceEndpoint[] = [];
    for (const ep of slice.endpoints ?? []) {
      const ip = ep?.addresses?.[0];
      if (!ip) {
        log.error("Ignoring invalid endpoint port with empty address", undefined, {
          slice: slice.metadata?.name,
        });
        continue;
      }
      if (familyOf(ip) !== this.family) continue;
      const c = ep.conditions ?? {};
      const zoneHints = ep.hints?.forZones?.length ? ep.hints.forZones.map((z) => z.name).sort() : null;
      const nodeHints = ep.hints?.forNodes?.length ? ep.hints.forNodes.map((n) => n.name).sort() : null;
      endpoints.push({
        ip,
        nodeName: ep.nodeName ?? "",
        zone: ep.zone ?? "",
        ready: c.ready === undefined || c.ready === null || c.ready === true,
        serving: c.serving === undefined || c.serving === null || c.serving === true,
        terminating: c.terminating === true,
        zoneHints,
        nodeHints,
      });
    }
    endpoints.sort((a, b) => (a.ip < b.ip ? -1 : a.ip > b.ip ? 1 : 0));
    const byPort = ports.length === 0
      ? [endpoints.map((e) => this.#endpointInfo(e, 0))]
      : ports.map((p) => endpoints.map((e) => this.#endpointInfo(e, p.port)));
    return { ports, byPort };
  }
}

/** Field-wise equality of two endpoint lists (order matters; both are sorted). */
export function endpointListsEqual(a: readonly EndpointInfo[], b: readonly EndpointInfo[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    const y = b[i];
    if (x === y) continue; // shared across checkouts while the slice is unchanged
    if (
      x.endpoint !== y.endpoint || x.isLocal !== y.isLocal || x.ready !== y.ready ||
      x.serving !== y.serving ||
      x.terminating !== y.terminating || x.nodeName !== y.nodeName || x.zone !== y.zone ||
      !setEq(x.zoneHints, y.zoneHints) || !setEq(x.nodeHints, y.nodeHints)
    ) return false;
  }
  return true;
}

function setEq(a: ReadonlySet<string> | null, b: ReadonlySet<string> | null): boolean {
  if (a === null || b === null) return a === b;
  if (a.size !== b.size) return false;
  for (const v of a) if (!b.has(v)) return false;
  return true;
}
