/**
 * The z-pages upstream kube-proxy v1.37 serves on its metrics listener (`serveMetrics` in
 * cmd/kube-proxy/app/server.go): `/configz` (component-base configz: the configuration as the public v1alpha1
 * type, under its group name), `/flagz` (behind the ComponentFlagz gate, BETA and on) and `/statusz` (behind
 * ComponentStatusz, BETA and on), with apiserver's content negotiation: no `Accept` (or `text/plain`, `*\/*`)
 * gives the text page, `application/json` or `application/yaml` with `;as=Statusz;g=config.k8s.io;v=v1beta1`
 * (or `Flagz`, or the deprecated `v1alpha1`, which adds a `Warning` header) gives the object, anything else
 * 406 with a `Status` naming the accepted media types.
 *
 * The text pages are upstream's, delimiters included (one of `:`, `: `, `=`, ` ` at random, so that nobody
 * parses them: per request for statusz, once per process for flagz, as upstream caches it). The facts are the
 * agent's own: `Go version` says which Deno runs it, `Binary version` is this agent's version string.
 * @module
 */

import { stringify } from "yaml";

/** What `/statusz` reports. */
export interface StatuszFacts {
  /** When the process started. */
  startTime: Date;
  /** Upstream's `goVersion`: here the runtime, e.g. `deno 2.9.6`. */
  runtimeVersion: string;
  /** `binaryVersion`, e.g. `1.37.2-deno-kube-proxy-0.1.0`. */
  binaryVersion: string;
  /** `emulationVersion`, e.g. `1.37`. */
  emulationVersion: string;
  /** The listener's paths (their first segments are listed, sorted). */
  paths: readonly string[];
}

/** What the z-pages serve; the pages whose field is absent are not served (404). */
export interface ZPagesOptions {
  /** `/configz`: the versioned KubeProxyConfiguration object (apiVersion and kind included). */
  configz?: Record<string, unknown>;
  /** `/flagz`: every flag's value as pflag prints it (ComponentFlagz on). */
  flagz?: Record<string, string>;
  /** `/statusz` (ComponentStatusz on). */
  statusz?: StatuszFacts;
  /** For tests: the delimiter index (0-3) instead of a random one. */
  delimiter?: number;
  /** For tests: the current time. */
  now?: () => Date;
}

const COMPONENT = "kube-proxy";
const GROUP = "config.k8s.io";
const DELIMITERS = [":", ": ", "=", " "];
const WARNING =
  "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.";
/** First path segments apiserver's statusz leaves out. */
const NON_DEBUGGING = new Set(["/apis", "/api", "/openid", "/openapi", "/.well-known"]);
const SUPPORTED_MEDIA_TYPES = ["application/json", "application/yaml", "text/plain"];

type Negotiated =
  | { kind: "text" }
  | {
    kind: "structured";
    mediaType: "application/json" | "application/yaml";
    version: string;
    pretty: boolean;
  }
  | { kind: "none" };

interface AcceptClause {
  type: string;
  subType: string;
  params: Map<string, string>;
  q: number;
  index: number;
}

/** goautoneg.ParseAccept: clauses sorted by q, then specificity (fewer wildcards first), then order. */
function parseAccept(header: string): AcceptClause[] {
  const out: AcceptClause[] = [];
  for (const [index, raw] of header.split(",").entries()) {
    const parts = raw.split(";").map((p) => p.trim());
    const [type, subType] = parts[0].split("/").map((s) => s.trim());
    if (!type || subType === undefined) continue;
    const params = new Map<string, string>();
    let q = 1;
    for (const p of parts.slice(1)) {
      const eq = p.indexOf("=");
      if (eq < 0) continue;
      const k = p.slice(0, eq).trim();
      const v = p.slice(eq + 1).trim();
      if (k === "q") q = Number(v);
      else params.set(k, v);
    }
    out.push({ type, subType, params, q: Number.isNaN(q) ? 0 : q, index });
  }
  const wild = (c: AcceptClause) => (c.type === "*" ? 2 : 0) + (c.subType === "*" ? 1 : 0);
  return out.sort((a, b) => b.q - a.q || wild(a) - wild(b) || a.index - b.index);
}

