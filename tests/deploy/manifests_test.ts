/**
 * The Kubernetes manifests in deploy/ (issue 14 item 3) checked against the agent itself: the ConfigMap's
 * config.conf through the agent's own loader and validation, its kubeconfig.conf through the agent's kubeconfig
 * loader, the DaemonSet's command line through the agent's flag parser, and the wiring between them (mounts,
 * probes and ports, image, RBAC, rollout). tests/image/rootfs_test.ts runs the agent with this DaemonSet command
 * and ConfigMap inside the image's file set.
 */

import assert from "node:assert/strict";
import { parse as parseYaml } from "yaml";
import { decodeConfiguration } from "../../lib/config/load.ts";
import { Options } from "../../lib/config/options.ts";
import { validateConfiguration } from "../../lib/config/validate.ts";
import { loadKubeconfigFile } from "../../lib/kube/kubeconfig.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import { makeTestPki } from "../../testkit/certs.ts";
import {
  deployObject,
  expandCommand,
  kubeProxyContainer,
  readDeployManifests,
} from "../../testkit/deploy.ts";
import {
  KubeApiServer,
  kubeApiServerUnavailableReason,
  objectPath,
  refOf,
} from "../../testkit/kube_apiserver.ts";
import type { KubeObject } from "../../lib/kube/types.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";
/** How long the agent waits for its Node before exiting (NodeManager's default waitTimeoutMs). */
const NODE_WAIT_S = 300;

function configMapConfig() {
  return decodeConfiguration(deployObject("ConfigMap", "kube-proxy").data["config.conf"]);
}

Deno.test("manifests: every document parses and names its kind, API version and namespace", () => {
  const all = readDeployManifests();
  const kinds = all.map((m) => `${m.file}: ${m.obj.kind}/${m.obj.metadata.name}`).sort();
  assert.deepEqual(kinds, [
    "configmap.yaml: ConfigMap/kube-proxy",
    "daemonset.yaml: ClusterRoleBinding/deno-kube-proxy",
    "daemonset.yaml: DaemonSet/kube-proxy",
    "daemonset.yaml: ServiceAccount/kube-proxy",
  ]);
  for (const { obj } of all) {
    assert.ok(obj.apiVersion, `${obj.kind} has an apiVersion`);
    if (obj.kind !== "ClusterRoleBinding") assert.equal(obj.metadata.namespace, "kube-system", obj.kind);
  }
});

Deno.test("manifests: the ConfigMap's config.conf is a KubeProxyConfiguration the agent accepts as it is", () => {
  const { config, strictErrors } = configMapConfig();
  assert.deepEqual(strictErrors, [], "no unknown or duplicate fields");
  assert.deepEqual(validateConfiguration(config).map((e) => e.toString()), []);
  assert.equal(config.mode, "iptables");
  assert.deepEqual(config.nodePortAddresses, ["primary"]);
});

Deno.test("manifests: the ConfigMap's kubeconfig.conf loads with the agent's loader and uses the pod's service account", async () => {
  const cm = deployObject("ConfigMap", "kube-proxy");
  const text: string = cm.data["kubeconfig.conf"];
  const doc = parseYaml(text);
  assert.equal(doc.clusters[0].cluster["certificate-authority"], `${SERVICE_ACCOUNT_DIR}/ca.crt`);
  assert.equal(doc.users[0].user.tokenFile, `${SERVICE_ACCOUNT_DIR}/token`);
  // The same file with the service-account directory moved to a temporary one holding a CA and a token.
  const pki = await makeTestPki();
  const sa = await Deno.makeTempDir({ prefix: "dkp-sa-" });
  try {
    await Deno.copyFile(pki.paths.caCert, `${sa}/ca.crt`);
    await Deno.writeTextFile(`${sa}/token`, "sa-token\n");
    await Deno.writeTextFile(`${sa}/kubeconfig.conf`, text.replaceAll(SERVICE_ACCOUNT_DIR, sa));
    const rest = await loadKubeconfigFile(`${sa}/kubeconfig.conf`);
    assert.match(rest.server, /^https:\/\/[^/]+:6443$/);
    assert.equal(rest.caPem?.trim(), pki.caCert.trim());
    assert.equal(rest.tokenFile, `${sa}/token`);
    assert.equal(rest.insecure, false);
  } finally {
    await Deno.remove(sa, { recursive: true });
    await Deno.remove(pki.dir, { recursive: true });
  }
});

