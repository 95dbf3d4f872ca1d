/**
 * client-go credential plugins (a kubeconfig user's `exec:`), run by us with `Deno.Command`, following
 * client-go's plugin/pkg/client/auth/exec: the ExecCredential protocol in `client.authentication.k8s.io/v1`
 * or `v1beta1`, the request in `KUBERNETES_EXEC_INFO` (with the cluster when `provideClusterInfo` is set),
 * the plugin's environment = ours + the kubeconfig's `env` entries, a token and/or a client certificate
 * and key in `status`, kept until `expirationTimestamp` (or forever without one), and run again after a
 * 401 answered to the credential it produced.
 *
 * The agent's `--allow-run` lists fixed programs, so a plugin must be granted explicitly (see the
 * README's permission table): {@link checkPluginAllowed} fails at start-up with the exact flag to add.
 * @module
 */

import { log } from "../log.ts";
import { recordExecCertificate, recordExecPluginCall } from "./client_metrics.ts";

/** The two credential API versions client-go v0.35 accepts. */
export const EXEC_API_VERSIONS = ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"];

/** How an operator grants a plugin to the agent (shown in the error when it is not granted). */
export const PLUGIN_PERMISSION_HINT =
  "grant exactly that program: add --allow-run=<plugin> to the deno command line, or set " +
  "DKP_EXTRA_PERMISSIONS=--allow-run=<plugin> for `deno task start` / `deno task compile` (the compiled " +
  "binary and the container image carry the permissions they were built with)";

/** A kubeconfig user's `exec` section, after validation (client-go's api.ExecConfig). */
export interface ExecConfig {
  /** The program (resolved against the kubeconfig's directory when it contains a slash). */
  command: string;
  args: string[];
  /** Extra environment entries for the plugin. */
  env: { name: string; value: string }[];
  apiVersion: string;
  /** Never, IfAvailable or Always (v1beta1 defaults to IfAvailable). */
  interactiveMode: "Never" | "IfAvailable" | "Always";
  provideClusterInfo: boolean;
  installHint?: string;
}

/** What a plugin is told about the cluster when `provideClusterInfo` is true (client-go's Cluster). */
export interface ExecCluster {
  server: string;
  "tls-server-name"?: string;
  "insecure-skip-tls-verify"?: boolean;
  /** Base64 of the CA bundle (PEM), as Go encodes []byte. */
  "certificate-authority-data"?: string;
  "proxy-url"?: string;
  "disable-compression"?: boolean;
  /** The cluster's `client.authentication.k8s.io/exec` extension. */
  config?: unknown;
}

/** Credentials a plugin returned. */
export interface ExecCredentials {
  token?: string;
  certPem?: string;
  keyPem?: string;
  /** ms since the epoch; undefined: no expiry. */
  expiresAt?: number;
}

/** The plugin could not give credentials; the message says why (as client-go's). */
export class ExecPluginError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ExecPluginError";
  }
}

/**
 * How long a non-interactive plugin may run before it is killed and the request fails (ours: client-go runs
 * the plugin with no time limit, under the authenticator's lock, so a hung plugin stalls every request of the
 * process until it exits). An interactive run (a person at a terminal) has no limit, as in client-go.
 */
export const EXEC_PLUGIN_TIMEOUT_MS = 60_000;

/** How the plugin is started (tests substitute a fake). `signal` aborts (kills) it. */
export type PluginRunner = (
  cmd: string,
  args: string[],
  env: Record<string, string>,
  interactive: boolean,
  signal?: AbortSignal,
) => Promise<{ code: number; stdout: string }>;

const denoRunner: PluginRunner = async (cmd, args, env, interactive, signal) => {
  const out = await new Deno.Command(cmd, {
    args,
    env,
    stdin: interactive ? "inherit" : "null",
    stdout: "piped",
    stderr: "inherit",
    signal,
  }).output();
  return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
};

function stdinIsTerminal(): boolean {
  try {
    return Deno.stdin.isTerminal();
  } catch {
    return false;
  }
}

/**
 * Validates a kubeconfig `exec` section as clientcmd does; returns the problems (empty when valid).
 * `userName` is used in the messages.
 */
export function validateExecConfig(exec: Record<string, unknown>, userName: string): string[] {
  const errs: string[] = [];
  if (!exec.command) errs.push(`command must be specified for ${userName} to use exec authentication plugin`);
  if (!exec.apiVersion) {
    errs.push(`apiVersion must be specified for ${userName} to use exec authentication plugin`);
  }
  for (const e of (Array.isArray(exec.env) ? exec.env : []) as { name?: string }[]) {
    if (!e?.name) {
      errs.push(`env variable name must be specified for ${userName} to use exec authentication plugin`);
    }
  }
  let mode = exec.interactiveMode;
  if (!mode && exec.apiVersion !== "client.authentication.k8s.io/v1") mode = "IfAvailable";
  if (!mode) errs.push(`interactiveMode must be specified for ${userName} to use exec authentication plugin`);
  else if (!["Never", "IfAvailable", "Always"].includes(String(mode))) {
    errs.push(`invalid interactiveMode for ${userName}: "${mode}"`);
  }
  if (exec.apiVersion && !EXEC_API_VERSIONS.includes(String(exec.apiVersion))) {
    errs.push(`exec plugin: invalid apiVersion "${exec.apiVersion}"`);
  }
  return errs;
}

