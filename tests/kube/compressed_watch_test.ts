/**
 * Compressed watches (WatchOptions.compressed): a body of several gzip members, each sent only after the
 * client has decoded the previous one (as kube-apiserver v1.37 flushes a watch-list stream), is read to its
 * end, event by event; a body that does not inflate is a decode error, not a hang; and the client knows where
 * node:http(s) cannot carry the request (a proxy, no CA given), where the watch is asked uncompressed.
 * @module
 */
import assert from "node:assert/strict";
import zlib from "node:zlib";
import { KubeClient, WatchDecodeError } from "../../lib/kube/client.ts";
import type { KubeObject, WatchEvent } from "../../lib/kube/types.ts";

const enc = new TextEncoder();

function chunk(data: Uint8Array): Uint8Array {
  const head = enc.encode(data.length.toString(16) + "\r\n");
  const out = new Uint8Array(head.length + data.length + 2);
  out.set(head);
  out.set(data, head.length);
  out.set(enc.encode("\r\n"), head.length + data.length);
  return out;
}

function eventLine(name: string): string {
  return JSON.stringify({ type: "ADDED", object: { metadata: { name, resourceVersion: "1" } } }) + "\n";
}

/**
 * A one-connection HTTP/1.1 server answering a watch with `parts` as chunks of a gzip body; part i+1 is sent
 * only once `gate(i)` resolves. Resolves with the request's headers.
 */
function serveOnce(
  parts: Uint8Array[],
  gate: (i: number) => Promise<void>,
): { url: string; request: Promise<string> } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const request = (async () => {
    const conn = await listener.accept();
    listener.close();
    const buf = new Uint8Array(16 * 1024);
    let head = "";
    while (!head.includes("\r\n\r\n")) {
      const n = await conn.read(buf);
      if (n === null) break;
      head += new TextDecoder().decode(buf.subarray(0, n));
    }
    await conn.write(enc.encode(
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n" +
        "Transfer-Encoding: chunked\r\n\r\n",
    ));
    for (let i = 0; i < parts.length; i++) {
      if (i > 0) await gate(i - 1);
      await conn.write(chunk(parts[i]));
    }
    await conn.write(enc.encode("0\r\n\r\n"));
    conn.close();
    return head;
  })();
  return { url: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`, request };
}

function client(url: string): KubeClient {
  return new KubeClient({ server: url, source: "test" }, { qps: 0 });
}

Deno.test("compressed watch: a body of gzip members is read member by member, each event before the next flush", async () => {
  const names = ["a", "b", "c"];
  const parts = names.map((n) => new Uint8Array(zlib.gzipSync(enc.encode(eventLine(n)))));
  const decoded: ((v: void) => void)[] = [];
  const seen = names.map(() => new Promise<void>((r) => decoded.push(r)));
  const srv = serveOnce(parts, (i) => seen[i]);
  const c = client(srv.url);
  const got: string[] = [];
  let encoding = "";
  try {
    for await (
      const ev of c.watch<KubeObject>("/api/v1/services", {}, undefined, {
        compressed: true,
        onOpen: (o) => encoding = o.encoding,
      }) as AsyncGenerator<WatchEvent<KubeObject>>
    ) {
      got.push(ev.object.metadata!.name!);
      decoded[got.length - 1]();
    }
  } finally {
    c.close();
  }
  const head = (await srv.request).toLowerCase();
  assert.match(head, /accept-encoding: gzip/);
  assert.equal(encoding, "gzip");
  assert.deepEqual(got, names);
});

for (
  const [what, body] of [
    ["corrupt", new Uint8Array([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])],
    ["truncated", new Uint8Array(zlib.gzipSync(enc.encode(eventLine("a")))).subarray(0, 20)],
  ] as const
) {
  Deno.test(`compressed watch: a ${what} gzip body ends the watch with a decode error`, async () => {
    const srv = serveOnce([body], () => Promise.resolve());
    const c = client(srv.url);
    try {
      await assert.rejects(async () => {
        for await (const _ of c.watch("/api/v1/services", {}, undefined, { compressed: true })) { /* none */ }
      }, (e) => e instanceof WatchDecodeError && /gzip/.test(e.message));
    } finally {
      c.close();
      await srv.request;
    }
  });
}

Deno.test("compressed watch: only where node:http(s) can carry it (no proxy; a CA given or verification off)", () => {
  const cases: [string, ConstructorParameters<typeof KubeClient>[0], boolean][] = [
    ["plain http", { server: "http://127.0.0.1:1", source: "t" }, true],
    ["https with the CA", { server: "https://127.0.0.1:1", caPem: "x", source: "t" }, true],
    ["https, insecure", { server: "https://127.0.0.1:1", insecure: true, source: "t" }, true],
    ["https, system roots", { server: "https://127.0.0.1:1", source: "t" }, false],
    ["a proxy", { server: "http://127.0.0.1:1", proxyUrl: "http://127.0.0.1:2", source: "t" }, false],
  ];
  for (const [what, cfg, want] of cases) {
    // An exec identity: the connection pool is built at the first request, not here (the CA is no PEM).
    const c = new KubeClient({ ...cfg, exec: { get: () => Promise.resolve({}) } } as never, { qps: 0 });
    assert.equal(c.readsCompressedWatches, want, what);
    c.close();
  }
});
