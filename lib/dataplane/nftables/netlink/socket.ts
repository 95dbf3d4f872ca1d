/**
 * A NETLINK_NETFILTER socket through libc (`Deno.dlopen`: needs `--allow-ffi`). One batch at a time: the kernel
 * handles a batch inside `send` (the commit included), so every reply to it is queued when `send` returns; a
 * generation request sent after it marks the end of those replies.
 * @module
 */
import { type NetlinkMessage, NetlinkWriter, NFNL, NFT_MSG, NLM_F, parseMessages } from "./wire.ts";

const AF_NETLINK = 16;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_NETFILTER = 12;
const SOL_SOCKET = 1;
const SO_SNDBUFFORCE = 32;
const SO_RCVBUFFORCE = 33;
const MSG_DONTWAIT = 0x40;
const EAGAIN = 11;
const EINTR = 4;
const RCVBUF = 1 << 20;
const SOL_NETLINK = 270;
const NETLINK_CAP_ACK = 10;
const O_RDONLY_CLOEXEC = 0o2000000;
const CLONE_NEWNET = 0x40000000;

const SYMBOLS = {
  socket: { parameters: ["i32", "i32", "i32"], result: "i32" },
  setsockopt: { parameters: ["i32", "i32", "i32", "buffer", "u32"], result: "i32" },
  send: { parameters: ["i32", "buffer", "usize", "i32"], result: "isize", nonblocking: true },
  sendNow: { name: "send", parameters: ["i32", "buffer", "usize", "i32"], result: "isize" },
  recv: { parameters: ["i32", "buffer", "usize", "i32"], result: "isize" },
  close: { parameters: ["i32"], result: "i32" },
  open: { parameters: ["buffer", "i32"], result: "i32" },
  setns: { parameters: ["i32", "i32"], result: "i32" },
  __errno_location: { parameters: [], result: "pointer" },
} as const;

type Libc = Deno.DynamicLibrary<typeof SYMBOLS>;
let libc: Libc | undefined;

function lib(): Libc {
  return libc ??= Deno.dlopen("libc.so.6", SYMBOLS);
}

function errno(): number {
  const p = lib().symbols.__errno_location();
  return p === null ? 0 : new Deno.UnsafePointerView(p).getInt32();
}

function openSocket(): number {
  return lib().symbols.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
}

function openPath(path: string): number {
  const fd = lib().symbols.open(new TextEncoder().encode(path + "\0"), O_RDONLY_CLOEXEC);
  if (fd < 0) throw new NetlinkSocketError(`open ${path}`, errno());
  return fd;
}

/** Runs `fn` on this thread inside network namespace `name`, then returns the thread to its own. */
function inNetns<T>(name: string, fn: () => T): T {
  const own = openPath("/proc/thread-self/ns/net");
  try {
    const target = openPath(`/run/netns/${name}`);
    try {
      if (lib().symbols.setns(target, CLONE_NEWNET) < 0) throw new NetlinkSocketError("setns", errno());
    } finally {
      lib().symbols.close(target);
    }
    let result: T | undefined;
    let failure: { error: unknown } | undefined;
    try {
      result = fn();
    } catch (error) {
      failure = { error };
    }
    if (lib().symbols.setns(own, CLONE_NEWNET) < 0) {
      throw new Error(`netlink: could not return to the thread's network namespace (errno ${errno()})`);
    }
    if (failure !== undefined) throw failure.error;
    return result as T;
  } finally {
    lib().symbols.close(own);
  }
}

/** A failed system call on the netlink socket. */
export class NetlinkSocketError extends Error {
  constructor(readonly call: string, readonly errno: number) {
    super(`netlink ${call} failed: ${errnoText(errno)}`);
    this.name = "NetlinkSocketError";
  }
}

const ERRNO_TEXT: Readonly<Record<number, string>> = {
  1: "Operation not permitted",
  2: "No such file or directory",
  7: "Argument list too long",
  12: "Cannot allocate memory",
  13: "Permission denied",
  16: "Device or resource busy",
  17: "File exists",
  22: "Invalid argument",
  34: "Numerical result out of range",
  40: "Too many levels of symbolic links",
  90: "Message too long",
  95: "Operation not supported",
  105: "No buffer space available",
};

