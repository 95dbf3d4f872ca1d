/**
 * An in-process kube-apiserver simulator for tests, benchmarks and the scale harness.
 *
 * It speaks the wire protocol kube-proxy uses: list (with `limit`/`continue` pagination, label and field
 * selectors) and watch (NDJSON `{type, object}` lines, `resourceVersion`, `allowWatchBookmarks`,
 * `timeoutSeconds`, in-stream or HTTP 410 Expired once the history window is compacted) of Services,
 * EndpointSlices and Nodes, plus create/update/patch/delete and POST of events.k8s.io/v1 Events. Errors are
 * `Status` bodies. Auth is an optional bearer token; TLS is optional, and mTLS (client certificates checked
 * against a client CA) goes through a small node:tls front end because `Deno.serve` cannot ask for client
 * certificates.
 *
 * ```ts
 * const sim = await ApiServerSimulator.start({ token: "t" });
 * sim.upsert("services", { metadata: { namespace: "ns", name: "a" }, spec: { clusterIP: "10.0.0.1" } });
 * const kubeconfig = await sim.writeKubeconfig();
 * sim.faults.dropWatches();
 * sim.stats.lists("services");
 * await sim.close();
 * ```
 *
 * Objects are stored once with their serialized JSON, lists are built by concatenating those strings and
 * sorted keys are cached, so tens of thousands of objects list and fan out cheaply.
 * @module
 */

import type { KubeObject, Status } from "../lib/kube/types.ts";
import tls from "node:tls";
import net from "node:net";

/** The resources the simulator serves. */
export type ResourceName = "services" | "endpointslices" | "nodes" | "events" | "servicecidrs";

interface ResourceInfo {
  name: ResourceName;
  kind: string;
  apiVersion: string;
  prefix: string;
  namespaced: boolean;
}

const RESOURCES: Record<ResourceName, ResourceInfo> = {
  services: { name: "services", kind: "Service", apiVersion: "v1", prefix: "/api/v1", namespaced: true },
  endpointslices: {
    name: "endpointslices",
    kind: "EndpointSlice",
    apiVersion: "discovery.k8s.io/v1",
    prefix: "/apis/discovery.k8s.io/v1",
    namespaced: true,
  },
  nodes: { name: "nodes", kind: "Node", apiVersion: "v1", prefix: "/api/v1", namespaced: false },
  servicecidrs: {
    name: "servicecidrs",
    kind: "ServiceCIDR",
    apiVersion: "networking.k8s.io/v1",
    prefix: "/apis/networking.k8s.io/v1",
    namespaced: false,
  },
  events: {
    name: "events",
    kind: "Event",
    apiVersion: "events.k8s.io/v1",
    prefix: "/apis/events.k8s.io/v1",
    namespaced: true,
  },
};

/** Options of {@link ApiServerSimulator.start}. */
export interface SimulatorOptions {
  /** Serve HTTPS with this server certificate and key (PEM). */
  tls?: { cert: string; key: string };
  /** With `tls`: require client certificates signed by this CA (PEM). */
  clientCA?: string;
  /** Require `Authorization: Bearer <token>` (changeable later through `sim.token`). */
  token?: string;
  /** Watch events kept per resource before compaction (default 10 000). */
  historySize?: number;
  /** Period of bookmarks to watchers that asked for them; 0 disables (default 60 000 ms, as the apiserver). */
  bookmarkIntervalMs?: number;
  /** Watch duration when the client gives no timeoutSeconds (default 1 800 000 ms). */
  defaultWatchTimeoutMs?: number;
  /** How a watch from a compacted resourceVersion fails: an ERROR event (apiserver default) or HTTP 410. */
  expiredAs?: "event" | "http";
  /** Port to listen on (default: any free port). */
  port?: number;
  /**
   * Serve `resourceVersion=0` lists whole, ignoring `limit`, as kube-apiserver's watch cache (on by default
   * there) does; clients then get the initial list in one request. Default false: every list is paginated.
   */
  watchCache?: boolean;
  /**
   * Serve watch-list (`sendInitialEvents=true`), as kube-apiserver with its WatchList gate (default true). False:
   * such a watch is answered 422 Invalid, as an API server with the gate off.
   */
  watchList?: boolean;
}

/** What kind of request a fault applies to. */
export type RequestKind = "list" | "watch" | "get" | "write" | "any";

interface FailRule {
  remaining: number;
  status: number;
  kind: RequestKind;
  resource?: ResourceName;
}

interface Stored {
  obj: KubeObject;
  json: string;
}

interface HistoryEntry {
  rv: number;
  type: "ADDED" | "MODIFIED" | "DELETED";
  obj: KubeObject;
  json: string;
  old?: KubeObject;
}

type Matcher = (obj: KubeObject) => boolean;

interface Watcher {
  resource: ResourceName;
  match: Matcher;
  bookmarks: boolean;
  controller: ReadableStreamDefaultController<Uint8Array>;
  timer?: ReturnType<typeof setTimeout>;
  closed: boolean;
}