/** Builds an {@link ExecConfig} from a validated kubeconfig `exec` section. */
export function execConfigFrom(exec: Record<string, unknown>, kubeconfigDir: string): ExecConfig {
  let command = String(exec.command);
  if (command.includes("/") && !command.startsWith("/")) command = `${kubeconfigDir}/${command}`;
  const env = ((Array.isArray(exec.env) ? exec.env : []) as { name: string; value?: unknown }[])
    .map((e) => ({ name: String(e.name), value: e.value === undefined ? "" : String(e.value) }));
  const apiVersion = String(exec.apiVersion);
  return {
    command,
    args: ((Array.isArray(exec.args) ? exec.args : []) as unknown[]).map(String),
    env,
    apiVersion,
    interactiveMode: (exec.interactiveMode as ExecConfig["interactiveMode"] | undefined) ?? "IfAvailable",
    provideClusterInfo: exec.provideClusterInfo === true,
    installHint: exec.installHint ? String(exec.installHint) : undefined,
  };
}

/**
 * Whether the agent's permissions let it start `command`; a message saying exactly what to add when not.
 */
export function checkPluginAllowed(command: string): string | undefined {
  let state: Deno.PermissionState;
  try {
    state = Deno.permissions.querySync({ name: "run", command }).state;
  } catch (e) {
    return `cannot check whether the exec plugin ${command} may run: ${(e as Error).message}`;
  }
  if (state === "granted") return undefined;
  return `the exec credential plugin "${command}" is not among the programs the agent may run (--allow-run); ` +
    PLUGIN_PERMISSION_HINT.replaceAll("<plugin>", command);
}

/** Runs a credential plugin and caches what it returns. */
export class ExecAuthenticator {
  private cached?: ExecCredentials;
  private running?: Promise<ExecCredentials>;
  /** Times the plugin ran (for tests and logs). */
  runs = 0;

  constructor(
    readonly config: ExecConfig,
    private readonly cluster: ExecCluster,
    private readonly opts: {
      run?: PluginRunner;
      now?: () => number;
      isTerminal?: () => boolean;
      /** @default EXEC_PLUGIN_TIMEOUT_MS */
      timeoutMs?: number;
    } = {},
  ) {}

  private now(): number {
    return (this.opts.now ?? Date.now)();
  }

  /** The current credentials, running the plugin when there are none or they expired. */
  get(): Promise<ExecCredentials> {
    const c = this.cached;
    if (c && (c.expiresAt === undefined || this.now() <= c.expiresAt)) return Promise.resolve(c);
    return this.refresh();
  }

  /**
   * After a 401 answered to `used`: runs the plugin again unless the credentials were already replaced
   * (client-go's maybeRefreshCreds). Resolves with the credentials to use now.
   */
  refreshAfterUnauthorized(used: ExecCredentials): Promise<ExecCredentials> {
    if (this.cached !== used && this.cached) return Promise.resolve(this.cached);
    return this.refresh();
  }

  private refresh(): Promise<ExecCredentials> {
    // One plugin run at a time; concurrent callers share it.
    this.running ??= this.runPlugin().finally(() => this.running = undefined);
    return this.running;
  }

  private interactive(): boolean {
    const isTerminal = (this.opts.isTerminal ?? stdinIsTerminal)();
    switch (this.config.interactiveMode) {
      case "Never":
        return false;
      case "IfAvailable":
        return isTerminal;
      case "Always":
        if (!isTerminal) {
          throw new ExecPluginError(
            "exec plugin cannot support interactive mode: standard input is not a terminal",
          );
        }
        return true;
    }
  }

