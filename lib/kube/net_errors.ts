/**
 * Turns transport failures of API requests into messages a person can act on.
 *
 * Deno's fetch rejects with `TypeError: fetch failed` and hides the reason in `cause`
 * (`error sending request for url (...): client error (Connect): tcp connect error: Connection refused
 * (os error 111)`); node:https (the insecure-skip-tls-verify path) rejects with `code: "ECONNREFUSED"` and
 * friends; a request timeout is a `TimeoutError` DOMException. {@link connectionError} reads all of them
 * and names the cause, the endpoint and what to check: "connection refused 127.0.0.1:6443", a DNS failure
 * with the name, a TLS verification failure with the reason and the names involved, a timeout.
 * @module
 */

/** What went wrong on the way to the API server. */
export type ConnectionFailure = "refused" | "dns" | "tls" | "timeout" | "unreachable" | "reset" | "other";

/** A request that never got an HTTP answer, with a message naming the cause. */
export class ApiConnectionError extends Error {
  constructor(
    /** The kind of failure (client-go retries a watch on "refused" without relisting). */
    readonly kind: ConnectionFailure,
    /** `host:port` of the API server. */
    readonly endpoint: string,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "ApiConnectionError";
  }
}

/** The messages of an error and its causes, outermost first (duplicates dropped). */
export function errorChain(err: unknown): string[] {
  const out: string[] = [];
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e !== undefined && e !== null && !seen.has(e) && out.length < 8) {
    seen.add(e);
    const m = e instanceof Error || (typeof e === "object" && "message" in e)
      ? String((e as { message: unknown }).message)
      : String(e);
    if (m && !out.some((o) => o.includes(m))) out.push(m);
    e = (e as { cause?: unknown }).cause;
  }
  return out;
}

function codeOf(err: unknown): string | undefined {
  let e: unknown = err;
  for (let i = 0; i < 8 && e && typeof e === "object"; i++) {
    const c = (e as { code?: unknown }).code;
    if (typeof c === "string") return c;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** `host:port` of a URL, with the scheme's default port when none is given. */
export function endpointOf(url: string): string {
  try {
    const u = new URL(url);
    const port = u.port || (u.protocol === "https:" ? "443" : "80");
    return `${u.hostname}:${port}`;
  } catch {
    return url;
  }
}

/** The innermost, most specific reason in a Deno fetch error ("client error (Connect): <reason>"). */
function innerReason(chain: string[]): string {
  const last = chain.at(-1) ?? "";
  const m = /client error \([A-Za-z]+\): (.*)$/s.exec(last);
  return (m ? m[1] : last.replace(/^error sending request for url \([^)]*\): /, "")).trim();
}

const TLS_HINTS: [RegExp, string][] = [
  [
    /UnknownIssuer/,
    "the server's certificate is signed by an authority we do not trust; set certificate-authority(-data) in the kubeconfig to the cluster's CA",
  ],
  [/Expired/, "the server's certificate has expired (or the clock is wrong)"],
  [/NotValidYet/, "the server's certificate is not valid yet (check the clock)"],
  [/not valid for name/, "the server's certificate does not name the address we connect to"],
  [/CertificateRequired/, "the API server requires a client certificate and we sent none"],
  [/BadCertificate|UnknownCA|DecryptError/, "the API server rejected our client certificate"],
];

/**
 * Wraps a transport failure of `method url` in an {@link ApiConnectionError} whose message names the
 * cause. `timeoutMs` is the request timeout, used for the message when the request timed out.
 */
export function connectionError(
  err: unknown,
  method: string,
  url: string,
  timeoutMs?: number,
): ApiConnectionError {
  const endpoint = endpointOf(url);
  let host = endpoint;
  try {
    host = new URL(url).hostname;
  } catch { /* keep endpoint */ }
  let path = url;
  try {
    const u = new URL(url);
    path = u.pathname;
  } catch { /* keep url */ }
  const chain = errorChain(err);
  const reason = innerReason(chain);
  const code = codeOf(err);
  const what = `${method} ${path}`;
  const make = (kind: ConnectionFailure, msg: string) =>
    new ApiConnectionError(kind, endpoint, `${what}: ${msg}`, { cause: err });

  if (
    (err instanceof DOMException && err.name === "TimeoutError") || code === "ETIMEDOUT" ||
    /timed out|TimeoutError/i.test(reason)
  ) {
    const after = timeoutMs !== undefined ? ` within ${Math.round(timeoutMs / 100) / 10} s` : "";
    return make("timeout", `no answer from the API server ${endpoint}${after} (timeout)`);
  }
  if (code === "ECONNREFUSED" || /connection refused/i.test(reason)) {
    return make(
      "refused",
      `connection refused ${endpoint}: nothing accepts connections there; is the API server running, and is the kubeconfig's server address right?`,
    );
  }
  if (
    code === "ENOTFOUND" || code === "EAI_AGAIN" ||
    /dns error|failed to lookup address|getaddrinfo/i.test(reason)
  ) {
    const detail = reason.replace(/^dns error: /, "").replace(/^failed to lookup address information: /, "");
    return make("dns", `DNS lookup of "${host}" failed (${detail}); check the server name in the kubeconfig`);
  }
  if (
    /invalid peer certificate|certificate|received fatal alert|tls|handshake/i.test(reason) ||
    (code !== undefined && /^(ERR_TLS|CERT_|DEPTH_ZERO|SELF_SIGNED|UNABLE_TO)/.test(code))
  ) {
    const hint = TLS_HINTS.find(([re]) => re.test(reason))?.[1];
    return make(
      "tls",
      `TLS verification with the API server ${endpoint} failed: ${reason}${hint ? ` (${hint})` : ""}`,
    );
  }
  if (
    code === "EHOSTUNREACH" || code === "ENETUNREACH" || /unreachable|no route to host/i.test(reason)
  ) {
    return make("unreachable", `cannot reach the API server ${endpoint}: ${reason}`);
  }
  if (
    code === "ECONNRESET" || code === "EPIPE" || /reset by peer|connection closed|broken pipe/i.test(reason)
  ) {
    return make("reset", `the connection to the API server ${endpoint} was closed: ${reason}`);
  }
  return make("other", `request to the API server ${endpoint} failed: ${reason || chain.join(": ")}`);
}