class ResourceStore {
  readonly objects = new Map<string, Stored>();
  private sorted: string[] | null = null;
  history: HistoryEntry[] = [];
  /** Events with rv <= compactedRv are gone from history. */
  compactedRv = 0;

  constructor(readonly info: ResourceInfo) {}

  sortedKeys(): string[] {
    if (!this.sorted) this.sorted = [...this.objects.keys()].sort();
    return this.sorted;
  }

  set(key: string, s: Stored): void {
    if (!this.objects.has(key)) this.sorted = null;
    this.objects.set(key, s);
  }

  remove(key: string): void {
    if (this.objects.delete(key)) this.sorted = null;
  }

  record(e: HistoryEntry, size: number): void {
    this.history.push(e);
    if (this.history.length > size * 2) {
      const drop = this.history.length - size;
      this.compactedRv = this.history[drop - 1].rv;
      this.history = this.history.slice(drop);
    }
  }

  /** Drops history beyond `size` entries now (lazy trimming above keeps pushes cheap). */
  trim(size: number): void {
    if (this.history.length > size) {
      const drop = this.history.length - size;
      this.compactedRv = this.history[drop - 1].rv;
      this.history = this.history.slice(drop);
    }
  }
}

/** A kube-apiserver Status error body. */
export function statusBody(code: number, reason: string, message: string): Status {
  return { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message, reason, code };
}

const REASONS: Record<number, string> = {
  400: "BadRequest",
  401: "Unauthorized",
  403: "Forbidden",
  404: "NotFound",
  405: "MethodNotAllowed",
  409: "Conflict",
  410: "Expired",
  422: "Invalid",
  429: "TooManyRequests",
  500: "InternalError",
  503: "ServiceUnavailable",
  504: "Timeout",
};

/**
 * What kube-apiserver answers (after waiting up to 3 s) for a list or watch from a resourceVersion it has not
 * reached, e.g. after an etcd restore: 504 with cause ResourceVersionTooLarge.
 */
/**
 * An object's JSON as kube-apiserver puts it in a list: without `apiVersion` and `kind` (the list carries
 * them). Stored JSON starts with both (see `upsert`), so this is a slice.
 */
function listItemJson(json: string, info: ResourceInfo): string {
  const prefix = `{"apiVersion":${JSON.stringify(info.apiVersion)},"kind":${JSON.stringify(info.kind)},`;
  return json.startsWith(prefix) ? "{" + json.slice(prefix.length) : json;
}

function tooLargeResourceVersion(asked: number, current: number): Response {
  const body: Status & { details: unknown } = {
    ...statusBody(504, "Timeout", `Too large resource version: ${asked}, current: ${current}`),
    details: {
      causes: [{ reason: "ResourceVersionTooLarge", message: "Too large resource version" }],
      retryAfterSeconds: 1,
    },
  };
  return new Response(JSON.stringify(body), { status: 504, headers: { "Content-Type": "application/json" } });
}

function statusResponse(code: number, message?: string): Response {
  const reason = REASONS[code] ?? "Unknown";
  return new Response(JSON.stringify(statusBody(code, reason, message ?? reason)), {
    status: code,
    headers: { "content-type": "application/json" },
  });
}

class HttpError extends Error {
  constructor(readonly code: number, message: string) {
    super(message);
  }
}

function keyOf(obj: KubeObject): string {
  const ns = obj.metadata?.namespace;
  return ns ? `${ns}/${obj.metadata?.name}` : `${obj.metadata?.name}`;
}

// ---------------------------------------------------------------------------------------------------------
// Selectors

