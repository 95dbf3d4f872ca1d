import assert from "node:assert/strict";
import { KubeConfigError, loadRestConfig, redactURL } from "../../lib/kube/kubeconfig.ts";
import { createKubeClient } from "../../lib/kube/client.ts";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { svc } from "./helpers.ts";

const noEnv = () => undefined;

async function write(text: string): Promise<string> {
  const p = await Deno.makeTempFile({ suffix: ".yaml" });
  await Deno.writeTextFile(p, text);
  return p;
}

function config(opts: { cluster?: string; user?: string; context?: string; current?: string } = {}): string {
  return `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
${opts.cluster ?? "    server: https://10.0.0.1:6443"}
users:
- name: u
  user:
${opts.user ?? "    token: abc"}
contexts:
- name: x
  context:
${opts.context ?? "    cluster: c\n    user: u"}
${opts.current ?? "current-context: x"}
`;
}

async function rejects(p: Promise<unknown>, re: RegExp): Promise<void> {
  await assert.rejects(p, (e: unknown) => {
    assert.ok(e instanceof KubeConfigError, `not a KubeConfigError: ${e}`);
    assert.match(e.message, re);
    return true;
  });
}

Deno.test("kubeconfig: server, token, --master override and KUBECONFIG", async () => {
  const p = await write(config());
  const c = await loadRestConfig({ kubeconfig: p, env: noEnv });
  assert.equal(c.server, "https://10.0.0.1:6443");
  assert.equal(c.token, "abc");
  const m = await loadRestConfig({ kubeconfig: p, master: "https://1.2.3.4:443/", env: noEnv });
  assert.equal(m.server, "https://1.2.3.4:443");
  const e = await loadRestConfig({ env: (k) => k === "KUBECONFIG" ? `${p}:/nonexistent` : undefined });
  assert.equal(e.source, p);
  const only = await loadRestConfig({ master: "http://127.0.0.1:8080", env: noEnv });
  assert.equal(only.server, "http://127.0.0.1:8080");
});

Deno.test("kubeconfig: each problem gives one clear KubeConfigError", async () => {
  await rejects(
    loadRestConfig({ kubeconfig: "/nonexistent/kc", env: noEnv }),
    /\/nonexistent\/kc could not be read/,
  );
  await rejects(
    loadRestConfig({ kubeconfig: await write(config({ current: "" })), env: noEnv }),
    /has no current-context/,
  );
  await rejects(
    loadRestConfig({ kubeconfig: await write(config({ current: "current-context: nope" })), env: noEnv }),
    /context "nope" \(current-context\) was not found/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(config({ context: "    cluster: missing\n    user: u" })),
      env: noEnv,
    }),
    /cluster "missing" of context "x" was not found/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(config({ context: "    cluster: c\n    user: ghost" })),
      env: noEnv,
    }),
    /user "ghost" of context "x" was not found/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(config({ cluster: "    insecure-skip-tls-verify: true" })),
      env: noEnv,
    }),
    /no server found for cluster "c"/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(
        config({ user: "    client-certificate: /nonexistent/c.crt\n    client-key: /x.key" }),
      ),
      env: noEnv,
    }),
    /unable to read client-certificate of user "u".*\/nonexistent\/c\.crt: no such file or directory/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(
        config({ cluster: `    server: https://a\n    certificate-authority-data: ${btoa("junk")}` }),
      ),
      env: noEnv,
    }),
    /certificate-authority of cluster "c".* does not contain a PEM certificate/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(
        config({
          cluster:
            `    server: https://a\n    insecure-skip-tls-verify: true\n    certificate-authority-data: ${
              btoa("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
            }`,
        }),
      ),
      env: noEnv,
    }),
    /root certificates file with the insecure flag is not allowed/,
  );
  await rejects(
    loadRestConfig({
      kubeconfig: await write(config({ user: "    tokenFile: /nonexistent/token" })),
      env: noEnv,
    }),
    /tokenFile \/nonexistent\/token .*could not be read/,
  );
  await rejects(
    loadRestConfig({ env: noEnv }),
    /KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined/,
  );
});

