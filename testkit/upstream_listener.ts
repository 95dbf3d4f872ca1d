/**
 * Upstream kube-proxy (or the agent) running in a sandbox's node namespace against the real kube-apiserver
 * (testkit/kube_apiserver.ts), and HTTP requests to its listeners from inside that namespace, where its
 * `127.0.0.1:10249` (metrics) and `0.0.0.0:10256` (healthz) are. For comparing what the two serve
 * (`/metrics`, `/statusz`, `/flagz`, `/configz`) and for reading upstream's feature gate list from its
 * `kubernetes_feature_enabled` metric (scripts/gen_feature_gates.ts). The namespace is the sandbox's own:
 * whatever the proxy writes to netfilter stays there.
 * @module
 */

import { k8sBinary, type KubeApiServer } from "./kube_apiserver.ts";
import type { Sandbox, SandboxProcess } from "./sandbox.ts";
import type { KubeObject } from "../lib/kube/types.ts";

/** The node the proxies run as. */
export const LISTENER_NODE = "node1";

/** Binds `user` to system:node-proxier (as the DaemonSet's ClusterRoleBinding) and creates the Node. */
export async function prepareProxyUser(api: KubeApiServer, user: string, sb: Sandbox): Promise<void> {
  await api.create({
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: "ClusterRoleBinding",
    metadata: { name: user },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node-proxier" },
    subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: user }],
  } as KubeObject);
  const existing = await api.list({ apiVersion: "v1", kind: "Node" });
  if (!existing.some((n) => n.metadata?.name === LISTENER_NODE)) {
    await api.create({
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: LISTENER_NODE, labels: { "kubernetes.io/hostname": LISTENER_NODE } },
      status: { addresses: [{ type: "InternalIP", address: sb.nodeIP }] },
    } as KubeObject);
  }
}

/** Starts upstream kube-proxy v1.37.2 in the sandbox's node namespace with `args` after the common ones. */
export function startUpstreamProxy(sb: Sandbox, kubeconfig: string, args: string[] = []): SandboxProcess {
  return sb.spawn(sb.node, k8sBinary("kube-proxy"), [
    `--kubeconfig=${kubeconfig}`,
    `--hostname-override=${LISTENER_NODE}`,
    "--cluster-cidr=10.244.0.0/16",
    "--conntrack-max-per-core=0",
    ...args,
  ]);
}

/** One HTTP answer read inside a namespace. */
export interface NsResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/**
 * GET `url` from inside `ns` (a Deno child in the namespace does the fetch), with `headers`. Rejects when the
 * request fails (e.g. nothing listens yet).
 */
export async function nsGet(
  sb: Sandbox,
  ns: string,
  url: string,
  headers: Record<string, string> = {},
): Promise<NsResponse> {
  const code = `const r = await fetch(${JSON.stringify(url)}, { headers: ${JSON.stringify(headers)} });` +
    "console.log(JSON.stringify({ status: r.status, headers: Object.fromEntries(r.headers), body: await r.text() }));";
  const r = await sb.tryExec(ns, Deno.execPath(), ["eval", code]);
  if (r.code !== 0) throw new Error(`GET ${url} in ${ns}: ${r.stderr.trim()}`);
  return JSON.parse(r.stdout) as NsResponse;
}

/** Waits until `url` answers inside `ns` (any status), failing at once when `proc` exits. */
export async function waitForListener(
  sb: Sandbox,
  ns: string,
  url: string,
  proc: SandboxProcess,
  timeoutMs = 60_000,
): Promise<NsResponse> {
  let exited = false;
  proc.status.then(() => exited = true);
  const deadline = Date.now() + timeoutMs;
  let last = "";
  while (true) {
    if (exited) throw new Error(`the proxy exited before ${url} answered:\n${proc.tail()}`);
    try {
      return await nsGet(sb, ns, url);
    } catch (e) {
      last = (e as Error).message;
    }
    if (Date.now() > deadline) {
      throw new Error(`${url} did not answer in ${timeoutMs} ms: ${last}\n${proc.tail()}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** `kubernetes_feature_enabled{name,stage}` samples of a Prometheus text exposition. */
export function featureEnabledSamples(metrics: string): { name: string; stage: string; enabled: boolean }[] {
  const out: { name: string; stage: string; enabled: boolean }[] = [];
  for (const line of metrics.split("\n")) {
    if (!line.startsWith("kubernetes_feature_enabled{")) continue;
    const name = /name="([^"]*)"/.exec(line)?.[1];
    const stage = /stage="([^"]*)"/.exec(line)?.[1] ?? "";
    const value = line.slice(line.lastIndexOf(" ") + 1);
    if (name !== undefined) out.push({ name, stage, enabled: Number(value) === 1 });
  }
  return out;
}
