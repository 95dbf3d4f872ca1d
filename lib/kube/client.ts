/**
 * A small Kubernetes REST client on Deno's native fetch: JSON requests, paginated lists, and watches decoded
 * as the body arrives (never buffering the whole stream): JSON line by line, or protobuf frame by frame where
 * the caller's `Accept` asked for it and the server answered in it (./protobuf.ts).
 *
 * TLS goes through `Deno.createHttpClient` (CA, client certificate and key). `insecure-skip-tls-verify` has
 * no equivalent there, so that case alone uses node:https with verification off (a warning is logged;
 * ./node_fetch.ts). A watch that asks for compression (the reflector's watch-list streams, which
 * kube-apiserver v1.37 gzips one member per flush) goes through node:http(s) too, whose bodies arrive
 * undecoded, and is inflated member by member; Deno's fetch would end it at the first member. An exec
 * credential plugin's token or client certificate is fetched before each request (cached by the plugin runner
 * until it expires); a new client certificate replaces the connection pool, and a 401 re-runs the plugin once,
 * as client-go. Transport failures are rethrown as
 * {@link ApiConnectionError}s that name the cause (./net_errors.ts).
 * Non-watch requests pass a qps/burst token bucket (`clientConnection.qps`/`burst`, default 5/10).
 * Requests are measured as client-go measures them (./client_metrics.ts): every response's code, and for
 * non-watch requests the rate limiter's wait, the latency, and the request and response sizes.
 * @module
 */

import { log } from "../log.ts";
import type { KubeList, KubeObject, Status, WatchEvent } from "./types.ts";
import { decodeWatchEventMessage, FrameSplitter, PROTOBUF_MEDIA_TYPE } from "./protobuf.ts";
import { type LoadOptions, loadRestConfig, redactURL, type RestConfig } from "./kubeconfig.ts";
import { TokenBucket } from "./rate_limiter.ts";
import type { ExecCredentials } from "./exec_credential.ts";
import { connectionError } from "./net_errors.ts";
import { type Fetcher, gunzipStream, GzipDecodeError, nodeFetcher } from "./node_fetch.ts";
import { ListDecodeError, ListDecoder } from "./list_decoder.ts";
import {
  hostLabel,
  restClientRateLimiterDuration,
  restClientRequestDuration,
  restClientRequestSize,
  restClientRequestsTotal,
  restClientResponseSize,
} from "./client_metrics.ts";

/** Version reported in the User-Agent. */
export const CLIENT_VERSION = "v0.1.0";

/** Options of {@link KubeClient}. */
export interface KubeClientOptions {
  /** Requests per second for non-watch requests (default 5, as clientConnection.qps). */
  qps?: number;
  /** Burst for non-watch requests (default 10). */
  burst?: number;
  /** User-Agent header (default `kube-proxy/<version> (linux/amd64) deno-kube-proxy`). */
  userAgent?: string;
  /** How often at most the token file is checked for rotation, in ms (default 10 000; always after a 401). */
  tokenRecheckMs?: number;
  /** Timeout of non-watch requests in ms (default 60 000). */
  requestTimeoutMs?: number;
  /**
   * Content types accepted (clientConnection.acceptContentTypes); requests decode JSON, watches also protobuf for
   * the kinds ./protobuf.ts knows (asked per watch through WatchOptions.headers).
   */
  accept?: string;
}

/** An HTTP error answer from the API server, with its Status body when there was one. */
export class KubeApiError extends Error {
  constructor(
    /** HTTP status code (or the Status code of an in-stream ERROR event). */
    readonly code: number,
    /** Status reason, e.g. "Expired", "Unauthorized". */
    readonly reason: string,
    message: string,
    /** The Status body, when the server sent one. */
    readonly status?: Status,
  ) {
    super(message);
    this.name = "KubeApiError";
  }
}

/** A watch line that is not a valid watch event. */
export class WatchDecodeError extends Error {
  constructor(readonly line: string, cause?: unknown) {
    super(`malformed watch event: ${line.length > 200 ? line.slice(0, 200) + "..." : line}`, { cause });
    this.name = "WatchDecodeError";
  }
}

