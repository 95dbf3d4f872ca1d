/**
 * The protobuf watch decoder on hand-built frames: frames split anywhere across chunks or packed several to a
 * chunk, ERROR events with a Status, and what is not the API server's protobuf (unknown kind, no `k8s\0`
 * prefix, a stream cut mid-frame) failing as a malformed watch. The comparison with the real API server's
 * JSON is tests/kube/protobuf_real_apiserver_test.ts.
 * @module
 */
import assert from "node:assert/strict";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { decodeProtobufWatchStream, WatchDecodeError } from "../../lib/kube/client.ts";
import {
  decodeEndpointSlice,
  FrameSplitter,
  PROTOBUF_WATCH_ACCEPT,
  protobufWatchAccept,
} from "../../lib/kube/protobuf.ts";
import type { KubeObject, WatchEvent } from "../../lib/kube/types.ts";

const LD = WireType.LengthDelimited;

/** `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}. */
function envelope(apiVersion: string, kind: string, raw: Uint8Array, prefix = true): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, LD).fork().tag(1, LD).string(apiVersion).tag(2, LD).string(kind).join();
  w.tag(2, LD).bytes(raw);
  const body = w.finish();
  return prefix ? new Uint8Array([0x6b, 0x38, 0x73, 0x00, ...body]) : body;
}

/** A length-prefixed meta.v1.WatchEvent{type, object: RawExtension{raw}}. */
function frame(type: string, object: Uint8Array): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, LD).string(type);
  w.tag(2, LD).fork().tag(1, LD).bytes(object).join();
  const ev = w.finish();
  const out = new Uint8Array(4 + ev.length);
  new DataView(out.buffer).setUint32(0, ev.length);
  out.set(ev, 4);
  return out;
}

function sliceBytes(name: string, ip: string): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, LD).fork()
    .tag(1, LD).string(name)
    .tag(3, LD).string("ns")
    .tag(6, LD).string("42")
    .tag(7, WireType.Varint).int64(3)
    .tag(11, LD).fork().tag(1, LD).string("kubernetes.io/service-name").tag(2, LD).string("svc").join()
    .join();
  w.tag(2, LD).fork()
    .tag(1, LD).string(ip)
    .tag(2, LD).fork().tag(1, WireType.Varint).bool(false).join()
    .tag(5, LD).fork().tag(1, LD).string("k").tag(2, LD).string("v").join() // deprecatedTopology: skipped
    .tag(99, WireType.Varint).int32(7) // a field from a newer API: skipped
    .join();
  w.tag(3, LD).fork().tag(2, LD).string("TCP").tag(3, WireType.Varint).int32(8080).join();
  w.tag(4, LD).string("IPv4");
  return w.finish();
}

const SLICE = {
  apiVersion: "discovery.k8s.io/v1",
  kind: "EndpointSlice",
  metadata: {
    name: "a",
    namespace: "ns",
    resourceVersion: "42",
    generation: 3,
    labels: { "kubernetes.io/service-name": "svc" },
  },
  addressType: "IPv4",
  endpoints: [{ addresses: ["10.0.0.1"], conditions: { ready: false } }],
  ports: [{ protocol: "TCP", port: 8080 }],
};

function streamOf(chunks: Uint8Array[]): ReadableStreamDefaultReader<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    start(c) {
      for (const ch of chunks) c.enqueue(ch);
      c.close();
    },
  }).getReader();
}

async function decodeAll(chunks: Uint8Array[]): Promise<WatchEvent<KubeObject>[]> {
  const out: WatchEvent<KubeObject>[] = [];
  for await (const ev of decodeProtobufWatchStream<KubeObject>(streamOf(chunks))) out.push(ev);
  return out;
}

Deno.test("protobuf watch: an EndpointSlice event decodes to the JSON shape wherever the chunks split its frame", async () => {
  const f = frame("ADDED", envelope("discovery.k8s.io/v1", "EndpointSlice", sliceBytes("a", "10.0.0.1")));
  for (let cut = 0; cut <= f.length; cut++) {
    const evs = await decodeAll([f.slice(0, cut), f.slice(cut)]);
    assert.deepEqual(evs, [{ type: "ADDED", object: SLICE }], `split at ${cut}`);
  }
  // One byte per chunk.
  assert.equal((await decodeAll([...f].map((b) => new Uint8Array([b])))).length, 1);
});

