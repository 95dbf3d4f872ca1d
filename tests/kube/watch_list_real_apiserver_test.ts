/**
 * The reflector's watch-list path against the real kube-apiserver v1.37.2 of the test kit: with its WatchList
 * gate on (the default) the initial state comes from a watch-list stream and no LIST is made; with
 * `--feature-gates=WatchList=false` the API server rejects the stream and the reflector falls back to one LIST
 * then a WATCH, as client-go does. Both then follow live changes. The watch-list stream is gzip-compressed by
 * the API server (one member per flush) and read to its end.
 * @module
 */
import assert from "node:assert/strict";
import { KubeApiServer, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { KubeClient } from "../../lib/kube/client.ts";
import { newServiceInformer } from "../../lib/kube/informer.ts";
import type { KubeObject } from "../../lib/kube/types.ts";
import { waitFor } from "./helpers.ts";

const ignore = kubeApiServerUnavailableReason() !== undefined;

function service(name: string): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name, namespace: "default" },
    spec: { ports: [{ name: "http", port: 80, protocol: "TCP", targetPort: 8080 }] },
  } as KubeObject;
}

for (const watchList of [true, false]) {
  Deno.test({
    name: watchList
      ? "watch-list on kube-apiserver: initial state streamed (sendInitialEvents), no LIST, live events follow"
      : "watch-list on kube-apiserver with WatchList=false: one LIST then WATCH (client-go's fallback), live events follow",
    ignore,
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      await using api = await KubeApiServer.start({
        extraArgs: watchList ? [] : ["--feature-gates=WatchList=false"],
      });
      for (const n of ["a", "b", "c"]) await api.create(service(n));
      // default/kubernetes is created by the API server itself, a moment after it is ready (later on a busy host).
      for (
        let i = 0;
        (await api.list({ apiVersion: "v1", kind: "Service", namespace: "default" })).length < 4;
        i++
      ) {
        if (i === 300) throw new Error("default/kubernetes did not appear in 30 s");
        await new Promise((r) => setTimeout(r, 100));
      }
      const client = new KubeClient({
        server: api.localUrl,
        caPem: api.caPem,
        certPem: await Deno.readTextFile(`${api.dir}/admin.crt`),
        keyPem: await Deno.readTextFile(`${api.dir}/admin.key`),
        source: "test",
      }, { qps: 0 });
      const inf = newServiceInformer(client, { useWatchList: true, minWatchTimeoutSeconds: 60 });
      inf.start();
      try {
        await waitFor(() => inf.hasSynced(), "synced", 30_000);
        // default/kubernetes and the three created.
        assert.equal(inf.list().length, 4);
        const c = inf.reflector.counts;
        assert.equal(c.watchLists, 1, "one watch-list attempt");
        assert.equal(
          c.lists,
          watchList ? 0 : 1,
          watchList ? "no LIST" : "one LIST after the rejected stream",
        );
        // kube-apiserver v1.37 gzips a watch-list stream (WatchListCompression) and the client reads it so.
        assert.equal(c.gzipWatchLists, watchList ? 1 : 0, "watch-list answered gzip-compressed");
        await api.create(service("late"));
        await waitFor(() => inf.list().length === 5, "live event", 30_000);
        // The live event came on the stream opened first (another gzip member of its body, for watch-list):
        // the stream did not end after its first member, as it does when Deno's fetch reads it.
        // (With WatchList=false: the rejected stream, then the WATCH after the LIST.)
        assert.equal(c.watches, watchList ? 1 : 2, "no further watch");
        assert.equal(c.events, watchList ? 5 : 1, "events: the initial ones streamed, then the live one");
      } finally {
        await inf.stop();
        client.close();
      }
    },
  });
}
