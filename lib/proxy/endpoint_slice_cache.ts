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
import { formatIPv4, isCanonicalIPv4, parseIP, scanIPv4 } from "../net/ip.ts";
import type { EndpointInfo, IPFamily, Protocol } from "./types.ts";
import {
  endpointIPErrors,
  endpointIPv4Errors,
  fieldError,
  isDNS1035Label,
  isDNS1123Label,
  isDNS1123Subdomain,
  isLabelValue,
  notSupportedError,
  SUPPORTED_PROTOCOLS,
} from "../kube/validation.ts";

/**
 * Reports a part of an EndpointSlice the model could not use (skipped): `reason` says what and why, in the
 * API's words, `field` is the path of the offending field (`endpoints[2].addresses[0]`, `ports[0].name`, ...).
 */
export type InvalidEndpointSliceCallback = (slice: EndpointSlice, reason: string, field: string) => void;

/** Key of a port inside one Service: `portName/protocol` (the ServicePortName minus the Service). */
export function portKey(portName: string, protocol: string): string {
  return `${portName}/${protocol}`;
}

/** Endpoints of one Service, per {@linkcode portKey}, each list sorted by `endpoint` (a Map satisfies it). */
export interface ServiceEndpoints {
  /** The endpoints of one port (never an empty list). */
  get(portKey: string): readonly EndpointInfo[] | undefined;
  /** The ports with endpoints. */
  keys(): Iterable<string>;
  /** Number of ports with endpoints. */
  readonly size: number;
}

interface SlicePort {
  readonly name: string;
  readonly port: number;
  readonly protocol: Protocol;
  /** `portKey(name, protocol)`. */
  readonly key: string;
}

const READY = 1, SERVING = 2, TERMINATING = 4, LOCAL = 8;
/** How many valid names of one kind are remembered before the memory starts over (a cluster has 5,000 nodes). */
const GOOD_NAMES_LIMIT = 20_000;

/** Zone and node hints of an endpoint (rare: kept out of the endpoint itself). */
interface Hints {
  readonly zones: ReadonlySet<string> | null;
  readonly nodes: ReadonlySet<string> | null;
}

/**
 * One endpoint of one slice port, as the proxy model holds it: the `ip:port` text (a flat string, also the sort
 * key), the port, the conditions as bits, interned node and zone names, and hints only when present. Built once
 * per slice version; unchanged endpoints stay the same objects from one sync to the next.
 */
class Endpoint implements EndpointInfo {
  constructor(
    readonly endpoint: string,
    readonly port: number,
    private readonly flags: number,
    readonly nodeName: string,
    readonly zone: string,
    private readonly hints: Hints | null,
  ) {}
  get ip(): string {
    const e = this.endpoint;
    return e.charCodeAt(0) === 91 /* [ */ ? e.slice(1, e.lastIndexOf("]")) : e.slice(0, e.lastIndexOf(":"));
  }
  get isLocal(): boolean {
    return (this.flags & LOCAL) !== 0;
  }
  get ready(): boolean {
    return (this.flags & READY) !== 0;
  }
  get serving(): boolean {
    return (this.flags & SERVING) !== 0;
  }
  get terminating(): boolean {
    return (this.flags & TERMINATING) !== 0;
  }
  get zoneHints(): ReadonlySet<string> | null {
    return this.hints?.zones ?? null;
  }
  get nodeHints(): ReadonlySet<string> | null {
    return this.hints?.nodes ?? null;
  }
}

/** `ip:port` / `[ip]:port` as one flat string (a concatenation would keep a cons string and its parts). */
function flatHostPort(ip: string, port: number): string {
  // `ip` is canonical text of a parsed address: only IPv6 has a colon.
  return ip.includes(":") ? ["[", ip, "]:", port].join("") : [ip, port].join(":");
}

