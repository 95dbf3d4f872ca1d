/**
 * Kubernetes' protobuf wire format, read for the watches the agent asks for in it (EndpointSlices: the bulk of a
 * node's steady-state watch traffic; a JSON event is ~3.5 × the bytes). The API server frames a protobuf watch
 * as 4-byte big-endian lengths, each followed by a `meta.v1.WatchEvent` without envelope; the event's object is
 * `k8s\0` + `runtime.Unknown` (apiVersion, kind, the object's bytes). Objects are decoded into the same shapes a
 * JSON watch yields (the fields `lib/kube/types.ts` declares; empty strings, zero numbers and absent optionals
 * left out as JSON's `omitempty` leaves them), so everything above the client is unaware of the format.
 * Field numbers are those of k8s.io/api and k8s.io/apimachinery's `generated.proto`; the wire reader is
 * `@bufbuild/protobuf`'s.
 * @module
 */
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import type {
  Endpoint,
  EndpointConditions,
  EndpointHints,
  EndpointPort,
  EndpointSlice,
  KubeObject,
  ObjectMeta,
  Status,
  WatchEvent,
} from "./types.ts";

/** The protobuf media type of the Kubernetes API. */
export const PROTOBUF_MEDIA_TYPE = "application/vnd.kubernetes.protobuf";

/** The `Accept` of a watch that prefers protobuf and takes JSON from a server without it. */
export const PROTOBUF_WATCH_ACCEPT = `${PROTOBUF_MEDIA_TYPE}, application/json`;

/** The kinds this module decodes (a watch asks for protobuf only for these). */
export const PROTOBUF_KINDS: ReadonlySet<string> = new Set(["EndpointSlice", "Status"]);

/** Frames larger than this are taken for a corrupt stream (the API server's own limit on a request is 3 MiB). */
const MAX_FRAME_BYTES = 64 * 1024 * 1024;

/** Bytes that are not the protobuf the API server sends. */
export class ProtobufDecodeError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(`protobuf: ${message}`, options);
    this.name = "ProtobufDecodeError";
  }
}

const MAGIC = [0x6b, 0x38, 0x73, 0x00]; // "k8s\0"

/** Reads the fields of a message up to `end`; `field` returns false for a field it leaves to be skipped. */
function fields(r: BinaryReader, end: number, field: (no: number, wt: WireType) => boolean): void {
  while (r.pos < end) {
    const [no, wt] = r.tag();
    if (!field(no, wt)) r.skip(wt, no);
  }
  if (r.pos !== end) throw new ProtobufDecodeError(`a message overran its length (${r.pos} > ${end})`);
}

/** Reads a length-delimited embedded message's fields. */
function nested(r: BinaryReader, wt: WireType, field: (no: number, wt: WireType) => boolean): void {
  expect(wt, WireType.LengthDelimited);
  const len = r.uint32();
  fields(r, r.pos + len, field);
}

function expect(wt: WireType, want: WireType): void {
  if (wt !== want) throw new ProtobufDecodeError(`wire type ${wt} where ${want} was expected`);
}

function str(r: BinaryReader, wt: WireType): string {
  expect(wt, WireType.LengthDelimited);
  return r.string();
}

function int(r: BinaryReader, wt: WireType, bits: 32 | 64): number {
  expect(wt, WireType.Varint);
  return bits === 32 ? r.int32() : Number(r.int64());
}

