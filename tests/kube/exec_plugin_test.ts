import assert from "node:assert/strict";
import { ApiServerSimulator } from "../../testkit/apiserver.ts";
import { createKubeClient } from "../../lib/kube/client.ts";
import "./helpers.ts";

Deno.test("kubeconfig: an exec credential plugin is handled through client-node, loaded lazily", async () => {
  const sim = await ApiServerSimulator.start({ token: "from-exec" });
  const dir = await Deno.makeTempDir();
  const plugin = `${dir}/cred.sh`;
  await Deno.writeTextFile(
    plugin,
    `#!/bin/sh\necho '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"from-exec"}}'\n`,
  );
  await Deno.chmod(plugin, 0o755);
  const kc = `${dir}/kc.yaml`;
  await Deno.writeTextFile(
    kc,
    `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "${sim.url}"}}]
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ${plugin}
      interactiveMode: Never
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
  );
  const client = await createKubeClient({ kubeconfig: kc, env: () => undefined }, { qps: 0 });
  try {
    const list = await client.list("/api/v1/services");
    assert.deepEqual(list.items, []);
    assert.equal(sim.stats.unauthorized, 0);
  } finally {
    client.close();
    await sim.close();
  }
});
