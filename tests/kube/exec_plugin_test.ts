/**
 * Exec credential plugins (client.authentication.k8s.io v1 and v1beta1), run by the agent itself: real
 * shell-script plugins, a real simulator (plain HTTP with a bearer token, or mTLS with a plugin-issued client
 * certificate), and client-go's messages for every failure.
 */
import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { makeTestPki } from "../../testkit/certs.ts";
import { createKubeClient } from "../../lib/kube/client.ts";
import { KubeConfigError, loadRestConfig } from "../../lib/kube/kubeconfig.ts";
import { ExecAuthenticator, ExecPluginError, parseExecCredential } from "../../lib/kube/exec_credential.ts";
import "./helpers.ts";

const V1 = "client.authentication.k8s.io/v1";
const V1BETA1 = "client.authentication.k8s.io/v1beta1";

interface PluginSetup {
  dir: string;
  plugin: string;
  /** Lines the plugin appended: one per run, with its argv, env and KUBERNETES_EXEC_INFO. */
  runs(): Promise<{ args: string; extra: string; inherited: string; info: Record<string, unknown> }[]>;
}

/**
 * A plugin script that prints `credential` (a shell expression producing JSON) and logs each run. The
 * token it returns is read from `<dir>/token` at each run, so tests can rotate it.
 */
async function makePlugin(credential: string): Promise<PluginSetup> {
  const dir = await Deno.makeTempDir({ prefix: "exec-plugin-" });
  const plugin = `${dir}/cred.sh`;
  await Deno.writeTextFile(
    plugin,
    `#!/bin/sh
printf '%s\\t%s\\t%s\\t%s\\n' "$*" "$EXTRA_VAR" "$DKP_INHERITED" "$KUBERNETES_EXEC_INFO" >> "${dir}/runs.log"
TOKEN=$(cat "${dir}/token" 2>/dev/null)
${credential}
`,
  );
  await Deno.chmod(plugin, 0o755);
  return {
    dir,
    plugin,
    async runs() {
      let text = "";
      try {
        text = await Deno.readTextFile(`${dir}/runs.log`);
      } catch { /* none yet */ }
      return text.split("\n").filter(Boolean).map((l) => {
        const [args, extra, inherited, info] = l.split("\t");
        return { args, extra, inherited, info: JSON.parse(info) };
      });
    },
  };
}

function kubeconfig(server: string, exec: string, cluster = ""): string {
  return `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "${server}"${cluster}}}]
users:
- name: u
  user:
    exec:
${exec}
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`;
}

Deno.test("exec plugin (v1): token, args, env entries, inherited environment and KUBERNETES_EXEC_INFO", async () => {
  const sim = await ApiServerSimulator.start({ token: "tok-1" });
  const p = await makePlugin(
    `echo "{\\"apiVersion\\":\\"${V1}\\",\\"kind\\":\\"ExecCredential\\",\\"status\\":{\\"token\\":\\"$TOKEN\\"}}"`,
  );
  await Deno.writeTextFile(`${p.dir}/token`, "tok-1");
  Deno.env.set("DKP_INHERITED", "from-parent");
  const kc = `${p.dir}/kc.yaml`;
  await Deno.writeTextFile(
    kc,
    kubeconfig(
      sim.url,
      `      apiVersion: ${V1}
      command: ./cred.sh
      args: [get-token, --cluster, c1]
      env: [{name: EXTRA_VAR, value: extra-value}]
      interactiveMode: Never`,
    ),
  );
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
  try {
    assert.deepEqual((await client.list("/api/v1/services")).items, []);
    await client.list("/api/v1/nodes");
    assert.equal(sim.stats.unauthorized, 0);
    const runs = await p.runs();
    assert.equal(runs.length, 1, "no expiry: the credential is kept");
    assert.equal(runs[0].args, "get-token --cluster c1");
    assert.equal(runs[0].extra, "extra-value");
    assert.equal(runs[0].inherited, "from-parent", "the plugin inherits the agent's environment");
    assert.deepEqual(runs[0].info, { kind: "ExecCredential", apiVersion: V1, spec: { interactive: false } });

    // The server stops accepting the token: a 401 runs the plugin again and the request is retried.
    await Deno.writeTextFile(`${p.dir}/token`, "tok-2");
    sim.token = "tok-2";
    await client.list("/api/v1/services");
    assert.equal((await p.runs()).length, 2);
    assert.equal(sim.stats.unauthorized, 1);
  } finally {
    Deno.env.delete("DKP_INHERITED");
    client.close();
    await sim.close();
  }
});

