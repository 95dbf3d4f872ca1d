/**
 * Where the API server is and how to authenticate: `--kubeconfig`, the `KUBECONFIG` variable, or the
 * in-cluster service account, with `--master` overriding the server.
 *
 * Our own small loader (npm:yaml) handles servers, CA files and data, insecure-skip-tls-verify, client
 * certificates and keys (files or data; PKCS#8, SEC1 and PKCS#1 PEM keys), tokens, tokenFile, basic auth,
 * `exec` credential plugins (run by us, ./exec_credential.ts), `proxy-url` and impersonation (`as`,
 * `as-uid`, `as-groups`, `as-user-extra`). `tls-server-name` is refused with a clear message (Deno's fetch
 * cannot verify against a name other than the URL's). An `auth-provider` user fails as in upstream
 * kube-proxy v1.35, which registers no auth-provider plugins: `no Auth Provider found for name "oidc"`.
 * Every problem is reported as one {@link KubeConfigError} with a message an operator can act on.
 * @module
 */

import { parse as parseYaml } from "yaml";
import { log } from "../log.ts";
import {
  checkPluginAllowed,
  ExecAuthenticator,
  type ExecCluster,
  execConfigFrom,
  validateExecConfig,
} from "./exec_credential.ts";

/** A kubeconfig or in-cluster configuration problem; main.ts prints the message and exits 1. */
export class KubeConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "KubeConfigError";
  }
}

/** Everything needed to open connections to the API server. */
export interface RestConfig {
  /** Base URL without a trailing slash, e.g. `https://10.0.0.1:6443`. */
  server: string;
  /** PEM CA bundle to trust (in addition to the system roots). */
  caPem?: string;
  /** Skip server certificate verification. */
  insecure?: boolean;
  /** Client certificate and key (PEM). */
  certPem?: string;
  keyPem?: string;
  /** Static bearer token. */
  token?: string;
  /** File holding the bearer token; re-read when it changes (service-account token rotation). */
  tokenFile?: string;
  /** Basic auth. */
  username?: string;
  password?: string;
  /** An exec credential plugin (token and/or client certificate), when the user has no other credential. */
  exec?: ExecAuthenticator;
  /** `proxy-url` of the cluster: an http, https or socks5 proxy for every request. */
  proxyUrl?: string;
  /** Impersonation (`as`, `as-uid`, `as-groups`, `as-user-extra`), sent as Impersonate-* headers. */
  impersonate?: { user?: string; uid?: string; groups: string[]; extra: Record<string, string[]> };
  /** Where this came from, for logs: a file path or "in-cluster". */
  source: string;
}

/** Inputs of {@link loadRestConfig}. */
export interface LoadOptions {
  /** `--kubeconfig` / `clientConnection.kubeconfig`. */
  kubeconfig?: string;
  /** `--master`: overrides the server. */
  master?: string;
  /** Environment lookup (tests inject it); default Deno.env.get. */
  env?: (name: string) => string | undefined;
  /** Service-account directory (default /var/run/secrets/kubernetes.io/serviceaccount). */
  serviceAccountDir?: string;
  /** Exec credential plugins: the clock expiry is checked against (tests) and the run time limit. */
  exec?: { now?: () => number; timeoutMs?: number };
}

/**
 * A URL fit for logs: `user:password@` (or `user@`) replaced by `redacted@`, as Go's `url.Redacted` hides the
 * password. Text that is not a URL is returned unchanged.
 */