/** No byte arrived on a watch stream for longer than the inactivity timeout. */
export class WatchInactivityError extends Error {
  constructor(ms: number) {
    super(`watch stream inactive for ${ms} ms, assuming a half-open connection`);
    this.name = "WatchInactivityError";
  }
}

/** Query parameters; undefined values are skipped. */
export type Query = Record<string, string | number | boolean | undefined>;

/** Options of {@link KubeClient.request}. */
export interface RequestOptions {
  query?: Query;
  body?: unknown;
  contentType?: string;
  signal?: AbortSignal;
}

/** Options of {@link KubeClient.watch}. */
export interface WatchOptions {
  /** Abort when no byte arrives for this long (ms); 0/undefined: never. */
  inactivityMs?: number;
  /**
   * Called once the server has accepted the watch (status < 400), before the first event, with the body's
   * Content-Encoding (`identity` when none).
   */
  onOpen?: (opened: { encoding: string }) => void;
  /**
   * Ask for a gzip-compressed stream and inflate it as it arrives (kube-apiserver v1.37 compresses watch-list
   * streams, one gzip member per flush; a plain watch is never compressed). The request goes through
   * node:http(s) (./node_fetch.ts), which needs the server's CA in the configuration and no proxy; without
   * them the stream is asked uncompressed (`Accept-Encoding: identity`), since Deno's fetch would end it at the
   * first member.
   */
  compressed?: boolean;
  /**
   * Extra request headers, e.g. an `Accept` that prefers protobuf where `lib/kube/protobuf.ts` decodes the kind
   * (the body is decoded by its Content-Type).
   */
  headers?: Record<string, string>;
}

/** A connection pool for one client identity (certificate and key). */
interface Transport {
  /** Identifies the client certificate and key it was built with. */
  key: string;
  fetch: Fetcher;
  /** A fetch whose bodies are not decoded (node:http(s)), where the configuration allows one. */
  rawFetch?: Fetcher;
  close(): void;
}

function goArch(): string {
  const a = Deno.build.arch as string;
  return a === "x86_64" ? "amd64" : a === "aarch64" ? "arm64" : a;
}

/** The default User-Agent, in kube-proxy's `name/version (os/arch) build` form. */
export function defaultUserAgent(version = CLIENT_VERSION): string {
  return `kube-proxy/${version} (${Deno.build.os}/${goArch()}) deno-kube-proxy`;
}

function buildUrl(base: string, path: string, query?: Query): string {
  let url = base + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== "") q.set(k, String(v));
    const s = q.toString();
    if (s) url += (path.includes("?") ? "&" : "?") + s;
  }
  return url;
}

/** Re-reads a token file when it changes (service-account token rotation). */
class TokenFile {
  private token = "";
  private mtime = -1;
  private checked = -Infinity;

  constructor(readonly path: string, private readonly recheckMs: number) {}

  async get(force = false): Promise<string> {
    const now = performance.now();
    if (!force && now - this.checked < this.recheckMs && this.token) return this.token;
    this.checked = now;
    try {
      const st = await Deno.stat(this.path);
      const m = st.mtime?.getTime() ?? 0;
      if (force || m !== this.mtime || !this.token) {
        const t = (await Deno.readTextFile(this.path)).trim();
        if (t !== this.token && this.token) {
          log.info("Reloaded the bearer token from its file", { path: this.path });
        }
        this.token = t;
        this.mtime = m;
      }
    } catch (e) {
      if (!this.token) throw e;
      log.warn("Could not re-read the token file, keeping the previous token", { path: this.path, err: e });
    }
    return this.token;
  }
}

/** A Kubernetes API client for one server and identity. */
export class KubeClient {
  /** The API server base URL. */
  readonly server: string;
  /** The `host` label of this client's metrics. */
  private readonly host: string;
  private transport?: Transport;
  private readonly limiter: TokenBucket;
  private readonly userAgent: string;
  private readonly tokenFile?: TokenFile;
  private readonly requestTimeoutMs: number;
  private readonly accept: string;
  private closed = false;
  /**
   * Whether a watch can be read compressed ({@link WatchOptions.compressed}): node:http(s) has no proxy
   * support here, and verifies only against a CA given in the configuration.
   */
  readonly readsCompressedWatches: boolean;