/** strerror's English text for the errnos nf_tables returns ("errno N" for others). */
export function errnoText(n: number): string {
  return ERRNO_TEXT[n] ?? `errno ${n}`;
}

/** A NETLINK_NETFILTER socket in the caller's network namespace. */
export class NetfilterSocket {
  #fd: number;
  #sndbuf = 0;
  /** Where replies are read into (one per socket: no 64 KiB of garbage per batch). */
  readonly #recvBuffer = new Uint8Array(1 << 16);
  #seq = Math.floor(Date.now() / 1000) & 0x7fffffff;

  /**
   * @param netns a named network namespace (`/run/netns/NAME`) to open the socket in instead of the caller's
   * (tests: the calling thread enters it for the `socket` call and returns; a socket stays in the namespace it was
   * made in)
   */
  constructor(netns?: string) {
    const fd = netns === undefined ? openSocket() : inNetns(netns, openSocket);
    if (fd < 0) throw new NetlinkSocketError("socket", errno());
    this.#fd = fd;
    this.#setBuffer(SO_RCVBUFFORCE, RCVBUF);
    // Errors carry the failing message's header only, not the whole message (a rule can be tens of KiB).
    this.#setInt(SOL_NETLINK, NETLINK_CAP_ACK, 1);
  }

  /** The next sequence number to use. */
  get nextSeq(): number {
    return this.#seq;
  }

  /** Marks the sequence numbers up to `seq` (exclusive) used. */
  usedSeq(seq: number): void {
    this.#seq = seq & 0x7fffffff;
  }

  #setBuffer(opt: number, size: number): void {
    this.#setInt(SOL_SOCKET, opt, size);
  }

  #setInt(level: number, opt: number, value: number): void {
    const v = new Uint8Array(4);
    new DataView(v.buffer).setInt32(0, value, true);
    if (lib().symbols.setsockopt(this.#fd, level, opt, v, 4) < 0) {
      throw new NetlinkSocketError("setsockopt", errno());
    }
  }

  /**
   * Sends a batch and returns every reply to it (errors and acks), read up to the answer to a generation
   * request sent after it.
   */
  async exchange(batch: Uint8Array): Promise<NetlinkMessage[]> {
    if (batch.length + 4096 > this.#sndbuf) {
      // As nft does: a send buffer the size of the batch (the kernel takes a batch in one message).
      this.#sndbuf = Math.max(batch.length + 4096, 1 << 16);
      this.#setBuffer(SO_SNDBUFFORCE, this.#sndbuf);
    }
    await this.#send(batch);
    const genSeq = this.#seq;
    this.usedSeq(genSeq + 1);
    const w = new NetlinkWriter();
    w.begin((NFNL.SUBSYS_NFTABLES << 8) | NFT_MSG.GETGEN, NLM_F.REQUEST, genSeq, 0);
    w.end();
    await this.#send(w.bytes());
    const replies: NetlinkMessage[] = [];
    const buf = this.#recvBuffer;
    for (;;) {
      const n = Number(lib().symbols.recv(this.#fd, buf, BigInt(buf.length), MSG_DONTWAIT));
      if (n < 0) {
        const e = errno();
        if (e === EINTR) continue;
        if (e === EAGAIN) throw new Error("netlink: no answer to the generation request after a batch");
        throw new NetlinkSocketError("recv", e);
      }
      // A copy: the replies outlive the next recv into buf.
      for (const m of parseMessages(buf.slice(0, n))) {
        if (m.seq === genSeq && m.type === ((NFNL.SUBSYS_NFTABLES << 8) | NFT_MSG.NEWGEN)) return replies;
        replies.push(m);
      }
    }
  }

  async #send(bytes: Uint8Array): Promise<void> {
    // Off the event loop (the kernel commits inside send); errno is per thread, so a failure is sent again on
    // this thread to read it (a failed send left nothing applied: the kernel takes a message whole or not).
    const n = Number(await lib().symbols.send(this.#fd, bytes, BigInt(bytes.length), 0));
    if (n === bytes.length) return;
    const again = Number(lib().symbols.sendNow(this.#fd, bytes, BigInt(bytes.length), 0));
    if (again !== bytes.length) throw new NetlinkSocketError("send", again < 0 ? errno() : 0);
  }

  /** Closes the socket. */
  close(): void {
    if (this.#fd >= 0) lib().symbols.close(this.#fd);
    this.#fd = -1;
  }
}
