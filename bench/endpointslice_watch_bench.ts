/**
 * EndpointSlice watch events in JSON and in protobuf: bytes per event and the agent's decode cost.
 *
 * `deno bench --allow-all bench/endpointslice_watch_bench.ts`: 20 000 MODIFIED events of 10-endpoint slices (as
 * an EndpointSlice controller writes them: owner reference, managedFields, targetRef, node, zone, the three
 * conditions) from an in-memory stream cut into 64 KiB chunks, through the client's own `decodeWatchStream`
 * (JSON lines) and `decodeProtobufWatchStream` (length-delimited frames). The protobuf frames are encoded here
 * with @bufbuild/protobuf's writer to the field numbers of k8s.io/api's generated.proto (what kube-apiserver
 * sends; tests/kube/protobuf_real_apiserver_test.ts checks the decoder against it). Prints bytes per event.
 * @module
 */
import { concatBytes } from "../lib/bytes.ts";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { decodeProtobufWatchStream, decodeWatchStream } from "../lib/kube/client.ts";

const EVENTS = 20_000;
const LD = WireType.LengthDelimited;
const VARINT = WireType.Varint;

interface Ep {
  ip: string;
  node: string;
  zone: string;
  pod: string;
  uid: string;
}

function endpoints(i: number): Ep[] {
  return Array.from({ length: 10 }, (_, k) => ({
    ip: `10.${(i >> 8) & 255}.${i & 255}.${k + 1}`,
    node: `node-${(i + k) % 500}`,
    zone: `zone-${k % 3}`,
    pod: `web-${i}-${k}-7d9f8c6b5-x${k}q2z`,
    uid: `5f0c${String(i).padStart(8, "0")}-${String(k).padStart(4, "0")}-4d5e-8f90-a1b2c3d4e5f6`,
  }));
}

const FIELDS = JSON.stringify({
  "f:addressType": {},
  "f:endpoints": {},
  "f:metadata": {
    "f:generateName": {},
    "f:labels": {
      ".": {},
      "f:endpointslice.kubernetes.io/managed-by": {},
      "f:kubernetes.io/service-name": {},
    },
    "f:ownerReferences": { ".": {}, 'k:{"uid":"0b4f6c1e-0000-4000-8000-000000000001"}': {} },
  },
  "f:ports": {},
});

function jsonLine(i: number, rv: number): string {
  return JSON.stringify({
    type: "MODIFIED",
    object: {
      kind: "EndpointSlice",
      apiVersion: "discovery.k8s.io/v1",
      metadata: {
        name: `web-${i}-abcde`,
        generateName: `web-${i}-`,
        namespace: `ns-${i % 50}`,
        uid: `0b4f6c1e-${String(i).padStart(4, "0")}-4000-8000-000000000001`,
        resourceVersion: String(rv),
        generation: 7,
        creationTimestamp: "2026-12-01T10:00:00Z",
        labels: {
          "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
          "kubernetes.io/service-name": `web-${i}`,
        },
        ownerReferences: [{
          apiVersion: "v1",
          kind: "Service",
          name: `web-${i}`,
          uid: "0b4f6c1e-0000-4000-8000-000000000001",
          controller: true,
          blockOwnerDeletion: true,
        }],
        managedFields: [{
          manager: "kube-controller-manager",
          operation: "Update",
          apiVersion: "discovery.k8s.io/v1",
          time: "2026-12-01T10:00:00Z",
          fieldsType: "FieldsV1",
          fieldsV1: JSON.parse(FIELDS),
        }],
      },
      addressType: "IPv4",
      endpoints: endpoints(i).map((e) => ({
        addresses: [e.ip],
        conditions: { ready: true, serving: true, terminating: false },
        targetRef: { kind: "Pod", namespace: `ns-${i % 50}`, name: e.pod, uid: e.uid },
        nodeName: e.node,
        zone: e.zone,
      })),
      ports: [{ name: "http", protocol: "TCP", port: 8080 }],
    },
  });
}