/** Parses a label selector (`k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, comma = AND). */
export function parseLabelSelector(sel: string): Matcher {
  const reqs: Matcher[] = [];
  const parts: string[] = [];
  let depth = 0, start = 0;
  for (let i = 0; i < sel.length; i++) {
    const c = sel[i];
    if (c === "(") depth++;
    else if (c === ")") depth--;
    else if (c === "," && depth === 0) {
      parts.push(sel.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(sel.slice(start));
  for (const raw of parts) {
    const p = raw.trim();
    if (p === "") continue;
    let m: RegExpMatchArray | null;
    if ((m = p.match(/^([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)$/))) {
      const [, k, op, list] = m;
      const vals = new Set(list.split(",").map((v) => v.trim()));
      reqs.push(
        op === "in"
          ? (o) => o.metadata?.labels?.[k] !== undefined && vals.has(o.metadata.labels[k])
          : (o) => o.metadata?.labels?.[k] === undefined || !vals.has(o.metadata.labels[k]),
      );
    } else if ((m = p.match(/^([^\s!=]+)\s*!=\s*(\S*)$/))) {
      const [, k, v] = m;
      reqs.push((o) => o.metadata?.labels?.[k] !== v);
    } else if ((m = p.match(/^([^\s!=]+)\s*==?\s*(\S*)$/))) {
      const [, k, v] = m;
      reqs.push((o) => o.metadata?.labels?.[k] === v);
    } else if ((m = p.match(/^!\s*([^\s!=]+)$/))) {
      const k = m[1];
      reqs.push((o) => o.metadata?.labels?.[k] === undefined);
    } else if ((m = p.match(/^([^\s!=(),]+)$/))) {
      const k = m[1];
      reqs.push((o) => o.metadata?.labels?.[k] !== undefined);
    } else {
      throw new HttpError(400, `unable to parse requirement: ${JSON.stringify(p)}`);
    }
  }
  return (o) => reqs.every((r) => r(o));
}

const FIELDS: Record<ResourceName, string[]> = {
  services: ["metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"],
  endpointslices: ["metadata.name", "metadata.namespace", "addressType"],
  nodes: ["metadata.name", "spec.unschedulable"],
  servicecidrs: ["metadata.name"],
  events: ["metadata.name", "metadata.namespace", "reason", "type", "reportingController"],
};

function fieldValue(obj: KubeObject, path: string): string {
  // deno-lint-ignore no-explicit-any
  let v: any = obj;
  for (const part of path.split(".")) v = v?.[part];
  return v === undefined || v === null ? "" : String(v);
}

/** Parses a field selector (`f=v`, `f==v`, `f!=v`, comma = AND) for one resource. */
export function parseFieldSelector(sel: string, resource: ResourceName): Matcher {
  const reqs: Matcher[] = [];
  for (const raw of sel.split(",")) {
    const p = raw.trim();
    if (p === "") continue;
    const m = p.match(/^([^!=]+)(!=|==|=)(.*)$/);
    if (!m) throw new HttpError(400, `invalid selector: '${sel}'; can't understand '${p}'`);
    const [, f, op, v] = m;
    if (!FIELDS[resource].includes(f)) {
      throw new HttpError(400, `field label not supported: ${f}`);
    }
    reqs.push(op === "!=" ? (o) => fieldValue(o, f) !== v : (o) => fieldValue(o, f) === v);
  }
  return (o) => reqs.every((r) => r(o));
}

// ---------------------------------------------------------------------------------------------------------
// Stats and faults

/** Request counters; tests assert on them ("no new list after a dropped watch"). */
export class SimulatorStats {
  /** Every request: `METHOD path?query`, newest last (at most 2000 kept). */
  readonly log: string[] = [];
  /** User-Agent headers seen. */
  readonly userAgents = new Set<string>();
  /** Common names of client certificates seen by the mTLS front end. */
  readonly clientCNs = new Set<string>();
  /** Query strings of watch requests, per resource, newest last. */
  readonly watchQueries: Record<string, URLSearchParams[]> = {};
  /** Query strings of list requests (every page), per resource. */
  readonly listQueries: Record<string, URLSearchParams[]> = {};
  private counts = new Map<string, number>();
  /** Total requests. */
  requests = 0;
  /** Requests rejected with 401. */
  unauthorized = 0;

  /** When each list and watch request arrived (`performance.now()`), in order (the last 10 000). */
  readonly arrivals: { kind: string; resource: string; at: number }[] = [];

  /** Increments a counter `kind:resource`. */
  bump(kind: string, resource: string): void {
    if (kind === "list" || kind === "watch") {
      this.arrivals.push({ kind, resource, at: performance.now() });
      if (this.arrivals.length > 10_000) this.arrivals.shift();
    }
    const k = `${kind}:${resource}`;
    this.counts.set(k, (this.counts.get(k) ?? 0) + 1);
  }

  /** A counter: `kind` is list, watch, get, create, update, patch, delete; resource optional (all). */
  count(kind: string, resource?: string): number {
    if (resource) return this.counts.get(`${kind}:${resource}`) ?? 0;
    let n = 0;
    for (const [k, v] of this.counts) if (k.startsWith(kind + ":")) n += v;
    return n;
  }

  /** List requests (pages) of a resource, or of all. */
  lists(resource?: ResourceName): number {
    return this.count("list", resource);
  }

  /** Watch requests of a resource, or of all. */
  watches(resource?: ResourceName): number {
    return this.count("watch", resource);
  }
}

/** Fault injection knobs. */
export class SimulatorFaults {
  /** Delay before every request is answered, in ms. */
  delayMs = 0;
  /** @internal */
  rules: FailRule[] = [];

  constructor(private readonly sim: ApiServerSimulator) {}

  /** Fails the next `n` requests of `kind` (and resource) with `status` and a Status body. */
  failNext(n: number, status: number, opts: { kind?: RequestKind; resource?: ResourceName } = {}): void {
    this.rules.push({ remaining: n, status, kind: opts.kind ?? "any", resource: opts.resource });
  }

  /** Removes every pending failNext rule and the delay. */
  clear(): void {
    this.rules = [];
    this.delayMs = 0;
  }

  /** Aborts every open watch stream without a clean end (the client sees a connection error). */
  dropWatches(): void {
    this.sim.closeWatchers("error");
  }

  /** Ends every open watch stream cleanly (as when timeoutSeconds expires). */
  endWatches(): void {
    this.sim.closeWatchers("end");
  }

  /** Writes a line that is not JSON into every open watch stream. */
  malformed(line = '{"type":"ADDED","object":{not json'): void {
    this.sim.writeRaw(line + "\n");
  }

  /** @internal Returns the status to fail this request with, if a rule matches. */
  take(kind: RequestKind, resource: ResourceName | undefined): number | undefined {
    for (const r of this.rules) {
      if (r.remaining <= 0) continue;
      if (r.kind !== "any" && r.kind !== kind) continue;
      if (r.resource && r.resource !== resource) continue;
      r.remaining--;
      return r.status;
    }
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------------------------

const enc = new TextEncoder();

interface ParsedPath {
  resource: ResourceName;
  namespace?: string;
  name?: string;
}

function parsePath(path: string): ParsedPath | undefined {
  for (const info of Object.values(RESOURCES)) {
    if (!path.startsWith(info.prefix + "/")) continue;
    const rest = path.slice(info.prefix.length + 1).split("/").filter((s) => s !== "");
    if (rest[0] === info.name && rest.length <= 2) return { resource: info.name, name: rest[1] };
    if (info.namespaced && rest[0] === "namespaces" && rest[2] === info.name && rest.length <= 4) {
      return { resource: info.name, namespace: rest[1], name: rest[3] };
    }
  }
  return undefined;
}

/** The API server simulator. Create with {@link ApiServerSimulator.start}. */
export class ApiServerSimulator {
  /** Base URL, e.g. `http://127.0.0.1:34567`. */
  url = "";
  /** Bearer token required of clients (undefined: no auth). Assign to rotate. */
  token: string | undefined;
  /** Request counters. */
  readonly stats: SimulatorStats = new SimulatorStats();
  /** Fault injection. */
  readonly faults: SimulatorFaults = new SimulatorFaults(this);
  /** Current (global) resourceVersion. */
  rv = 1;

  private readonly stores = new Map<ResourceName, ResourceStore>();
  private readonly watchers = new Set<Watcher>();
  private server?: Deno.HttpServer;
  private front?: tls.Server;
  private frontSockets = new Set<net.Socket>();
  private bookmarkTimer?: ReturnType<typeof setInterval>;
  private uidSeq = 0;
  private readonly opts:
    & Required<Omit<SimulatorOptions, "tls" | "clientCA" | "token" | "port" | "watchCache" | "watchList">>
    & SimulatorOptions;

  private constructor(opts: SimulatorOptions) {
    this.opts = {
      historySize: 10_000,
      bookmarkIntervalMs: 60_000,
      defaultWatchTimeoutMs: 1_800_000,
      expiredAs: "event",
      ...opts,
    };
    this.token = opts.token;
    for (const info of Object.values(RESOURCES)) this.stores.set(info.name, new ResourceStore(info));
  }

  /** Starts a simulator listening on 127.0.0.1. */
  static async start(opts: SimulatorOptions = {}): Promise<ApiServerSimulator> {
    const sim = new ApiServerSimulator(opts);
    await sim.listen();
    return sim;
  }

  private async listen(): Promise<void> {
    const o = this.opts;
    const behindFront = !!(o.tls && o.clientCA);
    const serveOpts: Deno.ServeTcpOptions & Partial<Deno.TlsCertifiedKeyPem> = {
      hostname: "127.0.0.1",
      port: behindFront ? 0 : o.port ?? 0,
      onListen: () => {},
    };
    if (o.tls && !behindFront) Object.assign(serveOpts, { cert: o.tls.cert, key: o.tls.key });
    this.server = Deno.serve(serveOpts, (req) => this.handle(req));
    const port = (this.server.addr as Deno.NetAddr).port;
    if (behindFront) {
      // mTLS front end: terminate TLS with client certificate verification, then pipe to Deno.serve.
      this.front = tls.createServer(
        { cert: o.tls!.cert, key: o.tls!.key, ca: o.clientCA, requestCert: true, rejectUnauthorized: true },
        (sock) => {
          const cn = sock.getPeerCertificate()?.subject?.CN;
          if (cn) this.stats.clientCNs.add(String(cn));
          const up = net.connect(port, "127.0.0.1");
          this.frontSockets.add(sock);
          this.frontSockets.add(up);
          sock.pipe(up);
          up.pipe(sock);
          const done = () => {
            sock.destroy();
            up.destroy();
            this.frontSockets.delete(sock);
            this.frontSockets.delete(up);
          };
          sock.on("error", done);
          up.on("error", done);
          sock.on("close", done);
          up.on("close", done);
        },
      );
      await new Promise<void>((resolve) => this.front!.listen(o.port ?? 0, "127.0.0.1", resolve));
      const fport = (this.front.address() as net.AddressInfo).port;
      this.url = `https://127.0.0.1:${fport}`;
    } else {
      this.url = `${o.tls ? "https" : "http"}://127.0.0.1:${port}`;
    }
    if (o.bookmarkIntervalMs > 0) {
      this.bookmarkTimer = setInterval(() => this.bookmark(), o.bookmarkIntervalMs);
    }
  }

  /** Stops the server, ending every open watch. */
  async close(): Promise<void> {
    if (this.bookmarkTimer !== undefined) clearInterval(this.bookmarkTimer);
    this.closeWatchers("end");
    for (const s of this.frontSockets) s.destroy();
    if (this.front) await new Promise<void>((r) => this.front!.close(() => r()));
    await this.server?.shutdown();
  }

  // ------------------------------------------------------------------------------------------ object API

  /** Creates or replaces an object; sets resourceVersion (and uid, creationTimestamp when new). */
  upsert<T extends KubeObject>(resource: ResourceName, obj: T): T {
    const store = this.store(resource);
    const { apiVersion, kind, ...rest } = JSON.parse(JSON.stringify(obj)) as T;
    // apiVersion and kind first, so that list items can drop them cheaply (listItemJson).
    const copy = {
      apiVersion: apiVersion ?? store.info.apiVersion,
      kind: kind ?? store.info.kind,
      ...rest,
    } as T;
    const meta = copy.metadata ??= {};
    if (!meta.name) throw new HttpError(422, "metadata.name: Required value");
    if (store.info.namespaced) meta.namespace ??= "default";
    else delete meta.namespace;
    const key = keyOf(copy);
    const prev = store.objects.get(key);
    meta.uid ??= prev?.obj.metadata?.uid ??
      `00000000-0000-4000-8000-${String(++this.uidSeq).padStart(12, "0")}`;
    meta.creationTimestamp ??= prev?.obj.metadata?.creationTimestamp ?? new Date().toISOString().replace(
      /\.\d+Z$/,
      "Z",
    );
    const rv = ++this.rv;
    meta.resourceVersion = String(rv);
    const json = JSON.stringify(copy);
    store.set(key, { obj: copy, json });
    this.emit(store, { rv, type: prev ? "MODIFIED" : "ADDED", obj: copy, json, old: prev?.obj });
    return copy;
  }

  /** Upserts many objects (same as calling {@link upsert} for each). */
  upsertMany<T extends KubeObject>(resource: ResourceName, objs: T[]): void {
    for (const o of objs) this.upsert(resource, o);
  }

  /** Deletes an object by namespace/name (or name); returns whether it existed. */
  delete(resource: ResourceName, namespace: string | undefined, name: string): boolean {
    const store = this.store(resource);
    const key = store.info.namespaced ? `${namespace ?? "default"}/${name}` : name;
    const prev = store.objects.get(key);
    if (!prev) return false;
    store.remove(key);
    const rv = ++this.rv;
    const obj = { ...prev.obj, metadata: { ...prev.obj.metadata, resourceVersion: String(rv) } };
    this.emit(store, { rv, type: "DELETED", obj, json: JSON.stringify(obj) });
    return true;
  }

  /** One object (a copy), or undefined. */
  get<T extends KubeObject = KubeObject>(
    resource: ResourceName,
    namespace: string | undefined,
    name: string,
  ): T | undefined {
    const store = this.store(resource);
    const s = store.objects.get(store.info.namespaced ? `${namespace ?? "default"}/${name}` : name);
    return s ? JSON.parse(s.json) as T : undefined;
  }

  /** All objects of a resource (copies), sorted by key. */
  list<T extends KubeObject = KubeObject>(resource: ResourceName): T[] {
    const store = this.store(resource);
    return store.sortedKeys().map((k) => JSON.parse(store.objects.get(k)!.json) as T);
  }

  /** Number of stored objects of a resource. */
  size(resource: ResourceName): number {
    return this.store(resource).objects.size;
  }

  /** Forgets the watch history: every watch from an older resourceVersion now gets 410 Expired. */
  compact(): void {
    for (const s of this.stores.values()) {
      s.history = [];
      s.compactedRv = this.rv;
    }
  }

  /** Sends a BOOKMARK with the current resourceVersion to every watcher that allows bookmarks. */
  bookmark(): void {
    for (const w of this.watchers) {
      if (!w.bookmarks || w.closed) continue;
      const info = RESOURCES[w.resource];
      this.send(
        w,
        `{"type":"BOOKMARK","object":{"kind":"${info.kind}","apiVersion":"${info.apiVersion}","metadata":{"resourceVersion":"${this.rv}"}}}\n`,
      );
    }
  }

  /** Open watch streams (optionally of one resource). */
  openWatches(resource?: ResourceName): number {
    let n = 0;
    for (const w of this.watchers) if (!w.closed && (!resource || w.resource === resource)) n++;
    return n;
  }

  /** Writes a kubeconfig for this simulator into a temp file and returns its path. */
  async writeKubeconfig(opts: {
    token?: string;
    tokenFile?: string;
    caFile?: string;
    caData?: string;
    clientCertFile?: string;
    clientKeyFile?: string;
    insecure?: boolean;
    path?: string;
  } = {}): Promise<string> {
    const path = opts.path ?? await Deno.makeTempFile({ prefix: "kubeconfig-", suffix: ".yaml" });
    const b64 = (s: string) => btoa(s);
    const cluster: string[] = [`    server: ${this.url}`];
    if (opts.caFile) cluster.push(`    certificate-authority: ${opts.caFile}`);
    if (opts.caData) cluster.push(`    certificate-authority-data: ${b64(opts.caData)}`);
    if (opts.insecure) cluster.push(`    insecure-skip-tls-verify: true`);
    const user: string[] = [];
    const token = opts.token ?? (opts.tokenFile ? undefined : this.token);
    if (token) user.push(`    token: ${token}`);
    if (opts.tokenFile) user.push(`    tokenFile: ${opts.tokenFile}`);
    if (opts.clientCertFile) user.push(`    client-certificate: ${opts.clientCertFile}`);
    if (opts.clientKeyFile) user.push(`    client-key: ${opts.clientKeyFile}`);
    const text = [
      "apiVersion: v1",
      "kind: Config",
      "clusters:",
      "- name: sim",
      "  cluster:",
      ...cluster,
      "users:",
      "- name: sim",
      user.length ? "  user:" : "  user: {}",
      ...user,
      "contexts:",
      "- name: sim",
      "  context:",
      "    cluster: sim",
      "    user: sim",
      "current-context: sim",
      "",
    ].join("\n");
    await Deno.writeTextFile(path, text);
    return path;
  }

  // ------------------------------------------------------------------------------------------ internals

  private store(resource: ResourceName): ResourceStore {
    const s = this.stores.get(resource);
    if (!s) throw new Error(`unknown resource ${resource}`);
    return s;
  }

  private emit(store: ResourceStore, e: HistoryEntry): void {
    store.record(e, this.opts.historySize);
    for (const w of this.watchers) {
      if (w.resource === store.info.name && !w.closed) this.deliver(w, e);
    }
  }

  private deliver(w: Watcher, e: HistoryEntry): void {
    const now = w.match(e.obj);
    if (e.type === "ADDED") {
      if (now) this.send(w, `{"type":"ADDED","object":${e.json}}\n`);
    } else if (e.type === "DELETED") {
      if (now) this.send(w, `{"type":"DELETED","object":${e.json}}\n`);
    } else {
      const before = e.old ? w.match(e.old) : false;
      if (before && now) this.send(w, `{"type":"MODIFIED","object":${e.json}}\n`);
      else if (!before && now) this.send(w, `{"type":"ADDED","object":${e.json}}\n`);
      else if (before && !now) {
        const gone = { ...e.old, metadata: { ...e.old!.metadata, resourceVersion: String(e.rv) } };
        this.send(w, `{"type":"DELETED","object":${JSON.stringify(gone)}}\n`);
      }
    }
  }

  private send(w: Watcher, line: string): void {
    if (w.closed) return;
    try {
      w.controller.enqueue(enc.encode(line));
    } catch {
      this.dropWatcher(w);
    }
  }

  private dropWatcher(w: Watcher): void {
    w.closed = true;
    if (w.timer !== undefined) clearTimeout(w.timer);
    this.watchers.delete(w);
  }

  /** @internal */
  closeWatchers(how: "end" | "error"): void {
    for (const w of [...this.watchers]) {
      this.dropWatcher(w);
      try {
        if (how === "end") w.controller.close();
        else w.controller.error("");
      } catch { /* already closed */ }
    }
  }

  /** @internal */
  writeRaw(text: string): void {
    for (const w of this.watchers) this.send(w, text);
  }

  private async handle(req: Request): Promise<Response> {
    this.stats.requests++;
    const url = new URL(req.url);
    const q = url.searchParams;
    const entry = `${req.method} ${url.pathname}${url.search}`;
    this.stats.log.push(entry);
    if (this.stats.log.length > 2000) this.stats.log.splice(0, 1000);
    const ua = req.headers.get("user-agent");
    if (ua) this.stats.userAgents.add(ua);
    if (this.faults.delayMs > 0) await new Promise((r) => setTimeout(r, this.faults.delayMs));
    try {
      if (this.token !== undefined && req.headers.get("authorization") !== `Bearer ${this.token}`) {
        this.stats.unauthorized++;
        return statusResponse(401, "Unauthorized");
      }
      const p = parsePath(url.pathname);
      if (!p) return statusResponse(404, `the server could not find the requested resource`);
      const isWatch = q.get("watch") === "true" || q.get("watch") === "1";
      const kind: RequestKind = req.method === "GET"
        ? (isWatch ? "watch" : p.name ? "get" : "list")
        : "write";
      if (kind === "list" || kind === "watch") this.stats.bump(kind, p.resource);
      const fail = this.faults.take(kind, p.resource);
      if (fail !== undefined) return statusResponse(fail);
      if (req.method === "GET") {
        if (isWatch) {
          if (p.name) return statusResponse(400, "watch of a single object by path is not supported");
          return this.watch(p, q);
        }
        if (p.name) {
          this.stats.bump("get", p.resource);
          const s = this.store(p.resource).objects.get(p.namespace ? `${p.namespace}/${p.name}` : p.name);
          if (!s) return statusResponse(404, `${p.resource} "${p.name}" not found`);
          return new Response(s.json, { headers: { "content-type": "application/json" } });
        }
        return this.listResponse(p, q);
      }
      return await this.write(req, p);
    } catch (e) {
      if (e instanceof HttpError) return statusResponse(e.code, e.message);
      return statusResponse(500, String(e));
    }
  }

  private matcher(p: ParsedPath, q: URLSearchParams): Matcher {
    const ls = q.get("labelSelector");
    const fs = q.get("fieldSelector");
    const lm = ls ? parseLabelSelector(ls) : undefined;
    const fm = fs ? parseFieldSelector(fs, p.resource) : undefined;
    const ns = p.namespace;
    return (o) => (!ns || o.metadata?.namespace === ns) && (!lm || lm(o)) && (!fm || fm(o));
  }

  private listResponse(p: ParsedPath, q: URLSearchParams): Response {
    (this.stats.listQueries[p.resource] ??= []).push(q);
    const store = this.store(p.resource);
    const match = this.matcher(p, q);
    const askedRv = Number(q.get("resourceVersion") || "0");
    // kube-apiserver's watch cache ignores the limit of resourceVersion=0 lists (cacher computeListLimit).
    const fromCache = this.opts.watchCache === true && q.get("resourceVersion") === "0" && !q.get("continue");
    const limit = fromCache ? 0 : Number(q.get("limit") ?? "0");
    if (askedRv > this.rv) return tooLargeResourceVersion(askedRv, this.rv);
    let startAfter = "";
    let listRv = this.rv;
    const cont = q.get("continue");
    if (cont) {
      if (q.get("resourceVersion")) {
        throw new HttpError(400, "specifying resource version is not allowed when using continue");
      }
      let tok: { rv: number; start: string };
      try {
        tok = JSON.parse(atob(cont));
      } catch {
        throw new HttpError(400, "continue key is not valid");
      }
      if (tok.rv < store.compactedRv) {
        return statusResponse(
          410,
          "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
        );
      }
      startAfter = tok.start;
      listRv = tok.rv;
    }
    const keys = store.sortedKeys();
    let i = 0;
    if (startAfter) {
      // binary search for the first key > startAfter
      let lo = 0, hi = keys.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (keys[mid] <= startAfter) lo = mid + 1;
        else hi = mid;
      }
      i = lo;
    }
    const items: string[] = [];
    let lastKey = "";
    for (; i < keys.length; i++) {
      if (limit > 0 && items.length >= limit) break;
      const s = store.objects.get(keys[i])!;
      if (!match(s.obj)) continue;
      items.push(listItemJson(s.json, store.info));
      lastKey = keys[i];
    }
    let more = false;
    for (let j = i; j < keys.length; j++) {
      if (match(store.objects.get(keys[j])!.obj)) {
        more = true;
        break;
      }
    }
    const meta: Record<string, unknown> = { resourceVersion: String(listRv) };
    if (limit > 0 && more) meta.continue = btoa(JSON.stringify({ rv: listRv, start: lastKey }));
    const info = store.info;
    const body = `{"kind":"${info.kind}List","apiVersion":"${info.apiVersion}","metadata":${
      JSON.stringify(meta)
    },"items":[${items.join(",")}]}`;
    return new Response(body, { headers: { "content-type": "application/json" } });
  }

  private watch(p: ParsedPath, q: URLSearchParams): Response {
    (this.stats.watchQueries[p.resource] ??= []).push(q);
    const store = this.store(p.resource);
    const match = this.matcher(p, q);
    const rvParam = q.get("resourceVersion") ?? "";
    const fromRv = rvParam === "" || rvParam === "0" ? undefined : Number(rvParam);
    if (fromRv !== undefined && !Number.isFinite(fromRv)) {
      throw new HttpError(400, `invalid resource version: ${rvParam}`);
    }
    if (fromRv !== undefined && fromRv > this.rv) return tooLargeResourceVersion(fromRv, this.rv);
    // Watch-list (client-go's WatchListClient, on by default since v1.35): the current state as ADDED events,
    // then a bookmark annotated initial-events-end, then live events. kube-apiserver validates the options so.
    const sendInitialEvents = q.get("sendInitialEvents") === "true";
    if (sendInitialEvents && this.opts.watchList === false) {
      throw new HttpError(
        422,
        "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
      );
    }
    if (sendInitialEvents) {
      if (q.get("resourceVersionMatch") !== "NotOlderThan") {
        throw new HttpError(422, "resourceVersionMatch: must be NotOlderThan when sendInitialEvents is true");
      }
      if (q.get("allowWatchBookmarks") !== "true") {
        throw new HttpError(422, "allowWatchBookmarks: must be true when sendInitialEvents is true");
      }
    } else if (q.get("resourceVersionMatch")) {
      throw new HttpError(
        422,
        "resourceVersionMatch: is forbidden for watch unless sendInitialEvents is true",
      );
    }
    const expired = !sendInitialEvents && fromRv !== undefined && fromRv < store.compactedRv;
    if (expired && this.opts.expiredAs === "http") {
      return statusResponse(410, `too old resource version: ${fromRv} (${store.compactedRv})`);
    }
    const timeoutMs = q.get("timeoutSeconds")
      ? Number(q.get("timeoutSeconds")) * 1000
      : this.opts.defaultWatchTimeoutMs;
    let watcher: Watcher;
    const body = new ReadableStream<Uint8Array>({
      start: (controller) => {
        watcher = {
          resource: p.resource,
          match,
          bookmarks: q.get("allowWatchBookmarks") === "true",
          controller,
          closed: false,
        };
        if (expired) {
          const st = statusBody(410, "Expired", `too old resource version: ${fromRv} (${store.compactedRv})`);
          controller.enqueue(enc.encode(`{"type":"ERROR","object":${JSON.stringify(st)}}\n`));
          controller.close();
          watcher.closed = true;
          return;
        }
        if (fromRv === undefined || sendInitialEvents) {
          for (const k of store.sortedKeys()) {
            const s = store.objects.get(k)!;
            if (match(s.obj)) this.send(watcher, `{"type":"ADDED","object":${s.json}}\n`);
          }
          if (sendInitialEvents) {
            const info = store.info;
            this.send(
              watcher,
              `{"type":"BOOKMARK","object":{"kind":"${info.kind}","apiVersion":"${info.apiVersion}","metadata":{"resourceVersion":"${this.rv}","annotations":{"k8s.io/initial-events-end":"true"}}}}\n`,
            );
          }
        } else {
          for (const e of store.history) if (e.rv > fromRv) this.deliver(watcher, e);
        }
        this.watchers.add(watcher);
        watcher.timer = setTimeout(() => {
          if (watcher.closed) return;
          this.dropWatcher(watcher);
          try {
            controller.close();
          } catch { /* closed */ }
        }, timeoutMs);
      },
      cancel: () => {
        if (watcher) this.dropWatcher(watcher);
      },
    });
    return new Response(body, {
      headers: { "content-type": "application/json", "transfer-encoding": "chunked" },
    });
  }

  private async write(req: Request, p: ParsedPath): Promise<Response> {
    const store = this.store(p.resource);
    const json = (code: number, obj: unknown) =>
      new Response(JSON.stringify(obj), { status: code, headers: { "content-type": "application/json" } });
    const readBody = async (): Promise<KubeObject> => {
      try {
        return await req.json();
      } catch {
        throw new HttpError(400, "the request body is not valid JSON");
      }
    };
    const key = (name: string) => store.info.namespaced ? `${p.namespace}/${name}` : name;
    switch (req.method) {
      case "POST": {
        if (p.name) return statusResponse(405);
        this.stats.bump("create", p.resource);
        const obj = await readBody();
        obj.metadata ??= {};
        if (p.namespace) obj.metadata.namespace = p.namespace;
        if (!obj.metadata.name && (obj.metadata as { generateName?: string }).generateName) {
          obj.metadata.name = (obj.metadata as { generateName?: string }).generateName +
            Math.random().toString(36).slice(2, 7);
        }
        if (!obj.metadata.name) throw new HttpError(422, "metadata.name: Required value");
        if (store.objects.has(keyOf(obj))) {
          throw new HttpError(409, `${p.resource} "${obj.metadata.name}" already exists`);
        }
        delete obj.metadata.resourceVersion;
        return json(201, this.upsert(p.resource, obj));
      }
      case "PUT": {
        if (!p.name) return statusResponse(405);
        this.stats.bump("update", p.resource);
        const obj = await readBody();
        obj.metadata ??= {};
        obj.metadata.name = p.name;
        if (p.namespace) obj.metadata.namespace = p.namespace;
        const prev = store.objects.get(key(p.name));
        if (!prev) throw new HttpError(404, `${p.resource} "${p.name}" not found`);
        const want = obj.metadata.resourceVersion;
        if (want && want !== prev.obj.metadata?.resourceVersion) {
          throw new HttpError(
            409,
            `Operation cannot be fulfilled on ${p.resource} "${p.name}": the object has been modified; please apply your changes to the latest version and try again`,
          );
        }
        delete obj.metadata.resourceVersion;
        return json(200, this.upsert(p.resource, obj));
      }
      case "PATCH": {
        if (!p.name) return statusResponse(405);
        this.stats.bump("patch", p.resource);
        const prev = store.objects.get(key(p.name));
        if (!prev) throw new HttpError(404, `${p.resource} "${p.name}" not found`);
        const patch = await readBody();
        const merged = mergePatch(JSON.parse(prev.json), patch) as KubeObject;
        if (merged.metadata) delete merged.metadata.resourceVersion;
        return json(200, this.upsert(p.resource, merged));
      }
      case "DELETE": {
        if (!p.name) return statusResponse(405);
        this.stats.bump("delete", p.resource);
        const prev = store.objects.get(key(p.name));
        if (!prev) throw new HttpError(404, `${p.resource} "${p.name}" not found`);
        this.delete(p.resource, p.namespace, p.name);
        return json(200, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Success" });
      }
      default:
        return statusResponse(405);
    }
  }
}

/** RFC 7386 JSON merge patch. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (patch === null || typeof patch !== "object" || Array.isArray(patch)) return patch;
  const out: Record<string, unknown> = target !== null && typeof target === "object" && !Array.isArray(target)
    ? { ...(target as Record<string, unknown>) }
    : {};
  for (const [k, v] of Object.entries(patch as Record<string, unknown>)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}
