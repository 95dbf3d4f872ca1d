/**
 * The real kube-apiserver (and its etcd) for tests: built from source by `scripts/build_k8s.sh` into the
 * tools cache, started with a throwaway PKI, a service-account signing key, static-token users,
 * `--authorization-mode=Node,RBAC` and a dual-stack service CIDR, and driven over its REST API with fetch.
 *
 * **Where it runs.** etcd and kube-apiserver run in a network namespace of their own, the control-plane
 * namespace (`dkp-<pid>-k8s<n>-cp`), never in the host's:
 *
 * ```
 *   test process (host ns)                control-plane ns                    node ns (attach)
 *  ┌───────────────────────┐  unix  ┌──────────────────────────────┐ veth ┌────────────────────┐
 *  │ fetch → 127.0.0.1:R ──┼────────┼→ forwarder → 127.0.0.1:6443  │  ┌───┤ k8s0 172.30.0.N/24 │
 *  │  (TcpToUnixRelay)     │ socket │ kube-apiserver 0.0.0.0:6443  │  │   │ agent / kube-proxy │
 *  └───────────────────────┘        │ etcd 127.0.0.1:2379          │  │   └────────────────────┘
 *                                   │ br0 172.30.0.1/24 ───────────┼──┘
 *                                   └──────────────────────────────┘
 * ```
 *
 * A node namespace (the sandbox's, where the agent or upstream kube-proxy runs) cannot see the host's
 * loopback, so {@linkcode KubeApiServer.attach} joins it to the control plane by a veth pair on the
 * control plane's bridge: the agent reaches `https://172.30.0.1:6443` over a real link, through the node's
 * own netfilter hooks, as a node reaches its control plane. Several node namespaces (the parity test's two)
 * can share one server. The tests themselves reach it through a filesystem Unix socket (not tied to a
 * namespace): {@linkcode TcpToUnixRelay} on the host's loopback, a forwarder process inside the control
 * plane. kube-apiserver advertises 172.30.0.1, so the `default/kubernetes` Service and its EndpointSlice
 * point there and work through the agent's rules too. Fixed ports are safe inside the private namespace,
 * which also lets {@linkcode KubeApiServer.restart} bring kube-apiserver back on the same address.
 *
 * No controller-manager runs: there is no EndpointSlice controller (tests write EndpointSlices), no
 * ServiceAccount controller (tests create ServiceAccounts and get tokens with TokenRequest), no namespace
 * controller. Namespaces `default` and `kube-system` are created by kube-apiserver itself.
 *
 * The namespace is named like the sandbox's, so `cleanupStale()` (testkit/sandbox.ts) kills whatever a
 * crashed run left in it and deletes it; a live server is also removed from an unload handler.
 * @module
 */

import { issueCert, makeCA, makeKeyPair } from "./certs.ts";
import { NETNS_PREFIX, SandboxProcess } from "./sandbox.ts";
import { TcpToUnixRelay } from "./unix_forwarder.ts";
import type { KubeEvent, KubeObject, Status } from "../lib/kube/types.ts";

/** The Kubernetes version scripts/build_k8s.sh builds. */
export const K8S_VERSION = "1.37.2";

/** The directory holding the built kube-apiserver, kube-proxy and etcd (`$DKP_TOOLS/k8s-v<version>`). */
export function k8sToolsDir(): string {
  let tools: string | undefined;
  try {
    tools = Deno.env.get("DKP_TOOLS") || undefined;
  } catch { /* no env permission */ }
  tools ??= `${Deno.env.get("HOME") ?? "/root"}/.cache/deno-kube-proxy`;
  return `${tools}/k8s-v${K8S_VERSION}`;
}

/** Path of one built binary. */
export function k8sBinary(name: "kube-apiserver" | "kube-proxy" | "etcd"): string {
  return `${k8sToolsDir()}/${name}`;
}

/**
 * Why the real kube-apiserver cannot run here (not root, a binary not built, openssl missing), or undefined.
 * Tests pass it to `Deno.test({ ignore })` so that a skip is explicit.
 */
