/** The z-pages without sockets: gates, text layout, negotiation (the shapes are pinned against upstream's
 * binary by tests/packets/zpages_parity_test.ts). */
import assert from "node:assert/strict";
import { ZPages } from "../../lib/server/zpages.ts";
import { MetricsServer } from "../../lib/server/metrics_server.ts";
import { configzObject } from "../../lib/config/load.ts";
import { defaultConfiguration } from "../../lib/config/defaults.ts";

const req = (path: string, accept?: string) =>
  new Request(`http://127.0.0.1:10249${path}`, { headers: accept ? { accept } : {} });

Deno.test("z-pages: a page whose gate is off is not served; flagz and statusz text as upstream lays them out", async () => {
  const start = new Date(Date.UTC(2026, 11, 4, 17, 0, 0));
  const z = new ZPages({
    configz: { apiVersion: "kubeproxy.config.k8s.io/v1alpha1", kind: "KubeProxyConfiguration" },
    flagz: { "v": "2", "bind-address": "0.0.0.0" },
    statusz: {
      startTime: start,
      runtimeVersion: "deno 2.9.6",
      binaryVersion: "1.37.2-deno-kube-proxy-0.1.0",
      emulationVersion: "1.37",
      paths: ["/configz", "/metrics/slis", "/metrics", "/api/v1"],
    },
    delimiter: 2,
    now: () => new Date(start.getTime() + 3723_000),
  });
  assert.equal(
    await z.handle(req("/flagz"))!.text(),
    "\nkube-proxy flagz\nWarning: This endpoint is not meant to be machine parseable, has no formatting " +
      "compatibility guarantees and is for debugging purposes only.\nbind-address=0.0.0.0\nv=2\n",
  );
  const statusz = await z.handle(req("/statusz"))!.text();
  assert.ok(
    statusz.endsWith(
      "\nStarted= Fri Dec  4 17:00:00 UTC 2026\nUp= 1 hr 02 min 03 sec\nGo version= deno 2.9.6\n" +
        "Binary version= 1.37.2-deno-kube-proxy-0.1.0\nEmulation version= 1.37\nPaths= /configz /metrics\n",
    ),
    statusz,
  );
  const json = z.handle(req("/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"))!;
  assert.equal(json.headers.get("content-type"), "application/json;g=config.k8s.io;v=v1beta1;as=Statusz");
  assert.equal((await json.json()).uptimeSeconds, 3723);
  assert.equal(z.handle(req("/statusz", "application/json"))!.status, 406);
  assert.equal(z.handle(req("/other")), undefined);

  const off = new MetricsServer({ bindAddress: "127.0.0.1:0", mode: "iptables", zpages: new ZPages({}) });
  for (const p of ["/statusz", "/flagz", "/configz"]) assert.equal((await off.handle(req(p))).status, 404, p);
});

Deno.test("configz: the running mode's block holds the sync periods and masqueradeAll, the others 0s and false", () => {
  const c = defaultConfiguration();
  c.mode = "nftables";
  c.nftables.masqueradeAll = true;
  c.iptables.masqueradeAll = true;
  const o = configzObject(c) as Record<string, Record<string, unknown>> & { nodePortAddresses: string[] };
  assert.equal(o.mode as unknown, "nftables");
  assert.deepEqual(o.nodePortAddresses, ["primary"]);
  assert.equal(o.nftables.masqueradeAll, true);
  assert.equal(o.iptables.masqueradeAll, false);
  assert.equal(o.iptables.syncPeriod, "0s");
  assert.equal(o.ipvs.minSyncPeriod, "0s");
  assert.notEqual(o.nftables.syncPeriod, "0s");
  assert.equal(o.detectLocalMode as unknown, "ClusterCIDR");
});
