/**
 * The nf_tables netlink wire format: the protocol's numbers (from the kernel's uapi `linux/netlink.h`,
 * `linux/netfilter/nfnetlink.h` and `linux/netfilter/nf_tables.h`), a writer of messages with nested
 * attributes, and a reader of the kernel's replies. Attribute values are in network byte order, as nf_tables
 * wants them; padding to 4 bytes as netlink does.
 * @module
 */

/** netlink message header flags. */
export const NLM_F = {
  REQUEST: 0x1,
  MULTI: 0x2,
  ACK: 0x4,
  EXCL: 0x200,
  CREATE: 0x400,
  APPEND: 0x800,
} as const;

/** netlink control message types. */
export const NLMSG = { ERROR: 2, DONE: 3 } as const;

/** The nested flag of an attribute's type. */
export const NLA_F_NESTED = 0x8000;

/** nfnetlink batch delimiters and the nf_tables subsystem. */
export const NFNL = { BATCH_BEGIN: 0x10, BATCH_END: 0x11, SUBSYS_NFTABLES: 10 } as const;

/** nf_tables message types (the low byte; the subsystem is the high byte). */
export const NFT_MSG = {
  NEWTABLE: 0,
  NEWCHAIN: 3,
  DELCHAIN: 5,
  NEWRULE: 6,
  DELRULE: 8,
  NEWSET: 9,
  DELSET: 11,
  NEWSETELEM: 12,
  DELSETELEM: 14,
  NEWGEN: 15,
  GETGEN: 16,
} as const;

/** Address families of nfgenmsg. */
export const NFPROTO = { IPV4: 2, IPV6: 10 } as const;

const encoder = new TextEncoder();

/** An attribute longer than netlink's 16-bit length (e.g. a map of thousands of endpoints in one message). */
export class AttributeTooLongError extends Error {
  constructor(what: string, bytes: number) {
    super(`netlink ${what} too long (${bytes} bytes)`);
    this.name = "AttributeTooLongError";
  }
}

/** Bytes of a u32 in network byte order. */
export function be32(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n >>> 0);
  return b;
}

/** Bytes of a u64 in network byte order (whole numbers up to 2^53). */
export function be64(n: number): Uint8Array {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, BigInt(n));
  return b;
}

/** Bytes of a NUL-terminated string. */
export function cstr(s: string): Uint8Array {
  const e = encoder.encode(s);
  const b = new Uint8Array(e.length + 1);
  b.set(e);
  return b;
}

const align4 = (n: number) => (n + 3) & ~3;

/** A growable byte buffer writing netlink messages and attributes. */
export class NetlinkWriter {
  #buf = new Uint8Array(4096);
  #view = new DataView(this.#buf.buffer);
  #len = 0;
  #msgStart = -1;
  readonly #nests: number[] = [];

  /** Bytes written so far. */
  get length(): number {
    return this.#len;
  }

  /** Bytes the buffer holds (written or not). */
  get capacity(): number {
    return this.#buf.length;
  }