export function kubeApiServerUnavailableReason(
  binaries: ("kube-apiserver" | "kube-proxy" | "etcd")[] = ["kube-apiserver", "etcd"],
): string | undefined {
  if (Deno.build.os !== "linux") return "kube-apiserver tests need Linux network namespaces";
  try {
    if (Deno.uid() !== 0) return "kube-apiserver tests need root (network namespaces)";
  } catch {
    return "cannot read the uid (run with --allow-sys)";
  }
  for (const b of binaries) {
    try {
      Deno.statSync(k8sBinary(b));
    } catch {
      return `${k8sBinary(b)} is not built (run scripts/build_k8s.sh)`;
    }
  }
  try {
    new Deno.Command("openssl", { args: ["version"], stdout: "null", stderr: "null" }).outputSync();
  } catch {
    return "openssl is not installed";
  }
  return undefined;
}

/** The address of kube-apiserver on the control plane's bridge, as attached namespaces reach it. */
export const API_SERVER_ADDRESS = "172.30.0.1";
const API_SERVER_PORT = 6443;
const ETCD_CLIENT_PORT = 2379;

/** A non-2xx answer of kube-apiserver, with its Status. */
export class KubeApiRequestError extends Error {
  constructor(readonly code: number, readonly status: Status | undefined, message: string) {
    super(message);
    this.name = "KubeApiRequestError";
  }
  /** The Status reason, e.g. `AlreadyExists`, `NotFound`, `Conflict`, `Forbidden`. */
  get reason(): string {
    return this.status?.reason ?? "";
  }
}

interface ResourceInfo {
  group: string;
  plural: string;
  namespaced: boolean;
}

const RESOURCES: Record<string, ResourceInfo> = {
  "v1/Namespace": { group: "/api/v1", plural: "namespaces", namespaced: false },
  "v1/Node": { group: "/api/v1", plural: "nodes", namespaced: false },
  "v1/Service": { group: "/api/v1", plural: "services", namespaced: true },
  "v1/ServiceAccount": { group: "/api/v1", plural: "serviceaccounts", namespaced: true },
  "v1/Endpoints": { group: "/api/v1", plural: "endpoints", namespaced: true },
  "v1/Event": { group: "/api/v1", plural: "events", namespaced: true },
  "discovery.k8s.io/v1/EndpointSlice": {
    group: "/apis/discovery.k8s.io/v1",
    plural: "endpointslices",
    namespaced: true,
  },
  "events.k8s.io/v1/Event": { group: "/apis/events.k8s.io/v1", plural: "events", namespaced: true },
  "v1/ConfigMap": { group: "/api/v1", plural: "configmaps", namespaced: true },
  "apps/v1/DaemonSet": { group: "/apis/apps/v1", plural: "daemonsets", namespaced: true },
  "rbac.authorization.k8s.io/v1/ClusterRole": {
    group: "/apis/rbac.authorization.k8s.io/v1",
    plural: "clusterroles",
    namespaced: false,
  },
  "rbac.authorization.k8s.io/v1/ClusterRoleBinding": {
    group: "/apis/rbac.authorization.k8s.io/v1",
    plural: "clusterrolebindings",
    namespaced: false,
  },
  "rbac.authorization.k8s.io/v1/Role": {
    group: "/apis/rbac.authorization.k8s.io/v1",
    plural: "roles",
    namespaced: true,
  },
  "rbac.authorization.k8s.io/v1/RoleBinding": {
    group: "/apis/rbac.authorization.k8s.io/v1",
    plural: "rolebindings",
    namespaced: true,
  },
};

/** Names an object: its kind, API version, namespace (for namespaced kinds) and name. */
export interface ObjectRef {
  apiVersion: string;
  kind: string;
  namespace?: string;
  name?: string;
}

/**
 * The REST path of an object (with `name`) or of its collection, e.g.
 * `/apis/discovery.k8s.io/v1/namespaces/dp/endpointslices/web-1`. Throws for kinds it does not know.
 */