Deno.test("exec plugin (v1beta1): the credential is cached until expirationTimestamp, then the plugin runs again", async () => {
  const sim = await ApiServerSimulator.start({ token: "t" });
  // A fixed expiry and a fake clock: no window of real time the test has to hit.
  const exp = "2030-01-01T00:00:00Z";
  const p = await makePlugin(
    `echo "{\\"apiVersion\\":\\"${V1BETA1}\\",\\"kind\\":\\"ExecCredential\\",\\"status\\":{\\"token\\":\\"t\\",\\"expirationTimestamp\\":\\"${exp}\\"}}"`,
  );
  const kc = `${p.dir}/kc.yaml`;
  // v1beta1 may leave interactiveMode out (IfAvailable).
  await Deno.writeTextFile(
    kc,
    kubeconfig(sim.url, `      apiVersion: ${V1BETA1}\n      command: ${p.plugin}`),
  );
  let now = Date.parse(exp) - 60_000;
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined, exec: { now: () => now } }, {
    qps: 0,
  });
  try {
    await client.list("/api/v1/services");
    now = Date.parse(exp); // still valid at the expiry instant itself (client-go: expired only after it)
    await client.list("/api/v1/services");
    assert.equal((await p.runs()).length, 1, "cached while valid");
    now = Date.parse(exp) + 1000;
    await client.list("/api/v1/services");
    assert.equal((await p.runs()).length, 2, "run again after expiry");
    assert.equal((await p.runs())[0].info.apiVersion, V1BETA1);
  } finally {
    client.close();
    await sim.close();
  }
});

Deno.test("exec plugin: a plugin that hangs is killed after the time limit and the request fails", async () => {
  const sim = await ApiServerSimulator.start({ token: "t" });
  const p = await makePlugin(`echo $$ > "${"$"}(dirname "$0")/pid"; exec sleep 600`);
  const kc = `${p.dir}/kc.yaml`;
  await Deno.writeTextFile(
    kc,
    kubeconfig(sim.url, `      apiVersion: ${V1}\n      interactiveMode: Never\n      command: ${p.plugin}`),
  );
  // 300 ms: the limit under test, far below the 600 s the plugin would take.
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined, exec: { timeoutMs: 300 } }, {
    qps: 0,
  });
  try {
    await assert.rejects(client.list("/api/v1/services"), /did not finish within 0.3s; killed/);
    const pid = (await Deno.readTextFile(`${p.dir}/pid`)).trim();
    // Waits for the condition (the killed process gone), up to 5 s.
    const deadline = Date.now() + 5000;
    while (await Deno.stat(`/proc/${pid}`).then(() => true, () => false)) {
      assert.ok(Date.now() < deadline, `the plugin process ${pid} is still running`);
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    client.close();
    await sim.close();
  }
});

Deno.test("exec plugin: a client certificate from the plugin authenticates over mTLS; provideClusterInfo passes the cluster", async () => {
  const pki = await makeTestPki();
  const sim = await ApiServerSimulator.start({
    tls: { cert: pki.serverCert, key: pki.serverKey },
    clientCA: pki.caCert,
  });
  const json = JSON.stringify({
    apiVersion: V1,
    kind: "ExecCredential",
    status: { clientCertificateData: pki.clientCert, clientKeyData: pki.clientKeyPkcs8 },
  });
  await Deno.writeTextFile(`${pki.dir}/cred.json`, json);
  const p = await makePlugin(`cat "${pki.dir}/cred.json"`);
  const kc = `${p.dir}/kc.yaml`;
  await Deno.writeTextFile(
    kc,
    kubeconfig(
      sim.url,
      `      apiVersion: ${V1}
      command: ${p.plugin}
      interactiveMode: IfAvailable
      provideClusterInfo: true`,
      `, certificate-authority: ${pki.paths.caCert}, extensions: [{name: client.authentication.k8s.io/exec, extension: {audience: kube}}]`,
    ),
  );
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
  try {
    await client.list("/api/v1/services");
    assert.ok(sim.stats.clientCNs.has("system:kube-proxy"), [...sim.stats.clientCNs].join());
    const [run] = await p.runs();
    const spec = run.info.spec as { cluster: Record<string, unknown> };
    assert.equal(spec.cluster.server, sim.url);
    assert.equal(atob(spec.cluster["certificate-authority-data"] as string), pki.caCert);
    assert.deepEqual(spec.cluster.config, { audience: "kube" });
  } finally {
    client.close();
    await sim.close();
  }
});