function protobufFrame(i: number, rv: number): Uint8Array {
  const ns = `ns-${i % 50}`;
  const s = new BinaryWriter();
  const m = s.tag(1, LD).fork();
  m.tag(1, LD).string(`web-${i}-abcde`).tag(2, LD).string(`web-${i}-`).tag(3, LD).string(ns).tag(4, LD)
    .string("")
    .tag(5, LD).string(`0b4f6c1e-${String(i).padStart(4, "0")}-4000-8000-000000000001`)
    .tag(6, LD).string(String(rv)).tag(7, VARINT).int64(7)
    .tag(8, LD).fork().tag(1, VARINT).int64(1796119200).tag(2, VARINT).int32(0).join();
  for (
    const [k, v] of [["endpointslice.kubernetes.io/managed-by", "endpointslice-controller.k8s.io"], [
      "kubernetes.io/service-name",
      `web-${i}`,
    ]]
  ) m.tag(11, LD).fork().tag(1, LD).string(k).tag(2, LD).string(v).join();
  m.tag(13, LD).fork().tag(1, LD).string("Service").tag(3, LD).string(`web-${i}`)
    .tag(4, LD).string("0b4f6c1e-0000-4000-8000-000000000001").tag(5, LD).string("v1")
    .tag(6, VARINT).bool(true).tag(7, VARINT).bool(true).join();
  m.tag(17, LD).fork().tag(1, LD).string("kube-controller-manager").tag(2, LD).string("Update")
    .tag(3, LD).string("discovery.k8s.io/v1").tag(4, LD).fork().tag(1, VARINT).int64(1796119200).join()
    .tag(6, LD).string("FieldsV1").tag(7, LD).fork().tag(1, LD).bytes(new TextEncoder().encode(FIELDS)).join()
    .join();
  m.join();
  for (const e of endpoints(i)) {
    s.tag(2, LD).fork().tag(1, LD).string(e.ip)
      .tag(2, LD).fork().tag(1, VARINT).bool(true).tag(2, VARINT).bool(true).tag(3, VARINT).bool(false).join()
      .tag(4, LD).fork().tag(1, LD).string("Pod").tag(2, LD).string(ns).tag(3, LD).string(e.pod)
      .tag(4, LD).string(e.uid).join()
      .tag(6, LD).string(e.node).tag(7, LD).string(e.zone).join();
  }
  s.tag(3, LD).fork().tag(1, LD).string("http").tag(2, LD).string("TCP").tag(3, VARINT).int32(8080).join();
  s.tag(4, LD).string("IPv4");
  const slice = s.finish();
  const u = new BinaryWriter();
  u.tag(1, LD).fork().tag(1, LD).string("discovery.k8s.io/v1").tag(2, LD).string("EndpointSlice").join()
    .tag(2, LD).bytes(slice).tag(3, LD).string("").tag(4, LD).string("");
  const obj = new Uint8Array([0x6b, 0x38, 0x73, 0x00, ...u.finish()]);
  const ev = new BinaryWriter().tag(1, LD).string("MODIFIED").tag(2, LD).fork().tag(1, LD).bytes(obj).join()
    .finish();
  const out = new Uint8Array(4 + ev.length);
  new DataView(out.buffer).setUint32(0, ev.length);
  out.set(ev, 4);
  return out;
}

const enc = new TextEncoder();
const JSON_STREAM = concatBytes(
  Array.from({ length: EVENTS }, (_, k) => enc.encode(jsonLine(k % 5000, 1000 + k) + "\n")),
);
const PB_STREAM = concatBytes(Array.from({ length: EVENTS }, (_, k) => protobufFrame(k % 5000, 1000 + k)));
console.log(
  `bytes per event: JSON ${(JSON_STREAM.length / EVENTS).toFixed(0)}, protobuf ${
    (PB_STREAM.length / EVENTS).toFixed(0)
  } (ratio ${(JSON_STREAM.length / PB_STREAM.length).toFixed(2)})`,
);

function reader(bytes: Uint8Array): ReadableStreamDefaultReader<Uint8Array> {
  let o = 0;
  return new ReadableStream<Uint8Array>({
    pull(c) {
      if (o >= bytes.length) return c.close();
      c.enqueue(bytes.slice(o, o + 65536));
      o += 65536;
    },
  }).getReader();
}

async function drain(gen: AsyncGenerator<unknown>): Promise<number> {
  let n = 0;
  for await (const _ of gen) n++;
  if (n !== EVENTS) throw new Error(`decoded ${n} of ${EVENTS}`);
  return n;
}

Deno.bench(
  `JSON: ${EVENTS} EndpointSlice events (10 endpoints)`,
  { group: "decode", baseline: true },
  async () => {
    await drain(decodeWatchStream(reader(JSON_STREAM)));
  },
);

Deno.bench(`protobuf: ${EVENTS} EndpointSlice events (10 endpoints)`, { group: "decode" }, async () => {
  await drain(decodeProtobufWatchStream(reader(PB_STREAM)));
});