  constructor(readonly config: RestConfig, opts: KubeClientOptions = {}) {
    this.server = config.server;
    this.host = hostLabel(config.server);
    this.limiter = new TokenBucket(opts.qps ?? 5, opts.burst ?? 10);
    this.userAgent = opts.userAgent ?? defaultUserAgent();
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 60_000;
    this.accept = "application/json";
    this.readsCompressedWatches = !config.proxyUrl &&
      (config.server.startsWith("http:") || config.insecure === true || config.caPem !== undefined);
    if (opts.accept && !opts.accept.includes("json")) {
      log.warn("Only JSON responses are supported; ignoring acceptContentTypes", {
        acceptContentTypes: opts.accept,
      });
    }
    if (config.tokenFile) this.tokenFile = new TokenFile(config.tokenFile, opts.tokenRecheckMs ?? 10_000);
    if (config.server.startsWith("https:") && config.insecure) {
      log.warn("insecure-skip-tls-verify is set: the API server's certificate is not verified", {
        server: config.server,
      });
    }
    // Build the pool now when the identity is static, so that TLS settings fail early.
    if (!config.exec) this.transportFor(config.certPem, config.keyPem);
  }

  /** The pool for this client certificate; a different certificate (exec rotation) replaces the pool. */
  private transportFor(certPem?: string, keyPem?: string): Transport {
    const key = `${certPem ?? ""}\0${keyPem ?? ""}`;
    if (this.transport?.key === key) return this.transport;
    const old = this.transport;
    const c = this.config;
    if (c.server.startsWith("https:") && c.insecure) {
      const f = nodeFetcher({ insecure: true, certPem, keyPem });
      this.transport = { key, fetch: f, rawFetch: f, close() {} };
    } else {
      const o: Deno.CreateHttpClientOptions & { cert?: string; key?: string } = {};
      if (c.caPem) o.caCerts = [c.caPem];
      if (c.proxyUrl) o.proxy = proxyOption(c.proxyUrl);
      if (certPem && keyPem) {
        o.cert = certPem;
        o.key = keyPem;
      }
      const client = Deno.createHttpClient(o);
      this.transport = {
        key,
        fetch: (url, init) => fetch(url, { ...init, client }),
        rawFetch: this.readsCompressedWatches ? nodeFetcher({ caPem: c.caPem, certPem, keyPem }) : undefined,
        close: () => client.close(),
      };
    }
    // client-go closes every connection when the client certificate rotates.
    old?.close();
    return this.transport;
  }

  private async headers(
    extra: Record<string, string> | undefined,
    forceToken: boolean,
    creds: ExecCredentials | undefined,
  ): Promise<Headers> {
    const h = new Headers({ "User-Agent": this.userAgent, "Accept": this.accept, ...extra });
    const c = this.config;
    if (this.tokenFile) h.set("Authorization", `Bearer ${await this.tokenFile.get(forceToken)}`);
    else if (c.token) h.set("Authorization", `Bearer ${c.token}`);
    else if (c.username !== undefined) {
      h.set("Authorization", `Basic ${btoa(`${c.username}:${c.password ?? ""}`)}`);
    } else if (creds?.token) h.set("Authorization", `Bearer ${creds.token}`);
    const imp = c.impersonate;
    if (imp) {
      // client-go's impersonatingRoundTripper.
      if (imp.user) h.set("Impersonate-User", imp.user);
      if (imp.uid) h.set("Impersonate-Uid", imp.uid);
      for (const g of imp.groups) h.append("Impersonate-Group", g);
      for (const [k, vs] of Object.entries(imp.extra)) {
        for (const v of vs) h.append(`Impersonate-Extra-${encodeURIComponent(k)}`, v);
      }
    }
    return h;
  }

