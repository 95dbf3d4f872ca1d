/**
 * LocalhostNodePortProxy on the host's own loopback (no root): a listener per TCP NodePort with endpoints,
 * connections copied both ways to a random endpoint, ClientIP affinity pinning one endpoint, listeners closed
 * when their NodePort has no endpoints left.
 */
import assert from "node:assert/strict";
import { LocalhostNodePortProxy } from "../../../lib/dataplane/nftables/localhost_nodeport_proxy.ts";
import { configureLogging, log } from "../../../lib/log.ts";
import {
  localhostNodePortListenerCreationFailuresTotal,
  localhostNodePortListeners,
} from "../../../lib/metrics.ts";

configureLogging({ sink: () => {} });

/** A backend on an ephemeral loopback port answering each connection with its name and an echo of one line. */
function backend(name: string): { port: number; close: () => void } {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  (async () => {
    for await (const c of l) {
      (async () => {
        const buf = new Uint8Array(64);
        const n = await c.read(buf);
        await c.write(
          new TextEncoder().encode(`${name} ${new TextDecoder().decode(buf.subarray(0, n ?? 0))}`),
        );
        c.close();
      })().catch(() => {});
    }
  })().catch(() => {});
  return { port: (l.addr as Deno.NetAddr).port, close: () => l.close() };
}

/** A free loopback port (listened on and released). */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** One request through `port`: the answer, or the error's name. */
async function ask(port: number): Promise<string> {
  try {
    const c = await Deno.connect({ hostname: "127.0.0.1", port });
    await c.write(new TextEncoder().encode("hi"));
    await c.closeWrite();
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(64);
    for (let n = await c.read(buf); n !== null; n = await c.read(buf)) chunks.push(buf.slice(0, n));
    c.close();
    return chunks.map((x) => new TextDecoder().decode(x)).join("");
  } catch (err) {
    return (err as Error).name;
  }
}

Deno.test("localhost NodePort listeners: random endpoint, affinity pins one, no endpoints closes the listener", async () => {
  const [a, b] = [backend("a"), backend("b")];
  const proxy = new LocalhostNodePortProxy("IPv4", log);
  const port = freePort();
  const eps = [{ ip: "127.0.0.1", port: a.port }, { ip: "127.0.0.1", port: b.port }];
  try {
    proxy.sync([{ name: "ns/np:p", nodePort: port, endpoints: eps, affinitySeconds: 0 }]);
    assert.deepEqual(proxy.ports, [port]);
    const seen = new Set<string>();
    for (let i = 0; i < 40; i++) seen.add(await ask(port));
    assert.deepEqual([...seen].sort(), ["a hi", "b hi"], "both endpoints, the request copied through");
    proxy.sync([{ name: "ns/np:p", nodePort: port, endpoints: eps, affinitySeconds: 60 }]);
    const pinned = new Set<string>();
    for (let i = 0; i < 20; i++) pinned.add(await ask(port));
    assert.equal(pinned.size, 1, [...pinned].join(","));
    proxy.sync([{ name: "ns/np:p", nodePort: port, endpoints: [], affinitySeconds: 0 }]);
    assert.deepEqual(proxy.ports, []);
    // Deno releases the socket once its pending accept is cancelled: refused within a second (bound of that).
    let last = "";
    for (let i = 0; i < 20 && last !== "ConnectionRefused"; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 50));
      last = await ask(port);
    }
    assert.equal(last, "ConnectionRefused");
  } finally {
    proxy.shutdown();
    a.close();
    b.close();
  }
});

/** The IPv4 value of a family-labelled metric (0 when it has no IPv4 sample yet). */
async function ipv4Value(
  m: typeof localhostNodePortListeners | typeof localhostNodePortListenerCreationFailuresTotal,
) {
  return (await m.get()).values.find((v) => v.labels.ip_family === "IPv4")?.value ?? 0;
}

Deno.test("localhost NodePort listeners: the gauge counts active listeners, a port that cannot be bound counts a failure", async () => {
  const a = backend("a");
  // Something else holds this port on 127.0.0.1: the proxy cannot bind it.
  const taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const takenPort = (taken.addr as Deno.NetAddr).port;
  const [p1, p2] = [freePort(), freePort()];
  const proxy = new LocalhostNodePortProxy("IPv4", log);
  const eps = [{ ip: "127.0.0.1", port: a.port }];
  const spec = (nodePort: number, endpoints = eps) => ({
    name: `ns/np${nodePort}:p`,
    nodePort,
    endpoints,
    affinitySeconds: 0,
  });
  const failuresBefore = await ipv4Value(localhostNodePortListenerCreationFailuresTotal);
  try {
    proxy.sync([spec(p1), spec(p2), spec(takenPort), spec(freePort(), [])]);
    assert.deepEqual(proxy.ports, [p1, p2].sort((x, y) => x - y));
    assert.equal(
      await ipv4Value(localhostNodePortListeners),
      2,
      "two bound; none for the taken port or no endpoints",
    );
    assert.equal(await ipv4Value(localhostNodePortListenerCreationFailuresTotal), failuresBefore + 1);
    // Retried (and failing again) at the next sync; one listener gone.
    proxy.sync([spec(p1), spec(takenPort)]);
    assert.equal(await ipv4Value(localhostNodePortListeners), 1);
    assert.equal(await ipv4Value(localhostNodePortListenerCreationFailuresTotal), failuresBefore + 2);
    proxy.shutdown();
    assert.equal(await ipv4Value(localhostNodePortListeners), 0);
  } finally {
    proxy.shutdown();
    taken.close();
    a.close();
  }
});