Deno.test("exec plugin: failures carry client-go's messages", async (t) => {
  const sim = await ApiServerSimulator.start({ token: "t" });
  const cases: { name: string; credential: string; exec?: string; want: RegExp }[] = [
    { name: "exit code", credential: "exit 3", want: /exec: executable .*cred\.sh failed with exit code 3/ },
    { name: "not JSON", credential: "echo nope", want: /decoding stdout/ },
    {
      name: "other version",
      credential: `echo '{"apiVersion":"${V1BETA1}","kind":"ExecCredential","status":{"token":"t"}}'`,
      want:
        /configured to use API version client.authentication.k8s.io\/v1, plugin returned version .*v1beta1/,
    },
    {
      name: "no status",
      credential: `echo '{"apiVersion":"${V1}","kind":"ExecCredential"}'`,
      want: /didn't return a status field/,
    },
    {
      name: "certificate without key",
      credential:
        `echo '{"apiVersion":"${V1}","kind":"ExecCredential","status":{"clientCertificateData":"x"}}'`,
      want: /returned only certificate or key, not both/,
    },
    {
      name: "missing program",
      credential: "",
      exec: `      apiVersion: ${V1}\n      command: /nonexistent/plugin\n      interactiveMode: Never\n` +
        `      installHint: "install it with: apt-get install plugin"`,
      want: /exec: executable \/nonexistent\/plugin not found[\s\S]*install it with/,
    },
  ];
  try {
    for (const c of cases) {
      await t.step(c.name, async () => {
        const p = await makePlugin(c.credential);
        const kc = `${p.dir}/kc.yaml`;
        await Deno.writeTextFile(
          kc,
          kubeconfig(
            sim.url,
            c.exec ?? `      apiVersion: ${V1}\n      command: ${p.plugin}\n      interactiveMode: Never`,
          ),
        );
        const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
        try {
          await assert.rejects(() => client.list("/api/v1/services"), (e: Error) => {
            assert.ok(e instanceof ExecPluginError, e.name);
            assert.match(e.message, c.want);
            return true;
          });
        } finally {
          client.close();
        }
      });
    }
  } finally {
    await sim.close();
  }
});

Deno.test("kubeconfig: exec and auth-provider users are validated as clientcmd and upstream kube-proxy do", async (t) => {
  const dir = await Deno.makeTempDir();
  const cases: { name: string; server?: string; user: string; want: RegExp }[] = [
    {
      name: "v1 without interactiveMode",
      user: `    exec: {apiVersion: ${V1}, command: /bin/true}`,
      want: /interactiveMode must be specified for u to use exec authentication plugin/,
    },
    {
      name: "unknown apiVersion",
      user: `    exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: /bin/true}`,
      want: /exec plugin: invalid apiVersion "client.authentication.k8s.io\/v1alpha1"/,
    },
    {
      name: "no command",
      user: `    exec: {apiVersion: ${V1}, interactiveMode: Never}`,
      want: /command must be specified for u/,
    },
    {
      name: "exec and auth-provider",
      user:
        `    exec: {apiVersion: ${V1}, command: /bin/true, interactiveMode: Never}\n    auth-provider: {name: oidc}`,
      want: /authProvider cannot be provided in combination with an exec plugin/,
    },
    {
      // Upstream kube-proxy v1.35 registers no auth-provider plugin: it exits with this message.
      name: "auth-provider over https",
      server: "https://127.0.0.1:6443",
      user: `    auth-provider: {name: oidc, config: {id-token: abc}}`,
      want: /^no Auth Provider found for name "oidc"/,
    },
  ];
  for (const c of cases) {
    await t.step(c.name, async () => {
      const kc = `${dir}/${c.name.replaceAll(" ", "-")}.yaml`;
      await Deno.writeTextFile(
        kc,
        `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "${c.server ?? "http://127.0.0.1:6443"}"}}]
users:
- name: u
  user:
${c.user}
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
      );
      await assert.rejects(() => loadRestConfig({ kubeconfig: kc, env: () => undefined }), (e: Error) => {
        assert.ok(e instanceof KubeConfigError);
        assert.match(e.message, c.want);
        return true;
      });
    });
  }
});

Deno.test("exec credential: a 401 re-runs the plugin only once for concurrent requests that used the same credential", async () => {
  let runs = 0;
  const a = new ExecAuthenticator(
    {
      command: "p",
      args: [],
      env: [],
      apiVersion: V1,
      interactiveMode: "Never",
      provideClusterInfo: false,
    },
    { server: "https://x" },
    {
      run: async () => {
        runs++;
        await new Promise((r) => setTimeout(r, 5));
        return {
          code: 0,
          stdout: JSON.stringify({ apiVersion: V1, kind: "ExecCredential", status: { token: `t${runs}` } }),
        };
      },
    },
  );
  const first = await a.get();
  assert.equal(first.token, "t1");
  const [x, y] = await Promise.all([a.refreshAfterUnauthorized(first), a.refreshAfterUnauthorized(first)]);
  assert.equal(x.token, "t2");
  assert.equal(y, x);
  assert.equal(runs, 2);
  // A 401 for a credential already replaced does not run the plugin.
  assert.equal((await a.refreshAfterUnauthorized(first)).token, "t2");
  assert.equal(runs, 2);
  assert.throws(() => parseExecCredential("{}", V1), /Kind' or 'apiVersion' is missing/);
});