export function redactURL(raw: string): string {
  return String(raw).replace(/^([a-zA-Z][a-zA-Z0-9+.-]*:\/\/)[^/?#@]*@/, "$1redacted@");
}

/** The default service-account mount. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";

function defaultEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/**
 * Resolves the connection configuration as kube-proxy does: the kubeconfig file (`--kubeconfig`, else
 * `$KUBECONFIG`), else `--master` alone, else the in-cluster service account.
 * @throws KubeConfigError
 */
export async function loadRestConfig(opts: LoadOptions = {}): Promise<RestConfig> {
  const env = opts.env ?? defaultEnv;
  const explicit = opts.kubeconfig || env("KUBECONFIG")?.split(":").find((p) => p !== "") || "";
  let cfg: RestConfig;
  if (explicit) {
    cfg = await loadKubeconfigFile(explicit, opts);
  } else if (opts.master) {
    cfg = { server: "", source: "--master" };
  } else {
    log.info("Neither kubeconfig file nor master URL was specified, falling back to in-cluster config");
    cfg = await inClusterConfig(env, opts.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
  }
  if (opts.master) cfg.server = opts.master;
  cfg.server = normalizeServer(cfg.server, cfg.source);
  if (cfg.insecure && cfg.caPem) {
    throw new KubeConfigError(
      `invalid configuration (${cfg.source}): specifying a root certificates file with the insecure flag is not allowed`,
    );
  }
  return cfg;
}

function normalizeServer(server: string, source: string): string {
  if (!server) throw new KubeConfigError(`invalid configuration (${source}): no server found for cluster`);
  let s = server.trim();
  if (!/^[a-z]+:\/\//i.test(s)) s = `https://${s}`;
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    throw new KubeConfigError(
      `invalid configuration (${source}): server ${JSON.stringify(server)} is not a URL`,
    );
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") {
    throw new KubeConfigError(`invalid configuration (${source}): server ${server} must be http or https`);
  }
  return s.replace(/\/+$/, "");
}

/** The in-cluster configuration (service-account token and CA, KUBERNETES_SERVICE_HOST/PORT). */
export async function inClusterConfig(
  env: (name: string) => string | undefined = defaultEnv,
  dir = SERVICE_ACCOUNT_DIR,
): Promise<RestConfig> {
  const host = env("KUBERNETES_SERVICE_HOST");
  const port = env("KUBERNETES_SERVICE_PORT");
  if (!host || !port) {
    throw new KubeConfigError(
      "unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined " +
        "(or pass --kubeconfig / --master)",
    );
  }
  const tokenFile = `${dir}/token`;
  try {
    await Deno.stat(tokenFile);
  } catch (e) {
    throw new KubeConfigError(
      `unable to load in-cluster configuration: cannot read token file ${tokenFile}: ${msg(e)}`,
    );
  }
  let caPem: string | undefined;
  try {
    caPem = await Deno.readTextFile(`${dir}/ca.crt`);
  } catch (e) {
    log.error("Expected to load root CA config, but got err", e, { path: `${dir}/ca.crt` });
  }
  const h = host.includes(":") ? `[${host}]` : host;
  return { server: `https://${h}:${port}`, caPem, tokenFile, source: "in-cluster" };
}

function msg(e: unknown): string {
  if (e instanceof Deno.errors.NotFound) return "no such file or directory";
  if (e instanceof Deno.errors.PermissionDenied || e instanceof Deno.errors.NotCapable) {
    return "permission denied";
  }
  return e instanceof Error ? e.message : String(e);
}

interface Named<T> {
  name?: string;
  cluster?: T;
  user?: T;
  context?: T;
}

// deno-lint-ignore no-explicit-any
type Dict = Record<string, any>;

function findNamed(list: unknown, name: string, field: "cluster" | "user" | "context"): Dict | undefined {
  if (!Array.isArray(list)) return undefined;
  const e = (list as Named<Dict>[]).find((x) => x?.name === name);
  return e ? (e[field] ?? {}) : undefined;
}

/** Loads one kubeconfig file (its current context). */
export async function loadKubeconfigFile(
  path: string,
  opts: Pick<LoadOptions, "exec"> = {},
): Promise<RestConfig> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    throw new KubeConfigError(`invalid configuration: kubeconfig file ${path} could not be read: ${msg(e)}`);
  }
  let doc: Dict;
  try {
    doc = parseYaml(text) ?? {};
  } catch (e) {
    throw new KubeConfigError(`invalid configuration: kubeconfig file ${path} is not valid YAML: ${msg(e)}`);
  }
  if (typeof doc !== "object" || Array.isArray(doc)) {
    throw new KubeConfigError(`invalid configuration: kubeconfig file ${path} is not a Config object`);
  }
  const current = doc["current-context"];
  if (!current) {
    throw new KubeConfigError(`invalid configuration: kubeconfig file ${path} has no current-context`);
  }
  const context = findNamed(doc.contexts, current, "context");
  if (!context) {
    throw new KubeConfigError(
      `invalid configuration: context "${current}" (current-context) was not found in kubeconfig file ${path}`,
    );
  }
  if (!context.cluster) {
    throw new KubeConfigError(`invalid configuration: context "${current}" in ${path} names no cluster`);
  }
  const cluster = findNamed(doc.clusters, context.cluster, "cluster");
  if (!cluster) {
    throw new KubeConfigError(
      `invalid configuration: cluster "${context.cluster}" of context "${current}" was not found in kubeconfig file ${path}`,
    );
  }
  let user: Dict = {};
  if (context.user) {
    const u = findNamed(doc.users, context.user, "user");
    if (!u) {
      throw new KubeConfigError(
        `invalid configuration: user "${context.user}" of context "${current}" was not found in kubeconfig file ${path}`,
      );
    }
    user = u;
  }
  const dir = path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : ".";
  const resolve = (p: string) => p.startsWith("/") ? p : `${dir}/${p}`;
  const what = `kubeconfig ${path}`;

  const cfg: RestConfig = { server: cluster.server ?? "", source: path };
  if (!cfg.server) {
    throw new KubeConfigError(
      `invalid configuration: no server found for cluster "${context.cluster}" in ${path}`,
    );
  }
  cfg.insecure = cluster["insecure-skip-tls-verify"] === true;
  cfg.caPem = await pemFrom(
    cluster["certificate-authority-data"],
    cluster["certificate-authority"],
    resolve,
    "CERTIFICATE",
    `certificate-authority of cluster "${context.cluster}" (${what})`,
  );
  cfg.certPem = await pemFrom(
    user["client-certificate-data"],
    user["client-certificate"],
    resolve,
    "CERTIFICATE",
    `client-certificate of user "${context.user}" (${what})`,
  );
  cfg.keyPem = await pemFrom(
    user["client-key-data"],
    user["client-key"],
    resolve,
    "PRIVATE KEY",
    `client-key of user "${context.user}" (${what})`,
  );
  if (!!cfg.certPem !== !!cfg.keyPem) {
    throw new KubeConfigError(
      `invalid configuration: user "${context.user}" in ${path} has a client certificate without a key or a key without a certificate`,
    );
  }
  if (user.token) cfg.token = String(user.token).trim();
  if (user.tokenFile) {
    cfg.tokenFile = resolve(user.tokenFile);
    try {
      await Deno.stat(cfg.tokenFile);
    } catch (e) {
      throw new KubeConfigError(
        `invalid configuration: tokenFile ${cfg.tokenFile} of user "${context.user}" could not be read: ${
          msg(e)
        }`,
      );
    }
  }
  if (user.username) {
    cfg.username = String(user.username);
    cfg.password = String(user.password ?? "");
  }
  if (cluster["tls-server-name"]) {
    // Deno's fetch cannot set the TLS server name apart from the URL's host; failing beats verifying
    // against the wrong name.
    throw new KubeConfigError(
      `invalid configuration: tls-server-name of cluster "${context.cluster}" (${path}) is not supported; ` +
        "use a server URL whose host name is in the API server's certificate",
    );
  }
  if (cluster["proxy-url"]) {
    const raw = String(cluster["proxy-url"]);
    let u: URL;
    try {
      u = new URL(raw);
    } catch {
      throw new KubeConfigError(
        `invalid configuration: proxy-url ${JSON.stringify(raw)} in ${path} is not a URL`,
      );
    }
    if (!["http:", "https:", "socks5:"].includes(u.protocol)) {
      // client-go's ValidateProxyURL accepts exactly these schemes.
      throw new KubeConfigError(
        `invalid configuration: proxy-url ${raw} in ${path}: unsupported scheme "${
          u.protocol.slice(0, -1)
        }", must be http, https, or socks5`,
      );
    }
    if (cfg.insecure) {
      throw new KubeConfigError(
        `invalid configuration (${path}): proxy-url together with insecure-skip-tls-verify is not supported`,
      );
    }
    cfg.proxyUrl = raw;
  }
  if (user.as || user["as-uid"] || user["as-groups"] || user["as-user-extra"]) {
    const extra: Record<string, string[]> = {};
    for (const [k, v] of Object.entries((user["as-user-extra"] ?? {}) as Record<string, unknown>)) {
      extra[k] = (Array.isArray(v) ? v : [v]).map(String);
    }
    cfg.impersonate = {
      user: user.as ? String(user.as) : undefined,
      uid: user["as-uid"] ? String(user["as-uid"]) : undefined,
      groups: (Array.isArray(user["as-groups"]) ? user["as-groups"] : []).map(String),
      extra,
    };
  }
  const userName = context.user ? `"${context.user}"` : "the user";
  if (user.exec && user["auth-provider"]) {
    throw new KubeConfigError(
      `invalid configuration: authProvider cannot be provided in combination with an exec plugin for ${userName} (${path})`,
    );
  }
  if (user["auth-provider"] && /^http:/i.test(String(cfg.server).trim())) {
    // Upstream reads no credentials at all for a plain-http server, so the provider is never consulted.
    log.warn("Kubeconfig user has an auth-provider, which is ignored for a plain-http server", { path });
  } else if (user["auth-provider"]) {
    // Upstream kube-proxy links no auth-provider plugin (client-go's gcp/azure are gone, oidc is not
    // imported), so client creation fails with exactly this message.
    const name = String(user["auth-provider"]?.name ?? "");
    throw new KubeConfigError(
      `no Auth Provider found for name "${name}" (user ${userName} in ${path}; kube-proxy has no auth-provider ` +
        "plugins: use an exec credential plugin, a token or a client certificate)",
    );
  }
  if (user.exec) {
    const errs = validateExecConfig(user.exec, context.user ?? "");
    if (errs.length > 0) {
      throw new KubeConfigError(`invalid configuration (${path}): ${errs.join("; ")}`);
    }
    if (cfg.token || cfg.tokenFile || cfg.username !== undefined || cfg.certPem) {
      // client-go: a token, basic auth or a client certificate takes precedence; the plugin never runs.
      log.v(2).info("Kubeconfig user has other credentials; its exec plugin is not used", { path });
    } else {
      const exec = execConfigFrom(user.exec, dir);
      const denied = checkPluginAllowed(exec.command);
      if (denied) throw new KubeConfigError(`invalid configuration (${path}): ${denied}`);
      const ext = Array.isArray(cluster.extensions)
        ? (cluster.extensions as { name?: string; extension?: unknown }[])
          .find((e) => e?.name === "client.authentication.k8s.io/exec")?.extension
        : undefined;
      const info: ExecCluster = { server: String(cfg.server) };
      if (cluster["tls-server-name"]) info["tls-server-name"] = String(cluster["tls-server-name"]);
      if (cfg.insecure) info["insecure-skip-tls-verify"] = true;
      if (cfg.caPem) info["certificate-authority-data"] = btoa(cfg.caPem);
      if (cluster["proxy-url"]) info["proxy-url"] = String(cluster["proxy-url"]);
      if (cluster["disable-compression"] === true) info["disable-compression"] = true;
      if (ext !== undefined) info.config = ext;
      cfg.exec = new ExecAuthenticator(exec, info, { now: opts.exec?.now, timeoutMs: opts.exec?.timeoutMs });
      log.info("Kubeconfig user uses an exec credential plugin", { path, plugin: exec.command });
    }
  }
  return cfg;
}

async function pemFrom(
  data: unknown,
  file: unknown,
  resolve: (p: string) => string,
  kind: "CERTIFICATE" | "PRIVATE KEY",
  what: string,
): Promise<string | undefined> {
  let pem: string;
  if (data) {
    try {
      pem = new TextDecoder("utf-8", { fatal: true }).decode(
        Uint8Array.from(atob(String(data).replace(/\s+/g, "")), (c) => c.charCodeAt(0)),
      );
    } catch {
      throw new KubeConfigError(`invalid configuration: ${what}: the -data field is not valid base64 PEM`);
    }
  } else if (file) {
    const p = resolve(String(file));
    try {
      pem = await Deno.readTextFile(p);
    } catch (e) {
      throw new KubeConfigError(`invalid configuration: unable to read ${what} from ${p}: ${msg(e)}`);
    }
  } else {
    return undefined;
  }
  // Keys: PKCS#8 "PRIVATE KEY", SEC1 "EC PRIVATE KEY", PKCS#1 "RSA PRIVATE KEY" all end in "PRIVATE KEY".
  const re = kind === "CERTIFICATE"
    ? /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/
    : /-----BEGIN (RSA |EC )?PRIVATE KEY-----[\s\S]+?-----END (RSA |EC )?PRIVATE KEY-----/;
  if (!re.test(pem)) {
    if (kind === "PRIVATE KEY" && /ENCRYPTED PRIVATE KEY/.test(pem)) {
      throw new KubeConfigError(
        `invalid configuration: ${what} is encrypted; kube-proxy needs an unencrypted key`,
      );
    }
    throw new KubeConfigError(
      `invalid configuration: ${what} does not contain a PEM ${
        kind === "CERTIFICATE" ? "certificate" : "private key (PKCS#8, SEC1 or PKCS#1)"
      }`,
    );
  }
  return pem;
}