/** Returns one shared copy of equal strings (node and zone names repeat across endpoints). */
class Interner {
  #m = new Map<string, string>();
  get(s: string): string {
    if (s === "") return s;
    const v = this.#m.get(s);
    if (v !== undefined) return v;
    if (this.#m.size >= 100_000) this.#m.clear();
    this.#m.set(s, s);
    return s;
  }
}

/**
 * A parsed slice: its ports and, per port, its endpoints sorted by `endpoint` with duplicates merged as upstream
 * merges them (a non-terminating copy wins over a terminating one, else the first stays). As the only slice of
 * its Service it is also that Service's {@linkcode ServiceEndpoints} (no merged copy is made).
 */
class SliceInfo implements ServiceEndpoints {
  constructor(
    readonly name: string,
    readonly ports: readonly SlicePort[],
    /** One list per port (index as `ports`); a slice without usable ports keeps one list for port 0. */
    readonly byPort: readonly (readonly EndpointInfo[])[],
    /** Port keys are distinct, so the lists can serve as the Service's endpoints as they are. */
    private readonly distinctKeys: boolean,
  ) {}

  /** True when this slice alone can stand for its Service's endpoints. */
  get standsAlone(): boolean {
    return this.distinctKeys;
  }

  get(key: string): readonly EndpointInfo[] | undefined {
    for (let i = 0; i < this.ports.length; i++) {
      if (this.ports[i].key === key) return this.byPort[i].length > 0 ? this.byPort[i] : undefined;
    }
    return undefined;
  }

  *keys(): Iterable<string> {
    for (let i = 0; i < this.ports.length; i++) if (this.byPort[i].length > 0) yield this.ports[i].key;
  }