export function objectPath(ref: ObjectRef): string {
  const info = RESOURCES[`${ref.apiVersion}/${ref.kind}`];
  if (!info) throw new Error(`objectPath: unsupported kind ${ref.apiVersion}/${ref.kind}`);
  let path = info.group;
  if (info.namespaced) {
    if (!ref.namespace) throw new Error(`objectPath: ${ref.kind} ${ref.name ?? ""} needs a namespace`);
    path += `/namespaces/${encodeURIComponent(ref.namespace)}`;
  }
  path += `/${info.plural}`;
  if (ref.name) path += `/${encodeURIComponent(ref.name)}`;
  return path;
}

export function refOf(obj: KubeObject): ObjectRef {
  if (!obj.apiVersion || !obj.kind) throw new Error("object without apiVersion/kind");
  return {
    apiVersion: obj.apiVersion,
    kind: obj.kind,
    namespace: obj.metadata?.namespace,
    name: obj.metadata?.name,
  };
}

/** Options of {@linkcode KubeApiServer.start}. */
export interface KubeApiServerOptions {
  /** `--service-cluster-ip-range` (one CIDR, or one per family). Default 10.96.0.0/16 and fd00:10:96::/112. */
  serviceCIDRs?: string[];
  /** Users authenticated by static bearer tokens (`--token-auth-file`); tokens are generated. */
  tokenUsers?: string[];
  /** How long to wait for /readyz. Default 60 s. */
  readyTimeoutMs?: number;
  /** More kube-apiserver flags, appended (e.g. an audit log: `--audit-log-path`, `--audit-policy-file`). */
  extraArgs?: string[];
}

/** Options of {@linkcode KubeApiServer.writeKubeconfig}. */
export interface KubeconfigOptions {
  /** A bearer token (`users[].user.token`). */
  token?: string;
  /** A file holding the bearer token (`users[].user.tokenFile`), as in-cluster config reads it. */
  tokenFile?: string;
  /** Where to write; default a new file in the server's temp directory. */
  path?: string;
  /** For clients in the test process: the server is {@linkcode KubeApiServer.localUrl}. */
  local?: boolean;
}

let serverCounter = 0;
const liveServers = new Set<KubeApiServer>();
const onUnload = () => {
  for (const s of [...liveServers]) s.stopSync();
};

/** A running etcd + kube-apiserver pair in its own network namespace. Create with {@linkcode start}. */
export class KubeApiServer {
  /** The control-plane namespace. */
  readonly netns: string;
  /** The temp directory: PKI, token file, etcd data, kubeconfigs, the forwarder's socket. */
  readonly dir: string;
  /** `https://172.30.0.1:6443`: the server as attached namespaces reach it. */
  readonly url = `https://${API_SERVER_ADDRESS}:${API_SERVER_PORT}`;
  /** The CA (PEM) of the serving and client certificates. */
  readonly caPem: string;
  /** Static bearer token of each `tokenUsers` user. */
  readonly tokens: ReadonlyMap<string, string>;
  /** kube-apiserver's arguments (after the binary). */
  readonly args: readonly string[];
  /** How many times kube-apiserver was started (1 + restarts). */
  starts = 0;

  #etcd?: SandboxProcess;
  #apiserver?: SandboxProcess;
  #forwarder?: SandboxProcess;
  #relay?: TcpToUnixRelay;
  #client?: Deno.HttpClient;
  #attached = 0;
  #stopped = false;
  readonly #readyTimeoutMs: number;

  private constructor(
    netns: string,
    dir: string,
    caPem: string,
    tokens: Map<string, string>,
    args: string[],
    readyTimeoutMs: number,
  ) {
    this.netns = netns;
    this.dir = dir;
    this.caPem = caPem;
    this.tokens = tokens;
    this.args = args;
    this.#readyTimeoutMs = readyTimeoutMs;
  }