  /**
   * Sends one request and returns the raw Response (errors are not thrown for HTTP status codes). A
   * transport failure becomes an ApiConnectionError, unless `signal` aborted (then the abort reason is
   * rethrown as fetch gave it, for the caller to interpret).
   */
  private async send(
    method: string,
    url: string,
    body: string | undefined,
    contentType: string | undefined,
    signal: AbortSignal | undefined,
    extraHeaders?: Record<string, string>,
    raw = false,
  ): Promise<Response> {
    if (this.closed) throw new Error("KubeClient is closed");
    const exec = this.config.exec;
    let creds = exec ? await exec.get() : undefined;
    const attempt = async (forceToken: boolean): Promise<Response> => {
      const t = this.transportFor(creds?.certPem ?? this.config.certPem, creds?.keyPem ?? this.config.keyPem);
      const headers = await this.headers(
        contentType ? { "Content-Type": contentType, ...extraHeaders } : extraHeaders,
        forceToken,
        creds,
      );
      try {
        const f = raw && t.rawFetch ? t.rawFetch : t.fetch;
        return await f(url, { method, headers, body, signal });
      } catch (e) {
        restClientRequestsTotal.inc({ code: "<error>", method, host: this.host });
        if (signal?.aborted) throw e;
        throw connectionError(e, method, url);
      }
    };
    let res = await attempt(false);
    if (res.status === 401 && (this.tokenFile || creds)) {
      // The token may have rotated since the last check, or the plugin's credential was revoked: fetch a
      // fresh one now and try once more (inside one request, as client-go's exec round tripper: one count).
      await res.body?.cancel();
      if (exec && creds) creds = await exec.refreshAfterUnauthorized(creds);
      res = await attempt(true);
    }
    restClientRequestsTotal.inc({ code: String(res.status), method, host: this.host });
    return res;
  }

  /** Waits for a rate-limiter token, observing the wait as client-go's tryThrottle. */
  private async throttle(verb: string, signal: AbortSignal | undefined): Promise<void> {
    const start = performance.now();
    try {
      await this.limiter.take(signal);
    } finally {
      restClientRateLimiterDuration.observe({ verb, host: this.host }, (performance.now() - start) / 1000);
    }
  }