/** apiserver's NegotiateOutputMediaType with the z-pages' endpoint restrictions (`kind`: Statusz or Flagz). */
function negotiate(req: Request, kind: string): Negotiated {
  const accept = req.headers.get("accept") ?? "";
  if (accept.trim() === "") return { kind: "text" };
  const query = new URL(req.url).searchParams.get("pretty");
  const ua = req.headers.get("user-agent") ?? "";
  const prettyByClient = query !== null && query !== ""
    ? ["1", "t", "T", "true", "TRUE", "True"].includes(query)
    : ua.startsWith("curl") || ua.startsWith("Wget") || ua.startsWith("Mozilla/5.0");
  for (const c of parseAccept(accept)) {
    for (const supported of SUPPORTED_MEDIA_TYPES) {
      const [t, s] = supported.split("/");
      const matches = (c.type === t && (c.subType === s || c.subType === "*")) ||
        (c.type === "*" && c.subType === "*");
      if (!matches) continue;
      const converts = c.params.has("as") || c.params.has("g") || c.params.has("v");
      if (supported === "text/plain") {
        if (!converts) return { kind: "text" };
        continue;
      }
      if (!converts) continue;
      const v = c.params.get("v") ?? "";
      if (
        c.params.get("as") !== kind || c.params.get("g") !== GROUP || (v !== "v1alpha1" && v !== "v1beta1")
      ) {
        continue;
      }
      return {
        kind: "structured",
        mediaType: supported as "application/json" | "application/yaml",
        version: v,
        pretty: c.params.get("pretty") === "1" || prettyByClient,
      };
    }
  }
  return { kind: "none" };
}

/**
 * The 406 answer, a `Status`, as apiserver's ErrorNegotiated writes it: negotiated again without a conversion
 * (plain `application/json` or `application/yaml` get it in that type), else indented JSON (WriteRawJSON).
 */
function notAcceptable(req: Request): Response {
  const status = {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message: `only the following media types are accepted: ${SUPPORTED_MEDIA_TYPES.join(", ")}`,
    reason: "NotAcceptable",
    code: 406,
  };
  for (const c of parseAccept(req.headers.get("accept") ?? "")) {
    if (c.params.has("as") || c.params.has("g") || c.params.has("v")) continue;
    for (const t of ["application/json", "application/yaml"]) {
      const [type, sub] = t.split("/");
      if (
        (c.type === type && (c.subType === sub || c.subType === "*")) || (c.type === "*" && c.subType === "*")
      ) {
        const body = t === "application/json" ? JSON.stringify(status) + "\n" : [
          "apiVersion: v1",
          "code: 406",
          "kind: Status",
          goSingleQuoted("message: ", status.message),
          "metadata: {}",
          "reason: NotAcceptable",
          "status: Failure",
          "",
        ].join("\n");
        return new Response(body, { status: 406, headers: { "Content-Type": t } });
      }
    }
  }
  return new Response(JSON.stringify(status, null, 2), {
    status: 406,
    headers: { "Content-Type": "application/json" },
  });
}

function structured(n: Extract<Negotiated, { kind: "structured" }>, page: string, obj: object): Response {
  // SerializeObject names the conversion in the Content-Type (generateMediaTypeWithGVK).
  const kind = (obj as { kind: string }).kind;
  const headers = new Headers({ "Content-Type": `${n.mediaType};g=${GROUP};v=${n.version};as=${kind}` });
  if (n.version === "v1alpha1") {
    headers.set(
      "Warning",
      `299 - "This version of the ${page} endpoint is deprecated. Please use a newer version."`,
    );
  }
  const body = n.mediaType === "application/yaml"
    ? stringify(obj, { indentSeq: false, lineWidth: 0, version: "1.1", sortMapEntries: true })
    : n.pretty
    ? JSON.stringify(obj, null, 2) // json.MarshalIndent: no newline at the end
    : JSON.stringify(obj) + "\n";
  return new Response(body, { headers });
}

const text = (body: string) =>
  new Response(body, { headers: { "Content-Type": "text/plain; charset=utf-8" } });

/** Go's time.UnixDate in UTC: `Fri Dec  4 17:20:00 UTC 2026`. */
export function unixDate(d: Date): string {
  const days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
  const months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  const p2 = (n: number) => String(n).padStart(2, "0");
  return `${days[d.getUTCDay()]} ${months[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2, " ")} ` +
    `${p2(d.getUTCHours())}:${p2(d.getUTCMinutes())}:${p2(d.getUTCSeconds())} UTC ${d.getUTCFullYear()}`;
}

/** apiserver's aggregatePaths: the distinct first segments, debugging ones only, sorted. */
export function aggregatePaths(paths: readonly string[]): string[] {
  const out = new Set<string>();
  for (const p of paths) {
    const seg = p.split("/")[1];
    if (!seg) continue;
    if (!NON_DEBUGGING.has(`/${seg}`)) out.add(`/${seg}`);
  }
  return [...out].sort();
}