  #reserve(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < this.#len + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.#buf.subarray(0, this.#len));
    this.#buf = next;
    this.#view = new DataView(next.buffer);
  }

  /** Starts a message: nlmsghdr (host byte order) and nfgenmsg (family, version 0, res_id in network order). */
  begin(type: number, flags: number, seq: number, family: number, resId = 0): void {
    if (this.#msgStart >= 0) throw new Error("netlink message not ended");
    this.#reserve(20);
    this.#msgStart = this.#len;
    const v = this.#view, o = this.#len;
    v.setUint32(o, 0, true);
    v.setUint16(o + 4, type, true);
    v.setUint16(o + 6, flags, true);
    v.setUint32(o + 8, seq >>> 0, true);
    v.setUint32(o + 12, 0, true);
    v.setUint8(o + 16, family);
    v.setUint8(o + 17, 0);
    v.setUint16(o + 18, resId);
    this.#len += 20;
  }

  /** Ends the message begun last, writing its length. */
  end(): void {
    if (this.#msgStart < 0 || this.#nests.length > 0) {
      throw new Error("netlink message not begun or nest open");
    }
    this.#view.setUint32(this.#msgStart, this.#len - this.#msgStart, true);
    this.#msgStart = -1;
  }

  /** An attribute with raw bytes. */
  attr(type: number, data: Uint8Array): void {
    const len = 4 + data.length;
    if (len > 0xffff) throw new AttributeTooLongError(`attribute ${type}`, data.length);
    this.#reserve(align4(len));
    this.#view.setUint16(this.#len, len, true);
    this.#view.setUint16(this.#len + 2, type, true);
    this.#buf.set(data, this.#len + 4);
    this.#buf.fill(0, this.#len + len, this.#len + align4(len));
    this.#len += align4(len);
  }

  /** A u32 attribute in network byte order. */
  u32(type: number, n: number): void {
    this.attr(type, be32(n));
  }

  /** A u64 attribute in network byte order. */
  u64(type: number, n: number): void {
    this.attr(type, be64(n));
  }

  /** A NUL-terminated string attribute. */
  str(type: number, s: string): void {
    this.attr(type, cstr(s));
  }

  /** Opens a nested attribute (closed by {@linkcode close}). */
  open(type: number): void {
    this.#reserve(4);
    this.#nests.push(this.#len);
    this.#view.setUint16(this.#len + 2, type | NLA_F_NESTED, true);
    this.#len += 4;
  }

  /** Closes the nested attribute opened last. */
  close(): void {
    const start = this.#nests.pop();
    if (start === undefined) throw new Error("no nested netlink attribute open");
    const len = this.#len - start;
    if (len > 0xffff) throw new AttributeTooLongError("nested attribute", len);
    this.#view.setUint16(start, len, true);
  }

  /** A copy of the bytes written. */
  bytes(): Uint8Array {
    return this.#buf.slice(0, this.#len);
  }

  /** The bytes written, in place (valid until the writer is written to or reset). */
  view(): Uint8Array {
    return this.#buf.subarray(0, this.#len);
  }

  /** Empties the writer, keeping its buffer for the next messages. */
  reset(): void {
    this.#len = 0;
    this.#msgStart = -1;
    this.#nests.length = 0;
  }
}

/** One netlink message as read: header fields and the payload after nlmsghdr. */
export interface NetlinkMessage {
  readonly type: number;
  readonly flags: number;
  readonly seq: number;
  /** Bytes after the 16-byte header (nfgenmsg and attributes, or an error's errno and echoed header). */
  readonly payload: Uint8Array;
}

/** Splits a buffer of netlink messages. */
export function parseMessages(buf: Uint8Array): NetlinkMessage[] {
  const out: NetlinkMessage[] = [];
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let o = 0;
  while (o + 16 <= buf.length) {
    const len = v.getUint32(o, true);
    if (len < 16 || o + len > buf.length) {
      throw new Error(`malformed netlink message at ${o} (length ${len})`);
    }
    out.push({
      type: v.getUint16(o + 4, true),
      flags: v.getUint16(o + 6, true),
      seq: v.getUint32(o + 8, true),
      payload: buf.subarray(o + 16, o + len),
    });
    o += align4(len);
  }
  return out;
}

/** An NLMSG_ERROR reply: errno (0 is an ack) and the sequence number of the message it answers. */
export function parseError(m: NetlinkMessage): { errno: number; seq: number } {
  const v = new DataView(m.payload.buffer, m.payload.byteOffset, m.payload.byteLength);
  return { errno: -v.getInt32(0, true), seq: v.getUint32(4 + 8, true) };
}

/** An attribute as read: its type (without flags), whether nested, and its data. */
export interface Attr {
  readonly type: number;
  readonly nested: boolean;
  readonly data: Uint8Array;
}

/** Splits attributes (after the nfgenmsg header, or inside a nested attribute). */
export function parseAttrs(buf: Uint8Array): Attr[] {
  const out: Attr[] = [];
  const v = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  let o = 0;
  while (o + 4 <= buf.length) {
    const len = v.getUint16(o, true);
    const type = v.getUint16(o + 2, true);
    if (len < 4 || o + len > buf.length) {
      throw new Error(`malformed netlink attribute at ${o} (length ${len})`);
    }
    out.push({
      type: type & 0x3fff,
      nested: (type & NLA_F_NESTED) !== 0,
      data: buf.subarray(o + 4, o + len),
    });
    o += align4(len);
  }
  return out;
}