  /** Sends a non-watch request (rate limited) and decodes the JSON answer; throws KubeApiError on >= 400. */
  async request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    await this.throttle(method, opts.signal);
    const labels = { verb: method, host: this.host };
    const start = performance.now();
    try {
      return await this.measuredRequest<T>(method, path, opts);
    } finally {
      restClientRequestDuration.observe(labels, (performance.now() - start) / 1000);
    }
  }

  private async measuredRequest<T>(method: string, path: string, opts: RequestOptions): Promise<T> {
    const labels = { verb: method, host: this.host };
    const timeout = AbortSignal.timeout(this.requestTimeoutMs);
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    const body = opts.body === undefined ? undefined : JSON.stringify(opts.body);
    const url = buildUrl(this.server, path, opts.query);
    restClientRequestSize.observe(labels, body === undefined ? 0 : utf8Length(body));
    const timedOut = (e: unknown) =>
      !opts.signal?.aborted && timeout.aborted
        ? connectionError(timeout.reason, method, url, this.requestTimeoutMs)
        : e;
    let res: Response;
    try {
      res = await this.send(
        method,
        url,
        body,
        body === undefined ? undefined : (opts.contentType ?? "application/json"),
        signal,
      );
    } catch (e) {
      throw timedOut(e);
    }
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      if (opts.signal?.aborted) throw e;
      throw timeout.aborted ? timedOut(e) : connectionError(e, method, url);
    }
    if (res.status < 400 || text.length > 0) restClientResponseSize.observe(labels, utf8Length(text));
    if (res.status >= 400) throw errorFrom(res.status, text, method, path);
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new KubeApiError(res.status, "BadResponse", `${method} ${path}: response is not JSON`);
    }
  }

  /** One page of a list. */
  list<T extends KubeObject = KubeObject>(
    path: string,
    query?: Query,
    signal?: AbortSignal,
  ): Promise<KubeList<T>> {
    return this.request<KubeList<T>>("GET", path, { query, signal });
  }

  /**
   * One page of a list, decoded as the body arrives: each item goes to `onItem` as soon as it is complete (see
   * list_decoder.ts). Resolves with the list without its items (metadata: resourceVersion, continue).
   */
  async listStream<T extends KubeObject = KubeObject>(
    path: string,
    query: Query | undefined,
    signal: AbortSignal | undefined,
    onItem: (item: T) => void,
  ): Promise<KubeList<T>> {
    await this.throttle("GET", signal);
    const labels = { verb: "GET", host: this.host };
    const start = performance.now();
    try {
      const timeout = AbortSignal.timeout(this.requestTimeoutMs);
      const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
      restClientRequestSize.observe(labels, 0);
      const res = await this.send("GET", buildUrl(this.server, path, query), undefined, undefined, sig);
      if (res.status >= 400) {
        const text = await res.text();
        if (text.length > 0) restClientResponseSize.observe(labels, utf8Length(text));
        throw errorFrom(res.status, text, "GET", path);
      }
      const decoder = new ListDecoder<T>(onItem);
      let bytes = 0;
      if (res.body) {
        try {
          await readBody(res.body, (chunk) => {
            bytes += chunk.byteLength;
            decoder.push(chunk);
          });
        } catch (e) {
          if (e instanceof ListDecodeError) {
            throw new KubeApiError(res.status, "BadResponse", `GET ${path}: ${e.message}`);
          }
          throw e;
        }
      }
      restClientResponseSize.observe(labels, bytes);
      try {
        return decoder.end<KubeList<T>>();
      } catch (e) {
        throw new KubeApiError(res.status, "BadResponse", `GET ${path}: ${(e as Error).message}`);
      }
    } finally {
      restClientRequestDuration.observe(labels, (performance.now() - start) / 1000);
    }
  }

  /** GET of one object. */
  get<T extends KubeObject = KubeObject>(path: string, signal?: AbortSignal): Promise<T> {
    return this.request<T>("GET", path, { signal });
  }

  /** POST to a collection path. */
  create<T extends KubeObject = KubeObject>(path: string, obj: T, signal?: AbortSignal): Promise<T> {
    return this.request<T>("POST", path, { body: obj, signal });
  }

  /** PUT to an object path. */
  update<T extends KubeObject = KubeObject>(path: string, obj: T, signal?: AbortSignal): Promise<T> {
    return this.request<T>("PUT", path, { body: obj, signal });
  }

  /** PATCH (JSON merge patch by default) of an object path. */
  patch<T extends KubeObject = KubeObject>(
    path: string,
    patch: unknown,
    contentType = "application/merge-patch+json",
    signal?: AbortSignal,
  ): Promise<T> {
    return this.request<T>("PATCH", path, { body: patch, contentType, signal });
  }

  /** DELETE of an object path. */
  delete(path: string, signal?: AbortSignal): Promise<Status> {
    return this.request<Status>("DELETE", path, { signal });
  }

  /**
   * Opens a watch (`watch=true` is added to `query`) and yields its events as lines arrive. HTTP errors throw
   * KubeApiError; a line that is not an event throws WatchDecodeError; silence longer than `inactivityMs`
   * throws WatchInactivityError. In-stream ERROR events are yielded as they are. A clean end of the stream
   * ends the iteration. Watches are not rate limited (as client-go).
   */
  async *watch<T extends KubeObject = KubeObject>(
    path: string,
    query: Query = {},
    signal?: AbortSignal,
    opts: WatchOptions = {},
  ): AsyncGenerator<WatchEvent<T>> {
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(signal?.reason);
    if (signal) {
      if (signal.aborted) throw signal.reason;
      signal.addEventListener("abort", onAbort, { once: true });
    }
    const inactivityMs = opts.inactivityMs ?? 0;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let inactive = false;
    const arm = () => {
      if (inactivityMs <= 0) return;
      if (timer !== undefined) clearTimeout(timer);
      timer = setTimeout(() => {
        inactive = true;
        ctl.abort(new WatchInactivityError(inactivityMs));
      }, inactivityMs);
    };
    let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    try {
      arm();
      let res: Response;
      const url = buildUrl(this.server, path, { ...query, watch: "true" });
      const compressed = opts.compressed === true && this.readsCompressedWatches;
      const encodingHeader: Record<string, string> = opts.compressed === undefined
        ? {}
        : { "Accept-Encoding": compressed ? "gzip" : "identity" };
      try {
        res = await this.send(
          "GET",
          url,
          undefined,
          undefined,
          ctl.signal,
          { ...opts.headers, ...encodingHeader },
          compressed,
        );
      } catch (e) {
        if (inactive) throw new WatchInactivityError(inactivityMs);
        throw e;
      }
      if (res.status >= 400) {
        const text = await res.text();
        throw errorFrom(res.status, text, "WATCH", path);
      }
      const encoding = res.headers.get("content-encoding") ?? "identity";
      opts.onOpen?.({ encoding });
      if (!res.body) return;
      // Only the raw path can see an encoding: Deno's fetch decodes (and drops the header) itself.
      reader = (compressed && encoding === "gzip" ? res.body.pipeThrough(gunzipStream()) : res.body)
        .getReader();
      // The server answers in the first type of `Accept` it can serve (see WatchOptions.headers).
      const protobuf = (res.headers.get("content-type") ?? "").startsWith(PROTOBUF_MEDIA_TYPE);
      try {
        yield* protobuf ? decodeProtobufWatchStream<T>(reader, arm) : decodeWatchStream<T>(reader, arm);
      } catch (e) {
        if (inactive) throw new WatchInactivityError(inactivityMs);
        if (signal?.aborted || e instanceof WatchDecodeError) throw e;
        if (e instanceof GzipDecodeError) throw new WatchDecodeError(`(gzip) ${e.message}`, e);
        // The stream broke mid-way (connection reset, server gone): name the cause.
        throw connectionError(e, "WATCH", url);
      }
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (reader) {
        reader.cancel().catch(() => {});
      }
      ctl.abort();
    }
  }

  /** Releases the connection pool; further requests fail. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.transport?.close();
  }
}

const utf8 = new TextEncoder();

/** The UTF-8 length of a string (what went over the wire), without keeping an encoded copy. */
function utf8Length(s: string): number {
  let ascii = true;
  for (let i = 0; i < s.length; i++) {
    if (s.charCodeAt(i) > 0x7f) {
      ascii = false;
      break;
    }
  }
  return ascii ? s.length : utf8.encode(s).byteLength;
}