/** Serves `/configz`, `/flagz` and `/statusz` as upstream kube-proxy v1.37 does on its metrics listener. */
export class ZPages {
  readonly #opts: ZPagesOptions;
  readonly #flagzDelimiter: string;

  constructor(opts: ZPagesOptions) {
    this.#opts = opts;
    this.#flagzDelimiter = DELIMITERS[opts.delimiter ?? Math.floor(Math.random() * DELIMITERS.length)];
  }

  /** The response for `req`, or undefined when its path is not a z-page served here. */
  handle(req: Request): Response | undefined {
    const path = new URL(req.url).pathname;
    const o = this.#opts;
    if (path === "/configz" && o.configz) return this.#configz(o.configz);
    if (path === "/flagz" && o.flagz) return this.#flagz(req, o.flagz);
    if (path === "/statusz" && o.statusz) return this.#statusz(req, o.statusz);
    return undefined;
  }

  #configz(config: Record<string, unknown>): Response {
    return new Response(JSON.stringify({ "kubeproxy.config.k8s.io": config }), {
      headers: { "Content-Type": "application/json", "X-Content-Type-Options": "nosniff" },
    });
  }

  #flagz(req: Request, flags: Record<string, string>): Response {
    const n = negotiate(req, "Flagz");
    if (n.kind === "none") return notAcceptable(req);
    if (n.kind === "structured") {
      return structured(n, "flagz", {
        kind: "Flagz",
        apiVersion: `${GROUP}/${n.version}`,
        metadata: { name: COMPONENT },
        flags: { ...flags },
      });
    }
    let body = `\n${COMPONENT} flagz\n${WARNING}\n`;
    for (const k of Object.keys(flags).sort()) body += `${k}${this.#flagzDelimiter}${flags[k]}\n`;
    return text(body);
  }

  #statusz(req: Request, f: StatuszFacts): Response {
    const n = negotiate(req, "Statusz");
    if (n.kind === "none") return notAcceptable(req);
    const now = this.#opts.now?.() ?? new Date();
    const up = Math.max(0, Math.floor((now.getTime() - f.startTime.getTime()) / 1000));
    const paths = aggregatePaths(f.paths);
    if (n.kind === "structured") {
      const start = new Date(Math.floor(f.startTime.getTime() / 1000) * 1000).toISOString().replace(
        ".000Z",
        "Z",
      );
      return structured(n, "statusz", {
        kind: "Statusz",
        apiVersion: `${GROUP}/${n.version}`,
        metadata: { name: COMPONENT },
        startTime: start,
        uptimeSeconds: up,
        goVersion: f.runtimeVersion,
        binaryVersion: f.binaryVersion,
        ...(f.emulationVersion !== "" ? { emulationVersion: f.emulationVersion } : {}),
        paths,
      });
    }
    const d = DELIMITERS[this.#opts.delimiter ?? Math.floor(Math.random() * DELIMITERS.length)];
    const p2 = (x: number) => String(x).padStart(2, "0");
    const uptime = `${Math.floor(up / 3600)} hr ${p2(Math.floor(up / 60) % 60)} min ${p2(up % 60)} sec`;
    const esc = htmlEscape;
    return text(
      `\n${COMPONENT} statusz\n${WARNING}\n` +
        `\nStarted${d} ${esc(unixDate(f.startTime))}\nUp${d} ${esc(uptime)}\nGo version${d} ${
          esc(f.runtimeVersion)
        }\n` +
        `Binary version${d} ${esc(f.binaryVersion)}\n` +
        `${f.emulationVersion !== "" ? `Emulation version${d} ${esc(f.emulationVersion)}` : ""}\n` +
        `${paths.length > 0 ? `Paths${d} ${esc(paths.join(" "))}` : ""}\n`,
    );
  }
}

/**
 * `prefix` and a single-quoted YAML scalar as go-yaml emits one: folded at a space once the line is past 80
 * columns (go-yaml overshoots its width rather than breaking before it), continuation lines indented by two.
 */
function goSingleQuoted(prefix: string, value: string): string {
  let out = prefix + "'";
  let column = out.length;
  const v = value.replaceAll("'", "''");
  for (let i = 0; i < v.length; i++) {
    if (v[i] === " " && column > 80 && v[i + 1] !== " " && i > 0 && v[i - 1] !== " ") {
      out += "\n  ";
      column = 2;
      continue;
    }
    out += v[i];
    column++;
  }
  return out + "'";
}

/** Go's html.EscapeString. */
function htmlEscape(s: string): string {
  return s.replaceAll("&", "&amp;").replaceAll("'", "&#39;").replaceAll("<", "&lt;").replaceAll(">", "&gt;")
    .replaceAll('"', "&#34;");
}
