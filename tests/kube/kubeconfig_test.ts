import assert from "node:assert/strict";
import { KubeConfigError, loadRestConfig } from "../../lib/kube/kubeconfig.ts";
import "./helpers.ts";

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
