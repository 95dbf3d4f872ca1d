/**
 * A fetch over node:http / node:https, for the two things Deno's fetch cannot do for this client: skip
 * certificate verification (`insecure-skip-tls-verify`), and hand a body over exactly as it was sent.
 * Deno's fetch decodes every `Content-Encoding: gzip` body itself, even when the caller set `Accept-Encoding`,
 * and it ends a body at the end of the first gzip member when the next one has not arrived yet: that loses
 * all but the first flush of a kube-apiserver v1.37 watch-list stream, which is gzipped one member per flush
 * (WatchListCompression). The responses here are never decoded; {@link gunzipStream} inflates every member.
 * @module
 */

import zlib from "node:zlib";

/** A fetch function: URL and init in, a Response out (its body as the server sent it). */
export type Fetcher = (url: string, init: RequestInit & { signal?: AbortSignal }) => Promise<Response>;

/** How {@link nodeFetcher} verifies the server and presents the client. */
export interface NodeTlsOptions {
  /** Accept any server certificate (insecure-skip-tls-verify). */
  insecure?: boolean;
  /** The CA bundle to verify the server against (PEM); required unless `insecure`. */
  caPem?: string;
  /** Client certificate and key (PEM). */
  certPem?: string;
  keyPem?: string;
}

/**
 * A fetch over node:http(s) whose response bodies are the bytes on the wire (no Content-Encoding decoding).
 * An `https:` URL is verified against `caPem` only (an explicit CA list: without one, Deno's node:https loads
 * the system roots, which needs a `sys` permission that cannot be granted by name), or not at all when
 * `insecure`.
 */
export function nodeFetcher(tls: NodeTlsOptions): Fetcher {
  return async (url, init) => {
    const https = url.startsWith("https:");
    const mod = https ? await import("node:https") : await import("node:http");
    const headers: Record<string, string> = {};
    new Headers(init.headers).forEach((v, k) => headers[k] = v);
    return await new Promise<Response>((resolve, reject) => {
      const req = mod.request(url, {
        method: init.method ?? "GET",
        headers,
        ...(https
          ? {
            rejectUnauthorized: !tls.insecure,
            ca: tls.insecure || !tls.caPem ? [] : [tls.caPem],
            cert: tls.certPem,
            key: tls.keyPem,
          }
          : {}),
        signal: init.signal ?? undefined,
      }, (res) => {
        const body = new ReadableStream<Uint8Array>({
          start(c) {
            res.on("data", (d: Uint8Array) => c.enqueue(new Uint8Array(d)));
            res.on("end", () => {
              try {
                c.close();
              } catch { /* cancelled */ }
            });
            res.on("error", (e: Error) => {
              try {
                c.error(e);
              } catch { /* cancelled */ }
            });
          },
          cancel() {
            res.destroy();
          },
        });
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (typeof v === "string") h.set(k, v);
        resolve(new Response(body, { status: res.statusCode ?? 500, headers: h }));
      });
      req.on("error", reject);
      if (typeof init.body === "string") req.write(init.body);
      req.end();
    });
  };
}

/** A gzip body that does not inflate (a corrupt or truncated member). */
export class GzipDecodeError extends Error {
  constructor(cause: unknown) {
    super(`gzip body does not inflate: ${(cause as Error)?.message ?? cause}`, { cause });
    this.name = "GzipDecodeError";
  }
}

/**
 * Inflates a gzip body of any number of members as its bytes arrive (node:zlib's gunzip reads member after
 * member; the web DecompressionStream stops after the first). Each inflated part is passed on as soon as
 * zlib yields it, so a watch event in one flush is decoded before the next flush arrives.
 */
export function gunzipStream(): TransformStream<Uint8Array, Uint8Array> {
  const z = zlib.createGunzip();
  let failed: GzipDecodeError | undefined;
  return new TransformStream<Uint8Array, Uint8Array>({
    start(c) {
      z.on("data", (d: Uint8Array) => c.enqueue(new Uint8Array(d)));
      z.on("error", (e: Error) => {
        failed = new GzipDecodeError(e);
        try {
          c.error(failed);
        } catch { /* already closed */ }
      });
    },
    transform(chunk) {
      if (failed) throw failed;
      return new Promise<void>((resolve, reject) => {
        z.write(chunk, (e?: Error | null) => e ? reject(failed ?? new GzipDecodeError(e)) : resolve());
      });
    },
    flush() {
      if (failed) throw failed;
      return new Promise<void>((resolve, reject) => {
        z.once("end", () => resolve());
        z.once("error", () => reject(failed));
        z.end();
      });
    },
    cancel() {
      z.destroy();
    },
  });
}
