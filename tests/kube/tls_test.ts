import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { makeTestPki, type TestPki } from "../../testkit/certs.ts";
import { createKubeClient, KubeClient } from "../../lib/kube/client.ts";
import { loadRestConfig } from "../../lib/kube/kubeconfig.ts";
import { newServiceInformer } from "../../lib/kube/informer.ts";
import { FAST, svc, waitFor } from "./helpers.ts";

let pkiPromise: Promise<TestPki> | undefined;
const pki = () => pkiPromise ??= makeTestPki();

for (
  const [label, certKey, keyKey, cn] of [
    ["PKCS#8", "clientCert", "clientKeyPkcs8", "system:kube-proxy"],
    ["SEC1", "clientCert", "clientKeySec1", "system:kube-proxy"],
    ["PKCS#1", "rsaClientCert", "rsaClientKeyPkcs1", "system:kube-proxy-rsa"],
  ] as const
) {
  Deno.test(`tls: mTLS with a ${label} client key syncs an informer`, async () => {
    const p = await pki();
    const sim = await ApiServerSimulator.start({
      tls: { cert: p.serverCert, key: p.serverKey },
      clientCA: p.caCert,
      bookmarkIntervalMs: 0,
    });
    sim.upsert("services", svc("ns", "a"));
    const kc = await sim.writeKubeconfig({
      caFile: p.paths.caCert,
      clientCertFile: p.paths[certKey],
      clientKeyFile: p.paths[keyKey],
    });
    const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
    const inf = newServiceInformer(client, FAST);
    inf.start();
    try {
      assert.equal(await inf.waitForSync(AbortSignal.timeout(5000)), true);
      assert.equal(inf.size, 1);
      assert.ok(sim.stats.clientCNs.has(cn), [...sim.stats.clientCNs].join());
      await waitFor(() => sim.openWatches() === 1, "watch over mTLS");
      sim.upsert("services", svc("ns", "b"));
      await waitFor(() => inf.size === 2, "watch event over mTLS");
    } finally {
      await inf.stop();
      client.close();
      await sim.close();
    }
  });
}

Deno.test("tls: certificate data fields, a missing client certificate is refused, wrong CA fails", async () => {
  const p = await pki();
  const sim = await ApiServerSimulator.start({
    tls: { cert: p.serverCert, key: p.serverKey },
    clientCA: p.caCert,
    bookmarkIntervalMs: 0,
  });
  const kc = await Deno.makeTempFile({ suffix: ".yaml" });
  await Deno.writeTextFile(
    kc,
    `apiVersion: v1
clusters: [{name: c, cluster: {server: "${sim.url}", certificate-authority-data: ${btoa(p.caCert)}}}]
users: [{name: u, user: {client-certificate-data: ${btoa(p.clientCert)}, client-key-data: ${
      btoa(p.clientKeySec1)
    }}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
  );
  const ok = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
  const noCert = new KubeClient({ server: sim.url, caPem: p.caCert, source: "test" }, { qps: 0 });
  const wrongCa = new KubeClient(
    { server: sim.url, caPem: p.serverCert, certPem: p.clientCert, keyPem: p.clientKeyPkcs8, source: "t" },
    { qps: 0 },
  );
  try {
    const list = await ok.list("/api/v1/nodes");
    assert.deepEqual(list.items, []);
    await assert.rejects(noCert.list("/api/v1/nodes"));
    await assert.rejects(wrongCa.list("/api/v1/nodes"));
  } finally {
    ok.close();
    noCert.close();
    wrongCa.close();
    await sim.close();
  }
});

Deno.test("tls: insecure-skip-tls-verify talks to a server whose CA we do not have", async () => {
  const p = await pki();
  const sim = await ApiServerSimulator.start({ tls: { cert: p.serverCert, key: p.serverKey }, token: "t" });
  sim.upsert("services", svc("ns", "a"));
  const client = new KubeClient(
    await loadRestConfig({
      kubeconfig: await sim.writeKubeconfig({ insecure: true }),
      env: () => undefined,
    }),
    { qps: 0 },
  );
  const inf = newServiceInformer(client, FAST);
  inf.start();
  try {
    assert.equal(await inf.waitForSync(AbortSignal.timeout(5000)), true);
    await waitFor(() => sim.openWatches() === 1, "watch");
    sim.upsert("services", svc("ns", "b"));
    await waitFor(() => inf.size === 2, "event over insecure TLS");
  } finally {
    await inf.stop();
    client.close();
    await sim.close();
  }
});

Deno.test("auth: a rotated token file is picked up", async () => {
  const sim = await ApiServerSimulator.start({ token: "one" });
  const tokenFile = await Deno.makeTempFile();
  await Deno.writeTextFile(tokenFile, "one\n");
  const cfg = await loadRestConfig({
    kubeconfig: await sim.writeKubeconfig({ tokenFile }),
    env: () => undefined,
  });
  const client = new KubeClient(cfg, { qps: 0, tokenRecheckMs: 60_000 });
  sim.upsert("services", svc("ns", "a"));
  const inf = newServiceInformer(client, FAST);
  inf.start();
  try {
    await inf.waitForSync();
    await waitFor(() => sim.openWatches() === 1, "watch");
    // An event on the watch, so that its end is not a "very short watch" (answered with a list).
    sim.upsert("services", svc("ns", "a", "10.96.0.77"));
    await waitFor(() => inf.get("ns/a")?.spec?.clusterIP === "10.96.0.77", "event");
    // rotate: the server only accepts the new token; the file changes; the stream drops
    sim.token = "two";
    await Deno.writeTextFile(tokenFile, "two\n");
    sim.faults.dropWatches();
    sim.upsert("services", svc("ns", "b"));
    await waitFor(() => inf.size === 2, "event with the rotated token");
    assert.equal(sim.stats.lists("services"), 1);
  } finally {
    await inf.stop();
    client.close();
    await sim.close();
  }
});