  /** Makes the PKI, creates the control-plane namespace, starts etcd and kube-apiserver, waits for /readyz. */
  static async start(opts: KubeApiServerOptions = {}): Promise<KubeApiServer> {
    const dir = await Deno.makeTempDir({ prefix: "dkp-kube-apiserver-" });
    const netns = `${NETNS_PREFIX}${Deno.pid}-k8s${serverCounter++}-cp`;
    const ca = await makeCA(dir, "ca", "dkp-test-kubernetes-ca");
    const serviceCIDRs = opts.serviceCIDRs ?? ["10.96.0.0/16", "fd00:10:96::/112"];
    const firstServiceIPs = serviceCIDRs.map((c) => firstAddress(c));
    const serving = await issueCert(dir, ca, {
      name: "apiserver",
      cn: "kube-apiserver",
      serverSANs: [
        `IP:${API_SERVER_ADDRESS}`,
        "IP:127.0.0.1",
        ...firstServiceIPs.map((ip) => `IP:${ip}`),
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
      ],
    });
    await issueCert(dir, ca, { name: "admin", cn: "dkp-test-admin", orgs: ["system:masters"] });
    const sa = await makeKeyPair(dir, "service-account");
    const tokens = new Map<string, string>();
    const tokenLines: string[] = [];
    for (const [i, user] of (opts.tokenUsers ?? []).entries()) {
      const token = `dkp-${crypto.randomUUID().replaceAll("-", "")}`;
      tokens.set(user, token);
      tokenLines.push(`${token},${user},dkp-test-user-${i}`);
    }
    await Deno.writeTextFile(`${dir}/tokens.csv`, tokenLines.join("\n") + "\n");
    const args = [
      `--etcd-servers=http://127.0.0.1:${ETCD_CLIENT_PORT}`,
      "--bind-address=0.0.0.0",
      `--secure-port=${API_SERVER_PORT}`,
      `--advertise-address=${API_SERVER_ADDRESS}`,
      `--cert-dir=${dir}/cert-dir`,
      `--tls-cert-file=${serving.cert}`,
      `--tls-private-key-file=${serving.key}`,
      `--client-ca-file=${ca.cert}`,
      "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
      `--service-account-key-file=${sa.pub}`,
      `--service-account-signing-key-file=${sa.key}`,
      `--service-cluster-ip-range=${serviceCIDRs.join(",")}`,
      "--authorization-mode=Node,RBAC",
      // As kubeadm: kube-proxy and CNI DaemonSets run privileged.
      "--allow-privileged=true",
      `--token-auth-file=${dir}/tokens.csv`,
      "--profiling=false",
      ...(opts.extraArgs ?? []),
    ];
    const server = new KubeApiServer(
      netns,
      dir,
      await Deno.readTextFile(ca.cert),
      tokens,
      args,
      opts.readyTimeoutMs ?? 60_000,
    );
    liveServers.add(server);
    if (liveServers.size === 1) globalThis.addEventListener("unload", onUnload);
    try {
      await server.#setup();
    } catch (err) {
      await server.stop();
      throw err;
    }
    return server;
  }

