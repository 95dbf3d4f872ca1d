/**
 * LocalhostNodePortProxy on the host's own loopback (no root): a listener per TCP NodePort with endpoints,
 * connections copied both ways to a random endpoint, ClientIP affinity pinning one endpoint, listeners closed
 * when their NodePort has no endpoints left.
 */
import assert from "node:assert/strict";
import { LocalhostNodePortProxy } from "../../../lib/dataplane/nftables/localhost_nodeport_proxy.ts";
import { configureLogging, log } from "../../../lib/log.ts";

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