/** A `meta.v1.Time` (seconds, nanos) as JSON writes it (RFC 3339, whole seconds); undefined for the zero time. */
function time(r: BinaryReader, wt: WireType): string | undefined {
  let seconds = 0;
  nested(r, wt, (no, w) => {
    if (no !== 1) return false;
    seconds = int(r, w, 64);
    return true;
  });
  return seconds === 0 ? undefined : new Date(seconds * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** One `map<string, string>` entry into `into`. */
function mapEntry(r: BinaryReader, wt: WireType, into: Record<string, string>): void {
  let key = "";
  let value = "";
  nested(r, wt, (no, w) => {
    if (no === 1) key = str(r, w);
    else if (no === 2) value = str(r, w);
    else return false;
    return true;
  });
  into[key] = value;
}

function objectMeta(r: BinaryReader, wt: WireType): ObjectMeta {
  const m: ObjectMeta = {};
  nested(r, wt, (no, w) => {
    switch (no) {
      case 1:
        m.name = str(r, w) || undefined;
        return true;
      case 3:
        m.namespace = str(r, w) || undefined;
        return true;
      case 5:
        m.uid = str(r, w) || undefined;
        return true;
      case 6:
        m.resourceVersion = str(r, w) || undefined;
        return true;
      case 7:
        m.generation = int(r, w, 64) || undefined;
        return true;
      case 8:
        m.creationTimestamp = time(r, w);
        return true;
      case 9:
        m.deletionTimestamp = time(r, w);
        return true;
      case 11:
        mapEntry(r, w, m.labels ??= {});
        return true;
      case 12:
        mapEntry(r, w, m.annotations ??= {});
        return true;
      default: // generateName, selfLink, ownerReferences, finalizers, managedFields: not read by the proxy
        return false;
    }
  });
  return dropUndefined(m);
}

function conditions(r: BinaryReader, wt: WireType): EndpointConditions {
  const c: EndpointConditions = {};
  nested(r, wt, (no, w) => {
    if (no < 1 || no > 3) return false;
    expect(w, WireType.Varint);
    const v = r.bool();
    if (no === 1) c.ready = v;
    else if (no === 2) c.serving = v;
    else c.terminating = v;
    return true;
  });
  return c;
}

function names(r: BinaryReader, wt: WireType, into: { name: string }[]): void {
  let name = "";
  nested(r, wt, (no, w) => {
    if (no !== 1) return false;
    name = str(r, w);
    return true;
  });
  into.push({ name });
}

function hints(r: BinaryReader, wt: WireType): EndpointHints {
  const h: EndpointHints = {};
  nested(r, wt, (no, w) => {
    if (no === 1) names(r, w, h.forZones ??= []);
    else if (no === 2) names(r, w, h.forNodes ??= []);
    else return false;
    return true;
  });
  return h;
}

function objectReference(r: BinaryReader, wt: WireType): NonNullable<Endpoint["targetRef"]> {
  const ref: NonNullable<Endpoint["targetRef"]> = {};
  nested(r, wt, (no, w) => {
    if (no === 1) ref.kind = str(r, w) || undefined;
    else if (no === 2) ref.namespace = str(r, w) || undefined;
    else if (no === 3) ref.name = str(r, w) || undefined;
    else if (no === 4) ref.uid = str(r, w) || undefined;
    else return false;
    return true;
  });
  return dropUndefined(ref);
}

function endpoint(r: BinaryReader, wt: WireType): Endpoint {
  const e: Endpoint = { addresses: [], conditions: {} };
  nested(r, wt, (no, w) => {
    switch (no) {
      case 1:
        e.addresses!.push(str(r, w));
        return true;
      case 2:
        e.conditions = conditions(r, w);
        return true;
      case 3:
        e.hostname = str(r, w);
        return true;
      case 4:
        e.targetRef = objectReference(r, w);
        return true;
      case 6:
        e.nodeName = str(r, w);
        return true;
      case 7:
        e.zone = str(r, w);
        return true;
      case 8:
        e.hints = hints(r, w);
        return true;
      default: // deprecatedTopology
        return false;
    }
  });
  return e;
}

function endpointPort(r: BinaryReader, wt: WireType): EndpointPort {
  const p: EndpointPort = {};
  nested(r, wt, (no, w) => {
    if (no === 1) p.name = str(r, w);
    else if (no === 2) p.protocol = str(r, w);
    else if (no === 3) p.port = int(r, w, 32);
    else if (no === 4) p.appProtocol = str(r, w);
    else return false;
    return true;
  });
  return p;
}

/** A `discovery.v1.EndpointSlice` message (no envelope). */
export function decodeEndpointSlice(bytes: Uint8Array): EndpointSlice {
  const r = new BinaryReader(bytes);
  const s: EndpointSlice = { metadata: {}, addressType: "", endpoints: null, ports: null };
  fields(r, bytes.length, (no, w) => {
    switch (no) {
      case 1:
        s.metadata = objectMeta(r, w);
        return true;
      case 2:
        (s.endpoints ??= []).push(endpoint(r, w));
        return true;
      case 3:
        (s.ports ??= []).push(endpointPort(r, w));
        return true;
      case 4:
        s.addressType = str(r, w);
        return true;
      default:
        return false;
    }
  });
  return s;
}

/** A `meta.v1.Status` message (no envelope): status, message, reason and code. */
export function decodeStatus(bytes: Uint8Array): Status {
  const r = new BinaryReader(bytes);
  const s: Status = {};
  fields(r, bytes.length, (no, w) => {
    if (no === 2) s.status = str(r, w) || undefined;
    else if (no === 3) s.message = str(r, w) || undefined;
    else if (no === 4) s.reason = str(r, w) || undefined;
    else if (no === 6) s.code = int(r, w, 32) || undefined;
    else return false;
    return true;
  });
  return dropUndefined(s);
}

const DECODERS: Record<string, (bytes: Uint8Array) => KubeObject> = {
  EndpointSlice: decodeEndpointSlice,
  Status: decodeStatus,
};

/** An object as the API server encodes it: `k8s\0` + `runtime.Unknown`; the result carries apiVersion and kind. */
export function decodeObject(bytes: Uint8Array): KubeObject {
  for (let i = 0; i < MAGIC.length; i++) {
    if (bytes[i] !== MAGIC[i]) throw new ProtobufDecodeError("an object without the k8s\\0 prefix");
  }
  const r = new BinaryReader(bytes.subarray(MAGIC.length));
  let apiVersion = "";
  let kind = "";
  let raw: Uint8Array | undefined;
  let encoding = "";
  fields(r, bytes.length - MAGIC.length, (no, w) => {
    switch (no) {
      case 1:
        nested(r, w, (tno, tw) => {
          if (tno === 1) apiVersion = str(r, tw);
          else if (tno === 2) kind = str(r, tw);
          else return false;
          return true;
        });
        return true;
      case 2:
        expect(w, WireType.LengthDelimited);
        raw = r.bytes();
        return true;
      case 3:
        encoding = str(r, w);
        return true;
      default: // contentType
        return false;
    }
  });
  if (encoding !== "") {
    throw new ProtobufDecodeError(`content encoding ${JSON.stringify(encoding)} is not supported`);
  }
  const decode = DECODERS[kind];
  if (!decode) throw new ProtobufDecodeError(`no decoder for kind ${JSON.stringify(kind)}`);
  const obj = decode(raw ?? new Uint8Array(0));
  return { apiVersion, kind, ...obj };
}

/** A `meta.v1.WatchEvent` message (the stream's frame, no envelope). */
export function decodeWatchEventMessage<T>(bytes: Uint8Array): WatchEvent<T> {
  const r = new BinaryReader(bytes);
  let type = "";
  let object: KubeObject | undefined;
  fields(r, bytes.length, (no, w) => {
    if (no === 1) type = str(r, w);
    else if (no === 2) {
      nested(r, w, (rno, rw) => {
        if (rno !== 1) return false;
        expect(rw, WireType.LengthDelimited);
        object = decodeObject(r.bytes());
        return true;
      });
    } else return false;
    return true;
  });
  if (!type || !object) throw new ProtobufDecodeError("a watch event without type or object");
  return { type, object } as unknown as WatchEvent<T>;
}

/**
 * Splits a length-delimited stream into frames as chunks arrive (no whole-body buffering): bytes are appended
 * into one buffer that grows to the largest frame seen and is compacted as frames are taken.
 */
export class FrameSplitter {
  private buf = new Uint8Array(64 * 1024);
  private start = 0;
  private end = 0;

  /** Appends a chunk. Frames returned by {@linkcode next} before this call are no longer valid. */
  push(chunk: Uint8Array): void {
    if (this.end + chunk.length > this.buf.length) {
      const pending = this.end - this.start;
      const need = pending + chunk.length;
      const next = need > this.buf.length ? new Uint8Array(Math.max(need, this.buf.length * 2)) : this.buf;
      next.set(this.buf.subarray(this.start, this.end), 0); // set() copies first when both share a buffer
      this.buf = next;
      this.start = 0;
      this.end = pending;
    }
    this.buf.set(chunk, this.end);
    this.end += chunk.length;
  }

  /** The next whole frame (a view into the buffer, valid until the next push), or undefined. */
  next(): Uint8Array | undefined {
    if (this.end - this.start < 4) return undefined;
    const b = this.buf;
    const s = this.start;
    const len = ((b[s] << 24) | (b[s + 1] << 16) | (b[s + 2] << 8) | b[s + 3]) >>> 0;
    if (len > MAX_FRAME_BYTES) throw new ProtobufDecodeError(`a frame of ${len} bytes`);
    if (this.end - s - 4 < len) return undefined;
    this.start = s + 4 + len;
    if (this.start === this.end) this.start = this.end = 0;
    return b.subarray(s + 4, s + 4 + len);
  }

  /** Bytes received that are not yet a whole frame. */
  get pending(): number {
    return this.end - this.start;
  }
}

function dropUndefined<T extends object>(o: T): T {
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] === undefined) delete o[k];
  return o;
}

/**
 * The `Accept` of watches of a kind this module decodes, from the client connection's settings as client-go
 * reads them (`acceptContentTypes`, else `contentType`; `--kube-api-content-type`, protobuf by default):
 * {@linkcode PROTOBUF_WATCH_ACCEPT} when they name protobuf, undefined (JSON) otherwise.
 */
export function protobufWatchAccept(
  conn: { acceptContentTypes?: string; contentType?: string },
): string | undefined {
  const accept = conn.acceptContentTypes || conn.contentType || "";
  return accept.includes(PROTOBUF_MEDIA_TYPE) ? PROTOBUF_WATCH_ACCEPT : undefined;
}