  async #setup(): Promise<void> {
    await run("ip", ["netns", "add", this.netns]);
    const ipn = (...a: string[]) => run("ip", ["-n", this.netns, ...a]);
    await ipn("link", "set", "lo", "up");
    await ipn("link", "add", "br0", "type", "bridge");
    await ipn("addr", "add", `${API_SERVER_ADDRESS}/24`, "dev", "br0");
    await ipn("link", "set", "br0", "up");
    this.#etcd = this.#spawn(k8sBinary("etcd"), [
      "--name=default",
      `--data-dir=${this.dir}/etcd`,
      `--listen-client-urls=http://127.0.0.1:${ETCD_CLIENT_PORT}`,
      `--advertise-client-urls=http://127.0.0.1:${ETCD_CLIENT_PORT}`,
      "--listen-peer-urls=http://127.0.0.1:2380",
      "--initial-advertise-peer-urls=http://127.0.0.1:2380",
      "--initial-cluster=default=http://127.0.0.1:2380",
      "--log-level=warn",
      // Throwaway data: no fsync keeps writes fast on a busy disk.
      "--unsafe-no-fsync",
    ]);
    const socket = `${this.dir}/apiserver.sock`;
    this.#forwarder = this.#spawn(Deno.execPath(), [
      "run",
      "--allow-net",
      "--allow-read",
      "--allow-write",
      new URL("./unix_forwarder.ts", import.meta.url).pathname,
      socket,
      "127.0.0.1",
      String(API_SERVER_PORT),
    ]);
    // A bound on a hang (a Deno process's start; see Sandbox.startServer), not a speed check.
    await this.#forwarder.waitForOutput(/^ready$/m, 120_000);
    this.#relay = TcpToUnixRelay.start(socket);
    const dir = this.dir;
    this.#client = Deno.createHttpClient({
      caCerts: [this.caPem],
      cert: await Deno.readTextFile(`${dir}/admin.crt`),
      key: await Deno.readTextFile(`${dir}/admin.key`),
    });
    await this.#startApiServer();
  }

  #spawn(cmd: string, args: string[]): SandboxProcess {
    const child = new Deno.Command("ip", {
      args: ["netns", "exec", this.netns, cmd, ...args],
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      env: { DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" },
    }).spawn();
    return new SandboxProcess(this.netns, child, false);
  }

  async #startApiServer(): Promise<void> {
    this.starts++;
    const proc = this.#spawn(k8sBinary("kube-apiserver"), [...this.args]);
    this.#apiserver = proc;
    let exited: Deno.CommandStatus | undefined;
    proc.status.then((s) => exited = s);
    const deadline = Date.now() + this.#readyTimeoutMs;
    let last = "";
    while (true) {
      if (exited) {
        throw new Error(`kube-apiserver exited (code ${exited.code}) before ready:\n${this.logs()}`);
      }
      try {
        const res = await this.#fetch("/readyz", { signal: AbortSignal.timeout(2000) });
        last = `${res.status} ${(await res.text()).slice(0, 200)}`;
        if (res.status === 200) return;
      } catch (err) {
        last = String(err);
      }
      if (Date.now() > deadline) {
        throw new Error(
          `kube-apiserver not ready after ${this.#readyTimeoutMs} ms (${last}):\n${this.logs()}`,
        );
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** `https://127.0.0.1:<port>`: the server as the test process reaches it (through the relay). */
  get localUrl(): string {
    if (!this.#relay) throw new Error("kube-apiserver is stopped");
    return `https://127.0.0.1:${this.#relay.port}`;
  }

  #fetch(path: string, init: RequestInit = {}): Promise<Response> {
    if (!this.#client) throw new Error("kube-apiserver is stopped");
    return fetch(`${this.localUrl}${path}`, { ...init, client: this.#client });
  }

  /** The last lines of kube-apiserver's and etcd's output, for failure messages. */
  logs(chars = 4000): string {
    return `--- kube-apiserver:\n${this.#apiserver?.tail(chars) ?? ""}\n--- etcd:\n${
      this.#etcd?.tail(1000) ?? ""
    }`;
  }

  /**
   * Joins namespace `ns` to the control plane: a veth pair, `k8s0` in `ns` with the next 172.30.0.N/24 on the
   * control plane's bridge. Returns the address `ns` got. The link goes with `ns` when it is deleted.
   */
  async attach(ns: string): Promise<string> {
    const n = ++this.#attached;
    if (n > 250) throw new Error("too many attached namespaces");
    const address = `172.30.0.${n + 1}`;
    const peer = `v${n}`;
    await run("ip", [
      "-n",
      this.netns,
      "link",
      "add",
      peer,
      "type",
      "veth",
      "peer",
      "name",
      "k8s0",
      "netns",
      ns,
    ]);
    await run("ip", ["-n", this.netns, "link", "set", peer, "master", "br0", "up"]);
    await run("ip", ["-n", ns, "addr", "add", `${address}/24`, "dev", "k8s0"]);
    await run("ip", ["-n", ns, "link", "set", "k8s0", "up"]);
    return address;
  }

  /**
   * Writes a kubeconfig for attached namespaces (server {@linkcode url}, or {@linkcode localUrl} with
   * `local`; the CA inline) and returns its path.
   */
  async writeKubeconfig(opts: KubeconfigOptions = {}): Promise<string> {
    const path = opts.path ??
      await Deno.makeTempFile({ dir: this.dir, prefix: "kubeconfig-", suffix: ".yaml" });
    const user = opts.token
      ? `    token: ${opts.token}`
      : opts.tokenFile
      ? `    tokenFile: ${opts.tokenFile}`
      : "    {}";
    await Deno.writeTextFile(
      path,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: dkp",
        "  cluster:",
        `    server: ${opts.local ? this.localUrl : this.url}`,
        `    certificate-authority-data: ${btoa(this.caPem)}`,
        "users:",
        "- name: dkp",
        "  user:",
        user,
        "contexts:",
        "- name: dkp",
        "  context:",
        "    cluster: dkp",
        "    user: dkp",
        "current-context: dkp",
        "",
      ].join("\n"),
    );
    return path;
  }

  // ------------------------------------------------------------------------------------------ REST, as admin

  /**
   * One request as the admin user (`system:masters`); JSON in and out. Throws {@linkcode KubeApiRequestError}
   * for a non-2xx answer.
   */
  async request<T = unknown>(
    method: string,
    path: string,
    body?: unknown,
    contentType = "application/json",
  ): Promise<T> {
    const res = await this.#fetch(path, {
      method,
      headers: body === undefined ? { Accept: "application/json" } : {
        Accept: "application/json",
        "Content-Type": contentType,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await res.text();
    let json: unknown;
    try {
      json = text ? JSON.parse(text) : undefined;
    } catch {
      json = undefined;
    }
    if (res.status < 200 || res.status > 299) {
      const st = (json as Status | undefined)?.kind === "Status" ? json as Status : undefined;
      throw new KubeApiRequestError(
        res.status,
        st,
        `${method} ${path}: ${res.status} ${st?.reason ?? ""}: ${st?.message ?? text.slice(0, 300)}`,
      );
    }
    return json as T;
  }

  /** Creates an object (POST to its collection); returns it as stored. */
  create<T extends KubeObject>(obj: T): Promise<T> {
    const ref = refOf(obj);
    return this.request<T>("POST", objectPath({ ...ref, name: undefined }), obj);
  }

  /** Reads an object. */
  get<T extends KubeObject = KubeObject>(ref: ObjectRef): Promise<T> {
    return this.request<T>("GET", objectPath(ref));
  }

  /** Lists a collection (optionally in one namespace, with a label selector); returns the items. */
  async list<T extends KubeObject = KubeObject>(
    ref: Omit<ObjectRef, "name">,
    labelSelector?: string,
  ): Promise<T[]> {
    const q = labelSelector ? `?labelSelector=${encodeURIComponent(labelSelector)}` : "";
    const list = await this.request<{ items: T[] }>("GET", objectPath({ ...ref, name: undefined }) + q);
    return list.items ?? [];
  }

  /**
   * Replaces an object (PUT) with `obj`, taking the stored resourceVersion when `obj` has none, so the
   * update is unconditional; returns it as stored.
   */
  async update<T extends KubeObject>(obj: T): Promise<T> {
    const ref = refOf(obj);
    for (let attempt = 0;; attempt++) {
      const body = structuredClone(obj);
      if (!body.metadata?.resourceVersion) {
        const cur = await this.get(ref);
        body.metadata = { ...body.metadata, resourceVersion: cur.metadata?.resourceVersion };
      }
      try {
        return await this.request<T>("PUT", objectPath(ref), body);
      } catch (err) {
        if (
          err instanceof KubeApiRequestError && err.code === 409 && attempt < 3 &&
          !obj.metadata?.resourceVersion
        ) {
          continue;
        }
        throw err;
      }
    }
  }

  /** Creates `obj`, or replaces it when it exists. */
  async apply<T extends KubeObject>(obj: T): Promise<T> {
    try {
      return await this.create(obj);
    } catch (err) {
      if (err instanceof KubeApiRequestError && err.code === 409) return await this.update(obj);
      throw err;
    }
  }

  /** Sets an object's status through its `/status` subresource (a merge patch); returns the object. */
  patchStatus<T extends KubeObject>(ref: ObjectRef, status: unknown): Promise<T> {
    return this.request<T>("PATCH", `${objectPath(ref)}/status`, { status }, "application/merge-patch+json");
  }

  /** A JSON merge patch of an object. */
  patch<T extends KubeObject>(ref: ObjectRef, patch: unknown): Promise<T> {
    return this.request<T>("PATCH", objectPath(ref), patch, "application/merge-patch+json");
  }

  /** Deletes an object (an object or a reference); resolves false when it did not exist. */
  async remove(ref: ObjectRef | KubeObject): Promise<boolean> {
    const r = "metadata" in ref ? refOf(ref as KubeObject) : ref as ObjectRef;
    try {
      await this.request("DELETE", objectPath(r));
      return true;
    } catch (err) {
      if (err instanceof KubeApiRequestError && err.code === 404) return false;
      throw err;
    }
  }

  /** A token for a ServiceAccount from the TokenRequest API (what a projected token volume holds). */
  async createToken(namespace: string, serviceAccount: string, expirationSeconds = 3600): Promise<string> {
    const tr = await this.request<{ status?: { token?: string } }>(
      "POST",
      `/api/v1/namespaces/${encodeURIComponent(namespace)}/serviceaccounts/${
        encodeURIComponent(serviceAccount)
      }/token`,
      { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { expirationSeconds } },
    );
    if (!tr.status?.token) {
      throw new Error(`TokenRequest for ${namespace}/${serviceAccount} returned no token`);
    }
    return tr.status.token;
  }

  /** events.k8s.io/v1 Events of a namespace (default `default`, where kube-proxy reports about its Node). */
  events(namespace = "default"): Promise<KubeEvent[]> {
    return this.list<KubeEvent>({ apiVersion: "events.k8s.io/v1", kind: "Event", namespace });
  }

  /**
   * Restarts kube-apiserver with the same etcd, address and arguments, as kubelet restarts a static pod:
   * SIGTERM, SIGKILL after `graceMs`, start again; resolves when it is ready again, with the milliseconds it
   * was away. (On SIGTERM kube-apiserver stops listening at once but keeps open watch connections until
   * `--request-timeout`, 60 s, has passed: clients see nothing until the process is gone.)
   */
  async restart(graceMs = 2000): Promise<number> {
    const t0 = performance.now();
    await this.stopApiServer(graceMs);
    await this.#startApiServer();
    return performance.now() - t0;
  }

  /** Stops kube-apiserver only (SIGTERM, SIGKILL after `graceMs`); {@linkcode startAgain} brings it back. */
  async stopApiServer(graceMs = 2000): Promise<void> {
    await this.#apiserver?.stop(graceMs);
  }

  /** Starts kube-apiserver after {@linkcode stopApiServer}; resolves when ready. */
  async startAgain(): Promise<void> {
    await this.#startApiServer();
  }

  /** Kills every process, deletes the namespace and the temp directory. Idempotent. */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    await this.#relay?.close();
    this.#client?.close();
    const procs = [this.#apiserver, this.#forwarder, this.#etcd].filter((p) => p !== undefined);
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.status.catch(() => {})));
    this.stopSync();
  }

  /** Synchronous, best-effort {@linkcode stop} for unload handlers. */
  stopSync(): void {
    this.#stopped = true;
    for (const p of [this.#apiserver, this.#forwarder, this.#etcd]) p?.kill("SIGKILL");
    try {
      const pids = new Deno.Command("ip", { args: ["netns", "pids", this.netns], stderr: "null" })
        .outputSync();
      for (const pid of new TextDecoder().decode(pids.stdout).split(/\s+/).filter(Boolean)) {
        try {
          Deno.kill(Number(pid), "SIGKILL");
        } catch { /* gone */ }
      }
      new Deno.Command("ip", { args: ["netns", "del", this.netns], stderr: "null" }).outputSync();
    } catch { /* no ip */ }
    try {
      Deno.removeSync(this.dir, { recursive: true });
    } catch { /* gone */ }
    liveServers.delete(this);
    if (liveServers.size === 0) globalThis.removeEventListener("unload", onUnload);
  }

  /** Lets `await using api = await KubeApiServer.start()` stop it at scope exit. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/** The first host address of a CIDR (what kube-apiserver gives the `kubernetes` Service). */
function firstAddress(cidr: string): string {
  const [ip] = cidr.split("/");
  if (ip.includes(":")) {
    // Enough for the CIDRs tests use: the prefix ends in "::" (or a zero group).
    return ip.endsWith("::") ? `${ip}1` : ip.replace(/:0?$/, ":1");
  }
  const o = ip.split(".").map(Number);
  o[3] += 1;
  return o.join(".");
}