  get size(): number {
    let n = 0;
    for (let i = 0; i < this.ports.length; i++) if (this.byPort[i].length > 0) n++;
    return n;
  }
}

const NO_SERVICE_ENDPOINTS: ServiceEndpoints = new Map<string, readonly EndpointInfo[]>();

function sameHints(a: EndpointInfo, b: EndpointInfo): boolean {
  return setEq(a.zoneHints, b.zoneHints) && setEq(a.nodeHints, b.nodeHints);
}

/**
 * Field-wise equality of two parsed slices, for no-op detection (upstream's reflect.DeepEqual). Compared
 * instead of keeping a canonical text per slice. Every port's list is derived from the same endpoints, so equal
 * ports and equal first lists mean equal slices.
 */
function sameSliceInfo(a: SliceInfo, b: SliceInfo): boolean {
  if (a.ports.length !== b.ports.length) return false;
  for (let i = 0; i < a.ports.length; i++) {
    const x = a.ports[i], y = b.ports[i];
    if (x !== y && (x.name !== y.name || x.port !== y.port || x.protocol !== y.protocol)) return false;
  }
  const p = a.byPort[0], q = b.byPort[0];
  if (p.length !== q.length) return false;
  for (let i = 0; i < p.length; i++) {
    const x = p[i], y = q[i];
    if (
      x.endpoint !== y.endpoint || x.nodeName !== y.nodeName || x.zone !== y.zone || x.ready !== y.ready ||
      x.serving !== y.serving || x.terminating !== y.terminating || !sameHints(x, y)
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

/** Merges a port's endpoint list (in slice order) by `endpoint`, as upstream merges duplicates; then sorts. */
function dedupSorted(list: Endpoint[]): Endpoint[] {
  // Stable sort: duplicates keep their slice order, so "the first stays" means the same as in a merge.
  list.sort((a, b) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
  let w = 0;
  for (let i = 0; i < list.length; i++) {
    const e = list[i];
    if (w > 0 && list[w - 1].endpoint === e.endpoint) {
      if (list[w - 1].terminating && !e.terminating) list[w - 1] = e;
      continue;
    }
    list[w++] = e;
  }
  list.length = w;
  return list;
}

/** The slices of every Service of one family, and the merged endpoints built from them. */
export class EndpointSliceCache {
  /** Per Service: its only slice, or its slices by name. */
  readonly #slices = new Map<string, SliceInfo | Map<string, SliceInfo>>();
  readonly #strings = new Interner();
  readonly #ports = new Map<string, readonly SlicePort[]>();
  /** Per validation function: names that passed it (see #nameErrors). */
  readonly #goodNames = new Map<(v: string) => string[], Set<string>>();

  /**
   * @param nodeName This node's name (for `isLocal`).
   * @param family The family this cache serves.
   */
  constructor(
    readonly nodeName: string,
    readonly family: IPFamily,
    private readonly onInvalid?: InvalidEndpointSliceCallback,
  ) {}

  /** Logs and reports one unusable part of a slice (the callback never breaks the cache). */
  #invalid(slice: EndpointSlice, reason: string, field: string): void {
    log.error(reason, undefined, {
      endpointSlice: `${slice.metadata?.namespace ?? ""}/${slice.metadata?.name ?? ""}`,
      ipFamily: this.family,
    });
    try {
      this.onInvalid?.(slice, reason, field);
    } catch (err) {
      log.error("Invalid-EndpointSlice callback failed", err);
    }
  }

  /** The API's rules for a slice's identity; false (reported) when the slice cannot be used at all. */
  #validIdentity(slice: EndpointSlice): boolean {
    const meta = slice.metadata ?? {};
    const checks: [string, unknown, (v: string) => string[]][] = [
      ["metadata.namespace", meta.namespace, isDNS1123Label],
      ["metadata.name", meta.name, isDNS1123Subdomain],
      [`metadata.labels[${LABEL_SERVICE_NAME}]`, meta.labels?.[LABEL_SERVICE_NAME], isDNS1035Label],
    ];
    for (const [path, value, check] of checks) {
      const errs = typeof value === "string" ? check(value) : ["must be a string"];
      if (errs.length > 0) {
        this.#invalid(slice, `Skipping invalid EndpointSlice: ${fieldError(path, value, errs)}`, path);
        return false;
      }
    }
    return true;
  }

  /**
   * Records a slice (or its removal). Returns the owning Service key when this changed the cached
   * content, null for no-ops, slices of another family and unusable slices.
   */
  update(slice: EndpointSlice, remove: boolean): string | null {
    const keys = sliceKeys(slice);
    if (!keys) return null;
    if (slice.addressType !== undefined && slice.addressType !== this.family) return null;
    // A slice with a bad identity is not cached (its previous version, if any, stays: names are immutable).
    if (!remove && !this.#validIdentity(slice)) return null;
    const cur = this.#slices.get(keys.serviceKey);
    const prev = cur === undefined
      ? undefined
      : cur instanceof SliceInfo
      ? (cur.name === keys.sliceName ? cur : undefined)
      : cur.get(keys.sliceName);
    if (remove) {
      if (!prev) return null;
      if (cur instanceof SliceInfo) this.#slices.delete(keys.serviceKey);
      else {
        const m = cur as Map<string, SliceInfo>;
        m.delete(keys.sliceName);
        if (m.size === 1) this.#slices.set(keys.serviceKey, m.values().next().value!);
      }
      return keys.serviceKey;
    }
    const info = this.#sliceInfo(slice, keys.sliceName);
    if (prev && sameSliceInfo(prev, info)) return null;
    if (cur === undefined || (cur instanceof SliceInfo && cur.name === keys.sliceName)) {
      this.#slices.set(keys.serviceKey, info);
    } else if (cur instanceof SliceInfo) {
      this.#slices.set(keys.serviceKey, new Map([[cur.name, cur], [info.name, info]]));
    } else cur.set(keys.sliceName, info);
    return keys.serviceKey;
  }

  /** Number of Services with at least one slice. */
  get serviceCount(): number {
    return this.#slices.size;
  }

  /** Merged endpoints of one Service from its current slices. */
  endpointsFor(serviceKey: string): ServiceEndpoints {
    const cur = this.#slices.get(serviceKey);
    if (cur === undefined) return NO_SERVICE_ENDPOINTS;
    if (cur instanceof SliceInfo && cur.standsAlone) return cur;
    const bySlice = cur instanceof SliceInfo ? new Map([[cur.name, cur]]) : cur;
    const out = new Map<string, readonly EndpointInfo[]>();
    // Slices in name order so that the result does not depend on arrival order.
    const names = [...bySlice.keys()].sort();
    const sets = new Map<string, Map<string, EndpointInfo>>();
    for (const sliceName of names) {
      const info = bySlice.get(sliceName)!;
      for (let j = 0; j < info.ports.length; j++) {
        const key = info.ports[j].key;
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

  /** The slice's ports, one shared (frozen) list per distinct set of ports. */
  #internPorts(ports: SlicePort[]): readonly SlicePort[] {
    let key = "";
    for (const p of ports) key += `${p.name}\u0000${p.port}\u0000${p.protocol}\u0001`;
    const hit = this.#ports.get(key);
    if (hit) return hit;
    if (this.#ports.size >= 10_000) this.#ports.clear();
    const frozen = Object.freeze(ports.map((p) => Object.freeze(p)));
    this.#ports.set(key, frozen);
    return frozen;
  }

  /**
   * The first field of an endpoint the API would have refused (its address parsed as the slice's family, its
   * node name, zone, hostname and hints) as `problem`, or, when the endpoint is usable, its first address's
   * canonical text as `ip`. Field paths are spelled only for a problem (this runs for every endpoint).
   */
  #checkEndpoint(
    ep: NonNullable<EndpointSlice["endpoints"]>[number],
    i: number,
  ): { ip: string; problem?: undefined } | { ip?: undefined; problem: { field: string; message: string } } {
    const fail = (suffix: string, value: unknown, errs: readonly string[]) => {
      const path = `endpoints[${i}]${suffix}`;
      return { problem: { field: path, message: fieldError(path, value, errs) } };
    };
    const addresses = ep.addresses ?? [];
    let first = "";
    for (let j = 0; j < addresses.length; j++) {
      const raw = addresses[j];
      const v4 = this.family === "IPv4" && typeof raw === "string" ? scanIPv4(raw) : -1;
      if (v4 >= 0) {
        // Plain dotted-quad IPv4 (the common case), checked as a number.
        const errs = endpointIPv4Errors(raw, v4);
        if (errs.length > 0) return fail(`.addresses[${j}]`, raw, errs);
        if (j === 0) first = isCanonicalIPv4(raw) ? raw : formatIPv4(v4);
        continue;
      }
      const parsed = typeof raw === "string" ? parseIP(raw) : null;
      if (!parsed) return fail(`.addresses[${j}]`, raw, ["must be a valid IP address"]);
      if (parsed.family !== this.family) {
        return fail(`.addresses[${j}]`, raw, [`must be an ${this.family} address`]);
      }
      const errs = endpointIPErrors(raw, parsed.ip, this.family);
      if (errs.length > 0) return fail(`.addresses[${j}]`, raw, errs);
      if (j === 0) first = parsed.ip;
    }
    let errs = this.#nameErrors(ep.nodeName, isDNS1123Subdomain, false);
    if (errs) return fail(".nodeName", ep.nodeName, errs);
    if ((errs = this.#nameErrors(ep.zone, isLabelValue, false))) return fail(".zone", ep.zone, errs);
    if ((errs = this.#nameErrors(ep.hostname, isDNS1123Label, false))) {
      return fail(".hostname", ep.hostname, errs);
    }
    const zones = ep.hints?.forZones ?? [];
    for (let k = 0; k < zones.length; k++) {
      if ((errs = this.#nameErrors(zones[k]?.name, isLabelValue, true))) {
        return fail(`.hints.forZones[${k}].name`, zones[k]?.name, errs);
      }
    }
    const nodes = ep.hints?.forNodes ?? [];
    for (let k = 0; k < nodes.length; k++) {
      if ((errs = this.#nameErrors(nodes[k]?.name, isDNS1123Subdomain, true))) {
        return fail(`.hints.forNodes[${k}].name`, nodes[k]?.name, errs);
      }
    }
    return { ip: first };
  }

  /**
   * A name field's errors under `check`, or null when it is absent (unless `required`) or valid. Names that
   * passed are remembered per check (node names and zones repeat across every slice of a cluster).
   */
  #nameErrors(value: unknown, check: (v: string) => string[], required: boolean): readonly string[] | null {
    if (!required && (value === undefined || value === null)) return null;
    if (typeof value !== "string") return ["must be a string"];
    let good = this.#goodNames.get(check);
    if (good?.has(value)) return null;
    const errs = check(value);
    if (errs.length > 0) return errs;
    if (!good) this.#goodNames.set(check, good = new Set());
    if (good.size >= GOOD_NAMES_LIMIT) good.clear();
    good.add(value);
    return null;
  }

  #sliceInfo(slice: EndpointSlice, sliceName: string): SliceInfo {
    const ports: SlicePort[] = [];
    for (const [i, p] of (slice.ports ?? []).entries()) {
      if (!p) continue;
      if (typeof p.name === "string" && p.name !== "") {
        const errs = isDNS1123Label(p.name);
        if (errs.length > 0) {
          this.#invalid(
            slice,
            `Ignoring invalid endpoint port: ${fieldError(`ports[${i}].name`, p.name, errs)}`,
            `ports[${i}].name`,
          );
          continue;
        }
      }
      if (p.protocol !== undefined && p.protocol !== null && !SUPPORTED_PROTOCOLS.includes(p.protocol)) {
        this.#invalid(
          slice,
          `Ignoring invalid endpoint port: ${
            notSupportedError(`ports[${i}].protocol`, p.protocol, SUPPORTED_PROTOCOLS)
          }`,
          `ports[${i}].protocol`,
        );
        continue;
      }
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
      const protocol = (p.protocol ?? "TCP") as Protocol;
      ports.push({ name: p.name, port: p.port, protocol, key: portKey(p.name, protocol) });
    }
    ports.sort((a, b) => a.port - b.port);
    const strings = this.#strings;
    const parsed: { ip: string; flags: number; nodeName: string; zone: string; hints: Hints | null }[] = [];
    for (const [i, ep] of (slice.endpoints ?? []).entries()) {
      const raw = ep?.addresses?.[0];
      if (!raw) {
        log.error("Ignoring invalid endpoint port with empty address", undefined, {
          slice: slice.metadata?.name,
        });
        continue;
      }
      // `ip`: canonical text of an address checked to be of this family (upstream's ParseIPSloppy().String()).
      const { ip, problem } = this.#checkEndpoint(ep, i);
      if (problem) {
        this.#invalid(slice, `Ignoring invalid endpoint: ${problem.message}`, problem.field);
        continue;
      }
      const c = ep.conditions ?? {};
      const zoneHints = ep.hints?.forZones?.length ? ep.hints.forZones.map((z) => z.name).sort() : null;
      const nodeHints = ep.hints?.forNodes?.length ? ep.hints.forNodes.map((n) => n.name).sort() : null;
      const nodeName = strings.get(ep.nodeName ?? "");
      let flags = 0;
      if (c.ready === undefined || c.ready === null || c.ready === true) flags |= READY;
      if (c.serving === undefined || c.serving === null || c.serving === true) flags |= SERVING;
      if (c.terminating === true) flags |= TERMINATING;
      if (this.nodeName !== "" && nodeName === this.nodeName) flags |= LOCAL;
      parsed.push({
        ip,
        flags,
        nodeName,
        zone: strings.get(ep.zone ?? ""),
        hints: zoneHints || nodeHints
          ? { zones: zoneHints ? new Set(zoneHints) : null, nodes: nodeHints ? new Set(nodeHints) : null }
          : null,
      });
    }
    const make = (port: number) =>
      dedupSorted(
        parsed.map((e) => new Endpoint(flatHostPort(e.ip, port), port, e.flags, e.nodeName, e.zone, e.hints)),
      );
    const byPort = ports.length === 0 ? [make(0)] : ports.map((p) => make(p.port));
    const distinct = new Set(ports.map((p) => p.key)).size === ports.length;
    return new SliceInfo(sliceName, this.#internPorts(ports), byPort, distinct);
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