/** Bytes per read of a response body (one buffer, reused). */
const READ_BYTES = 64 * 1024;

/**
 * Reads a body into one reused buffer (a BYOB reader) and hands each filled part to `onChunk`, which must be done
 * with it when it returns. A body read the default way allocates a fresh buffer per chunk, all of them freed only
 * by a later GC: for a 25 MB list that left the allocator's heap 20 MB larger for good. Streams without BYOB
 * support are read the default way.
 */
async function readBody(
  body: ReadableStream<Uint8Array>,
  onChunk: (chunk: Uint8Array) => void,
): Promise<void> {
  let reader: ReadableStreamBYOBReader;
  try {
    reader = body.getReader({ mode: "byob" });
  } catch {
    for await (const chunk of body) onChunk(chunk);
    return;
  }
  let buf = new Uint8Array(READ_BYTES);
  try {
    for (;;) {
      const { value, done } = await reader.read(buf);
      if (done || !value) break;
      onChunk(value);
      buf = new Uint8Array(value.buffer, 0, value.buffer.byteLength); // the same memory, handed back
    }
  } finally {
    reader.releaseLock();
  }
}

/**
 * Decodes a watch body line by line as chunks arrive (no whole-body buffering); `onChunk` runs before each
 * read (the watch uses it to re-arm its inactivity timer).
 */