Deno.test("manifests: the DaemonSet runs the image's binary with flags the agent accepts and the ConfigMap it mounts", () => {
  const c = kubeProxyContainer();
  const dockerfile = Deno.readTextFileSync(`${PROJECT_ROOT}Dockerfile`);
  const entrypoint = JSON.parse(/^ENTRYPOINT (\[.*\])$/m.exec(dockerfile)![1]);
  assert.equal(c.command[0], entrypoint[0]);
  // Every $(VAR) is defined by the container's env, and every flag parses with the agent's own flag set.
  const env: Record<string, string> = {};
  for (const e of c.env) env[e.name] = "node-1";
  const argv = expandCommand(c.command.slice(1), env);
  assert.ok(argv.every((a: string) => !a.includes("$(")), argv.join(" "));
  const o = new Options();
  o.parse(argv);
  assert.equal(o.hostnameOverride, "node-1");
  // --config names a key of the ConfigMap volume, and the config's kubeconfig the other key.
  const ds = deployObject("DaemonSet", "kube-proxy");
  const cmVolume = ds.spec.template.spec.volumes.find((v: { configMap?: { name: string } }) => v.configMap);
  assert.equal(cmVolume.configMap.name, "kube-proxy");
  const mount = c.volumeMounts.find((m: { name: string }) => m.name === cmVolume.name);
  const keys = Object.keys(deployObject("ConfigMap", "kube-proxy").data).map((k) =>
    `${mount.mountPath}/${k}`
  );
  assert.ok(keys.includes(o.configFile), `${o.configFile} in ${keys}`);
  assert.ok(keys.includes(configMapConfig().config.clientConnection.kubeconfig));
  // The image tag follows the project's version.
  const version = JSON.parse(Deno.readTextFileSync(`${PROJECT_ROOT}deno.json`)).version;
  assert.equal(c.image, `deno-kube-proxy:${version}`);
});

Deno.test("manifests: probes hit the agent's health port, and the startup probe outlasts the agent's wait for its Node", () => {
  const c = kubeProxyContainer();
  const healthz = configMapConfig().config.healthzBindAddress;
  const port = Number(healthz.slice(healthz.lastIndexOf(":") + 1));
  for (const name of ["startupProbe", "livenessProbe", "readinessProbe"]) {
    const p = c[name];
    assert.ok(p?.httpGet, `${name} is an HTTP probe`);
    assert.equal(p.httpGet.port, port, name);
    assert.ok(["/livez", "/healthz"].includes(p.httpGet.path), `${name}: ${p.httpGet.path}`);
  }
  // The health server opens only once the Node is known; liveness only starts after the startup probe passes,
  // so it can never kill a pod still waiting. The startup budget leaves the decision to the agent's own timeout.
  const s = c.startupProbe;
  assert.ok(s.periodSeconds * s.failureThreshold > NODE_WAIT_S, `${s.periodSeconds} x ${s.failureThreshold}`);
  assert.equal(c.livenessProbe.httpGet.path, "/livez", "liveness must not depend on Node eligibility");
});

Deno.test("manifests: memory request below its limit, no CPU limit; rolling update without surge", () => {
  const c = kubeProxyContainer();
  const mib = (q: string) => {
    const m = /^(\d+)(Mi|Gi)$/.exec(q);
    assert.ok(m, `quantity ${q} in Mi or Gi`);
    return Number(m[1]) * (m[2] === "Gi" ? 1024 : 1);
  };
  const { requests, limits } = c.resources;
  assert.ok(mib(requests.memory) < mib(limits.memory));
  assert.ok(requests.cpu, "a CPU request");
  assert.equal(limits.cpu, undefined, "no CPU limit: throttling would stretch syncs");
  const strategy = deployObject("DaemonSet", "kube-proxy").spec.updateStrategy;
  assert.equal(strategy.type, "RollingUpdate");
  assert.ok(strategy.rollingUpdate.maxUnavailable, "maxUnavailable is set");
  assert.equal(
    strategy.rollingUpdate.maxSurge,
    0,
    "two agents on one node would share host ports and chains",
  );
});

Deno.test("manifests: the DaemonSet's service account is bound to system:node-proxier and mounts the xtables lock", () => {
  const ds = deployObject("DaemonSet", "kube-proxy");
  const crb = deployObject("ClusterRoleBinding", "deno-kube-proxy");
  assert.equal(crb.roleRef.name, "system:node-proxier");
  assert.deepEqual(crb.subjects, [{
    kind: "ServiceAccount",
    name: ds.spec.template.spec.serviceAccountName,
    namespace: ds.metadata.namespace,
  }]);
  const c = kubeProxyContainer();
  const lock = c.volumeMounts.find((m: { mountPath: string }) => m.mountPath === "/run/xtables.lock");
  const vol = ds.spec.template.spec.volumes.find((v: { name: string }) => v.name === lock.name);
  assert.deepEqual(vol.hostPath, { path: "/run/xtables.lock", type: "FileOrCreate" });
  assert.equal(ds.spec.template.spec.hostNetwork, true);
});

// Server-side dry run with strict field validation: the real kube-apiserver (scripts/build_k8s.sh) must accept
// every object as written, in dependency order (namespace objects before the DaemonSet that uses them).
privilegedTest(kubeApiServerUnavailableReason(), {
  name: "manifests: a real kube-apiserver accepts every manifest (server-side dry run, strict fields)",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const api = await KubeApiServer.start();
    try {
      const order = ["ServiceAccount", "ClusterRoleBinding", "ConfigMap", "DaemonSet"];
      const all = readDeployManifests().sort((a, b) => order.indexOf(a.obj.kind) - order.indexOf(b.obj.kind));
      assert.equal(all.length, order.length);
      for (const { file, obj } of all) {
        const path = objectPath({ ...refOf(obj as KubeObject), name: undefined }) +
          "?dryRun=All&fieldValidation=Strict";
        const stored = await api.request<KubeObject>("POST", path, obj).catch((err) => {
          throw new Error(`${file}: ${obj.kind}/${obj.metadata.name} rejected: ${(err as Error).message}`);
        });
        assert.equal(stored.metadata?.name, obj.metadata.name);
      }
    } finally {
      await api.stop();
    }
  },
});