  private async runPlugin(): Promise<ExecCredentials> {
    const cfg = this.config;
    const interactive = this.interactive();
    const spec: Record<string, unknown> = { interactive };
    if (cfg.provideClusterInfo) spec.cluster = this.cluster;
    const info = JSON.stringify({ kind: "ExecCredential", apiVersion: cfg.apiVersion, spec });
    const env: Record<string, string> = {};
    for (const e of cfg.env) env[e.name] = e.value;
    env.KUBERNETES_EXEC_INFO = info;
    this.runs++;
    let out: { code: number; stdout: string };
    const timeoutMs = this.opts.timeoutMs ?? EXEC_PLUGIN_TIMEOUT_MS;
    const abort = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = interactive ? null : new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        abort.abort();
        reject(
          new ExecPluginError(
            `exec: executable ${cfg.command} did not finish within ${timeoutMs / 1000}s; killed`,
          ),
        );
      }, timeoutMs);
    });
    try {
      const run = (this.opts.run ?? denoRunner)(cfg.command, cfg.args, env, interactive, abort.signal);
      out = await (timedOut ? Promise.race([run, timedOut]) : run);
    } catch (e) {
      if (e instanceof ExecPluginError) {
        // The time limit killed it (ours; client-go has none): a failed run of the plugin.
        recordExecPluginCall(1, "plugin_execution_error");
        throw e;
      }
      recordExecPluginCall(
        1,
        e instanceof Deno.errors.NotFound ? "plugin_not_found_error" : "client_internal_error",
      );
      if (e instanceof Deno.errors.NotFound) {
        let msg = `exec: executable ${cfg.command} not found\n\nIt looks like you are trying to use a ` +
          "client-go credential plugin that is not installed.\n\nTo learn more about this feature, consult " +
          "the documentation available at:\n      " +
          "https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins";
        if (cfg.installHint) msg += `\n\n${cfg.installHint}`;
        throw new ExecPluginError(msg, { cause: e });
      }
      if (e instanceof Deno.errors.NotCapable || e instanceof Deno.errors.PermissionDenied) {
        throw new ExecPluginError(
          checkPluginAllowed(cfg.command) ?? `exec: ${(e as Error).message}`,
          { cause: e },
        );
      }
      throw new ExecPluginError(`exec: ${(e as Error).message}`, { cause: e });
    } finally {
      clearTimeout(timer);
    }
    recordExecPluginCall(out.code, out.code === 0 ? "no_error" : "plugin_execution_error");
    if (out.code !== 0) {
      throw new ExecPluginError(`exec: executable ${cfg.command} failed with exit code ${out.code}`);
    }
    const creds = parseExecCredential(out.stdout, cfg.apiVersion);
    const old = this.cached;
    this.cached = creds;
    recordExecCertificate(creds.certPem, old?.certPem);
    if (old && old.certPem !== creds.certPem) {
      log.info("Exec credential plugin rotated the client certificate", { plugin: cfg.command });
    }
    log.v(2).info("Exec credential plugin returned credentials", {
      plugin: cfg.command,
      token: creds.token !== undefined,
      clientCertificate: creds.certPem !== undefined,
      expires: creds.expiresAt === undefined ? "never" : new Date(creds.expiresAt).toISOString(),
    });
    return creds;
  }
}

/** Decodes a plugin's stdout as client-go does; throws ExecPluginError with client-go's messages. */
export function parseExecCredential(stdout: string, apiVersion: string): ExecCredentials {
  let obj: {
    apiVersion?: string;
    kind?: string;
    status?: {
      token?: string;
      clientCertificateData?: string;
      clientKeyData?: string;
      expirationTimestamp?: string;
    };
  };
  try {
    obj = JSON.parse(stdout);
  } catch (e) {
    throw new ExecPluginError(`decoding stdout: ${(e as Error).message}`);
  }
  if (!obj || typeof obj !== "object" || !obj.apiVersion || !obj.kind) {
    throw new ExecPluginError("decoding stdout: Object 'Kind' or 'apiVersion' is missing");
  }
  if (obj.kind !== "ExecCredential") {
    throw new ExecPluginError(
      `decoding stdout: no kind "${obj.kind}" is registered for version "${obj.apiVersion}"`,
    );
  }
  if (obj.apiVersion !== apiVersion) {
    throw new ExecPluginError(
      `exec plugin is configured to use API version ${apiVersion}, plugin returned version ${obj.apiVersion}`,
    );
  }
  const st = obj.status;
  if (!st) throw new ExecPluginError("exec plugin didn't return a status field");
  if (!st.token && !st.clientCertificateData && !st.clientKeyData) {
    throw new ExecPluginError("exec plugin didn't return a token or cert/key pair");
  }
  if (!st.clientCertificateData !== !st.clientKeyData) {
    throw new ExecPluginError("exec plugin returned only certificate or key, not both");
  }
  const creds: ExecCredentials = {};
  if (st.token) creds.token = st.token;
  if (st.clientCertificateData) {
    if (!/-----BEGIN CERTIFICATE-----/.test(st.clientCertificateData)) {
      throw new ExecPluginError(
        "failed parsing client key/certificate: no PEM certificate in clientCertificateData",
      );
    }
    if (!/-----BEGIN (RSA |EC )?PRIVATE KEY-----/.test(st.clientKeyData!)) {
      throw new ExecPluginError("failed parsing client key/certificate: no PEM private key in clientKeyData");
    }
    creds.certPem = st.clientCertificateData;
    creds.keyPem = st.clientKeyData;
  }
  if (st.expirationTimestamp) {
    const t = Date.parse(st.expirationTimestamp);
    if (Number.isNaN(t)) {
      throw new ExecPluginError(`decoding stdout: invalid expirationTimestamp "${st.expirationTimestamp}"`);
    }
    creds.expiresAt = t;
  }
  return creds;
}