Deno.test("kubeconfig: in-cluster service account (token file, CA, IPv6 host)", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/token`, "tok\n");
  await Deno.writeTextFile(`${dir}/ca.crt`, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  const env = (k: string) => ({ KUBERNETES_SERVICE_HOST: "fd00::1", KUBERNETES_SERVICE_PORT: "443" })[k];
  const c = await loadRestConfig({ env, serviceAccountDir: dir });
  assert.equal(c.server, "https://[fd00::1]:443");
  assert.equal(c.tokenFile, `${dir}/token`);
  assert.match(c.caPem!, /BEGIN CERTIFICATE/);
  assert.equal(c.source, "in-cluster");
});

Deno.test("kubeconfig: relative certificate paths resolve against the kubeconfig's directory", async () => {
  const dir = await Deno.makeTempDir();
  await Deno.writeTextFile(`${dir}/ca.crt`, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  const p = `${dir}/kc.yaml`;
  await Deno.writeTextFile(
    p,
    config({ cluster: "    server: https://a:6443\n    certificate-authority: ca.crt" }),
  );
  const c = await loadRestConfig({ kubeconfig: p, env: noEnv });
  assert.match(c.caPem!, /BEGIN CERTIFICATE/);
});

Deno.test("kubeconfig: as/as-uid/as-groups/as-user-extra become client-go's Impersonate-* headers", async () => {
  const seen: Headers[] = [];
  const srv = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, (req) => {
    seen.push(req.headers);
    return Response.json({ kind: "List", items: [], metadata: { resourceVersion: "1" } });
  });
  const kc = await Deno.makeTempFile({ suffix: ".yaml" });
  await Deno.writeTextFile(
    kc,
    `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:${srv.addr.port}"}}]
users:
- name: u
  user:
    token: t
    as: alice
    as-uid: "1234"
    as-groups: [devs, ops]
    as-user-extra: {scopes: [view, edit]}
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
  );
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
  try {
    await client.list("/api/v1/services");
    const h = seen[0];
    assert.equal(h.get("authorization"), "Bearer t");
    assert.equal(h.get("impersonate-user"), "alice");
    assert.equal(h.get("impersonate-uid"), "1234");
    assert.equal(h.get("impersonate-group"), "devs, ops");
    assert.equal(h.get("impersonate-extra-scopes"), "view, edit");
  } finally {
    client.close();
    await srv.shutdown();
  }
});

Deno.test("kubeconfig: proxy-url sends requests through the proxy; tls-server-name and bad proxy schemes are refused", async () => {
  const sim = await ApiServerSimulator.start({ token: "t" });
  sim.upsert("services", svc("ns", "a"));
  // A minimal forward proxy for plain-http targets (absolute-form request targets).
  let proxied = 0;
  const proxy = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async (req) => {
    proxied++;
    const res = await fetch(req.url, { headers: req.headers });
    return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
  });
  const dir = await Deno.makeTempDir();
  const write = async (name: string, cluster: string) => {
    const p = `${dir}/${name}.yaml`;
    await Deno.writeTextFile(
      p,
      `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {${cluster}}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
    );
    return p;
  };
  try {
    const kc = await write("proxy", `server: "${sim.url}", proxy-url: "http://127.0.0.1:${proxy.addr.port}"`);
    const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
    try {
      const list = await client.list("/api/v1/services");
      assert.equal(list.items?.length, 1);
      assert.equal(proxied, 1, "the request went through the proxy");
    } finally {
      client.close();
    }
    const cases: [string, string, RegExp][] = [
      [
        "sni",
        `server: "https://10.0.0.1:6443", tls-server-name: api.example`,
        /tls-server-name .* is not supported/,
      ],
      [
        "ftp",
        `server: "${sim.url}", proxy-url: "ftp://p:21"`,
        /unsupported scheme "ftp", must be http, https, or socks5/,
      ],
    ];
    for (const [name, cluster, want] of cases) {
      const p = await write(name, cluster);
      await assert.rejects(() => loadRestConfig({ kubeconfig: p, env: () => undefined }), want);
    }
  } finally {
    await proxy.shutdown();
    await sim.close();
  }
});

Deno.test("redactURL() hides credentials in a server URL before it is logged", () => {
  assert.equal(redactURL("https://admin:s3cret@10.0.0.1:6443/x"), "https://redacted@10.0.0.1:6443/x");
  assert.equal(redactURL("https://token@api.example:443"), "https://redacted@api.example:443");
  assert.equal(redactURL("https://10.0.0.1:6443/a@b"), "https://10.0.0.1:6443/a@b");
  assert.equal(redactURL("not a url"), "not a url");
});