export async function* decodeWatchStream<T>(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  onChunk?: () => void,
): AsyncGenerator<WatchEvent<T>> {
  const decoder = new TextDecoder();
  let buf = "";
  while (true) {
    onChunk?.();
    const chunk = await reader.read();
    if (chunk.done) break;
    buf += decoder.decode(chunk.value, { stream: true });
    let start = 0;
    let nl: number;
    while ((nl = buf.indexOf("\n", start)) !== -1) {
      const line = buf.slice(start, nl);
      start = nl + 1;
      if (line.length === 0 || line === "\r") continue;
      yield decodeEvent<T>(line);
    }
    if (start > 0) buf = buf.slice(start);
  }
  buf += decoder.decode();
  if (buf.trim() !== "") yield decodeEvent<T>(buf);
}

/**
 * Decodes a protobuf watch body (`application/vnd.kubernetes.protobuf;stream=watch`: length-prefixed
 * `WatchEvent`s, `lib/kube/protobuf.ts`) frame by frame as chunks arrive; a frame that does not decode throws
 * WatchDecodeError, as a malformed JSON line does.
 */
export async function* decodeProtobufWatchStream<T>(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  onChunk?: () => void,
): AsyncGenerator<WatchEvent<T>> {
  const frames = new FrameSplitter();
  while (true) {
    onChunk?.();
    const chunk = await reader.read();
    if (chunk.done) break;
    frames.push(chunk.value);
    const events: WatchEvent<T>[] = [];
    try {
      for (let f = frames.next(); f; f = frames.next()) events.push(decodeWatchEventMessage<T>(f));
    } catch (e) {
      throw new WatchDecodeError(`(protobuf frame) ${(e as Error).message}`, e);
    }
    yield* events; // decoded before yielding: a frame is a view into the splitter's buffer
  }
  if (frames.pending > 0) {
    throw new WatchDecodeError(`(protobuf) ${frames.pending} bytes of an unfinished frame`);
  }
}

/** Parses one watch line; throws WatchDecodeError if it is not `{type, object}`. */
export function decodeEvent<T>(line: string): WatchEvent<T> {
  let ev: WatchEvent<T>;
  try {
    ev = JSON.parse(line);
  } catch (e) {
    throw new WatchDecodeError(line, e);
  }
  if (
    ev === null || typeof ev !== "object" || typeof ev.type !== "string" || typeof ev.object !== "object" ||
    !ev.object
  ) {
    throw new WatchDecodeError(line);
  }
  return ev;
}

function errorFrom(code: number, text: string, method: string, path: string): KubeApiError {
  let st: Status | undefined;
  try {
    const j = JSON.parse(text);
    if (j && j.kind === "Status") st = j;
  } catch { /* not JSON */ }
  const reason = st?.reason ?? (code === 401 ? "Unauthorized" : code === 403 ? "Forbidden" : "Unknown");
  let message = st?.message ?? (text.slice(0, 200) || `HTTP ${code}`);
  if (code === 401) {
    message =
      `${method} ${path}: Unauthorized (401): the API server rejected our credentials; check the token or client certificate (${message})`;
  } else if (code === 403) {
    message = `${method} ${path}: Forbidden (403): the credentials lack RBAC permission (${message})`;
  } else {
    message = `${method} ${path}: ${code} ${reason}: ${message}`;
  }
  return new KubeApiError(code, reason, message, st);
}

/** Deno's proxy option for a kubeconfig `proxy-url` (http, https or socks5, credentials in the URL). */
function proxyOption(raw: string): Deno.Proxy {
  const u = new URL(raw);
  const transport = u.protocol.slice(0, -1) as "http" | "https" | "socks5";
  const basicAuth = u.username
    ? { username: decodeURIComponent(u.username), password: decodeURIComponent(u.password) }
    : undefined;
  u.username = "";
  u.password = "";
  return { transport, url: u.href.replace(/\/$/, ""), ...(basicAuth ? { basicAuth } : {}) };
}

/** Loads the configuration ({@link loadRestConfig}) and returns a client; throws KubeConfigError. */
export async function createKubeClient(load: LoadOptions, opts: KubeClientOptions = {}): Promise<KubeClient> {
  const cfg = await loadRestConfig(load);
  log.info("Using API server", { server: redactURL(cfg.server), source: cfg.source });
  return new KubeClient(cfg, opts);
}