Deno.test("protobuf watch: several frames in one chunk, and frames larger than the splitter's first buffer", async () => {
  const many = Array.from(
    { length: 50 },
    (_, i) =>
      frame("MODIFIED", envelope("discovery.k8s.io/v1", "EndpointSlice", sliceBytes(`s${i}`, "10.0.0.1"))),
  );
  const packed = new Uint8Array(many.reduce((n, f) => n + f.length, 0));
  let o = 0;
  for (const f of many) packed.set(f, (o += f.length) - f.length);
  const evs = await decodeAll([packed]);
  assert.deepEqual(evs.map((e) => e.object.metadata?.name), many.map((_, i) => `s${i}`));

  const big = frame(
    "ADDED",
    envelope("discovery.k8s.io/v1", "EndpointSlice", sliceBytes("x".repeat(200_000), "::1")),
  );
  const evs2 = await decodeAll([big.slice(0, 70_000), big.slice(70_000, 140_000), big.slice(140_000)]);
  assert.equal(evs2[0].object.metadata?.name?.length, 200_000);
});

Deno.test("protobuf watch: an ERROR event carries its Status (code, reason, message)", async () => {
  const w = new BinaryWriter();
  w.tag(2, LD).string("Failure").tag(3, LD).string("too old resource version: 1 (42)").tag(4, LD).string(
    "Expired",
  )
    .tag(6, WireType.Varint).int32(410);
  const evs = await decodeAll([frame("ERROR", envelope("v1", "Status", w.finish()))]);
  assert.deepEqual(evs, [{
    type: "ERROR",
    object: {
      apiVersion: "v1",
      kind: "Status",
      status: "Failure",
      message: "too old resource version: 1 (42)",
      reason: "Expired",
      code: 410,
    },
  }]);
});

Deno.test("protobuf watch: an unknown kind, a missing k8s prefix or a stream cut mid-frame is a malformed watch", async () => {
  const service = frame("ADDED", envelope("v1", "Service", new Uint8Array()));
  await assert.rejects(
    decodeAll([service]),
    (e) => e instanceof WatchDecodeError && /kind "Service"/.test(e.message),
  );
  const bare = frame(
    "ADDED",
    envelope("discovery.k8s.io/v1", "EndpointSlice", sliceBytes("a", "1.1.1.1"), false),
  );
  await assert.rejects(
    decodeAll([bare]),
    (e) => e instanceof WatchDecodeError && /k8s\\0 prefix/.test(e.message),
  );
  const f = frame("ADDED", envelope("discovery.k8s.io/v1", "EndpointSlice", sliceBytes("a", "1.1.1.1")));
  await assert.rejects(
    decodeAll([f.slice(0, 10)]),
    (e) => e instanceof WatchDecodeError && /unfinished frame/.test(e.message),
  );
  // A length prefix beyond any real object is a corrupt stream, not a reason to buffer gigabytes.
  await assert.rejects(decodeAll([new Uint8Array([0xff, 0xff, 0xff, 0xff, 1])]), WatchDecodeError);
});

Deno.test("protobuf: a wire type that does not match the field's is refused", () => {
  const w = new BinaryWriter();
  w.tag(4, WireType.Varint).int32(1); // addressType is a string
  assert.throws(() => decodeEndpointSlice(w.finish()), /wire type/);
});

Deno.test("FrameSplitter: frames come out whole and in order; pending counts the unfinished rest", () => {
  const s = new FrameSplitter();
  s.push(new Uint8Array([0, 0, 0, 2, 7, 8, 0, 0]));
  assert.deepEqual([...s.next()!], [7, 8]);
  assert.equal(s.next(), undefined);
  assert.equal(s.pending, 2);
  s.push(new Uint8Array([0, 1, 9]));
  assert.deepEqual([...s.next()!], [9]);
  assert.equal(s.pending, 0);
});

Deno.test("protobufWatchAccept: protobuf as client-go picks the type (acceptContentTypes, else contentType)", () => {
  assert.equal(
    protobufWatchAccept({ contentType: "application/vnd.kubernetes.protobuf" }),
    PROTOBUF_WATCH_ACCEPT,
  );
  assert.equal(protobufWatchAccept({ contentType: "application/json" }), undefined);
  assert.equal(
    protobufWatchAccept({
      acceptContentTypes: "application/json",
      contentType: "application/vnd.kubernetes.protobuf",
    }),
    undefined,
  );
  assert.equal(
    protobufWatchAccept({ acceptContentTypes: "application/vnd.kubernetes.protobuf,application/json" }),
    PROTOBUF_WATCH_ACCEPT,
  );
});
