/**
 * Payload assembly shared by the dataplanes: a bounded chunk writer that streams a payload to the kernel tool
 * as it is generated, a cached concatenation of per-service blocks, and error context for a failing payload
 * line.
 * @module
 */

const encoder = new TextEncoder();

/** Default chunk size of {@linkcode ChunkWriter}: what one pipe write hands the kernel tool at a time. */
export const DEFAULT_CHUNK_BYTES = 256 * 1024;

/**
 * Appends bytes and text into one fixed buffer and hands it out in chunks, so that a payload of any size is
 * generated and written to the kernel tool's stdin with a bounded buffer (no payload-sized string or buffer).
 *
 * The methods are generators yielding full chunks: call them with `yield*` from a generator that produces the
 * payload. A yielded chunk holds at most `chunkBytes` bytes; it is a view of the writer's buffer (or of a block
 * larger than a chunk) and is only valid until the next chunk is requested: the consumer must write (or copy)
 * it first.
 */
export class ChunkWriter {
  readonly #buf: Uint8Array;
  #pos = 0;
  /** Bytes handed out so far. */
  total = 0;

  constructor(readonly chunkBytes: number = DEFAULT_CHUNK_BYTES) {
    if (chunkBytes < 4096) throw new RangeError("chunkBytes must be at least 4096");
    this.#buf = new Uint8Array(chunkBytes);
  }

  #take(): Uint8Array {
    const c = this.#buf.subarray(0, this.#pos);
    this.total += this.#pos;
    this.#pos = 0;
    return c;
  }

  /** Appends bytes. */
  *bytes(b: Uint8Array): Generator<Uint8Array, void, undefined> {
    const n = b.length;
    if (n === 0) return;
    if (n >= this.chunkBytes) {
      // A large block goes out as views of itself, at most a chunk each (no copy).
      if (this.#pos > 0) yield this.#take();
      this.total += n;
      for (let i = 0; i < n; i += this.chunkBytes) yield b.subarray(i, Math.min(n, i + this.chunkBytes));
      return;
    }
    if (this.#pos + n > this.chunkBytes) yield this.#take();
    this.#buf.set(b, this.#pos);
    this.#pos += n;
  }

  /**
   * Appends text, UTF-8 encoded in place. A long text is encoded a buffer's worth at a time: the encoder copies
   * the whole string it is given out of the JS heap first, so handing it a megabyte-long section would allocate
   * (and fragment) that much outside the heap on every sync.
   */
  *text(s: string): Generator<Uint8Array, void, undefined> {
    let i = 0;
    while (i < s.length) {
      const space = this.#buf.length - this.#pos;
      if (space < 4) {
        yield this.#take();
        continue;
      }
      let end = Math.min(s.length, i + space);
      // Do not split a surrogate pair.
      if (end < s.length && (s.charCodeAt(end - 1) & 0xfc00) === 0xd800) end--;
      const piece = i === 0 && end === s.length ? s : s.substring(i, end);
      const r = encoder.encodeInto(piece, this.#buf.subarray(this.#pos));
      this.#pos += r.written;
      i += r.read;
      if (r.read < piece.length) yield this.#take();
    }
  }

  /** Hands out what is left. */
  *end(): Generator<Uint8Array, void, undefined> {
    if (this.#pos > 0) yield this.#take();
  }
}

/** Concatenates a chunk stream into one buffer (tests, benchmarks, error context). */
export function collectChunks(chunks: Iterable<Uint8Array>): Uint8Array {
  const parts: Uint8Array[] = [];
  let n = 0;
  for (const c of chunks) {
    parts.push(c.slice());
    n += c.length;
  }
  const out = new Uint8Array(n);
  let p = 0;
  for (const c of parts) {
    out.set(c, p);
    p += c.length;
  }
  return out;
}

/**
 * A section made of one text block per service port in snapshot order (e.g. iptables' nat dispatch rules).
 * The concatenation is kept and rebuilt only when some block or the order changed, so a partial sync writes a
 * whole dispatch chain as one block.
 */
export class SectionCache {
  private refs: string[] = [];
  private n = 0;
  private dirty = true;
  private cat = "";
  /** Characters of the section being collected. */
  size = 0;

  /** Starts collecting the blocks of one payload. */
  begin(): void {
    this.n = 0;
    this.size = 0;
  }

  /** Adds the next block (empty blocks are skipped). */
  push(b: string): void {
    if (b.length === 0) return;
    if (this.refs[this.n] !== b) {
      this.dirty = true;
      this.refs[this.n] = b;
    }
    this.n++;
    this.size += b.length;
  }

  /** The collected section (the cached concatenation, rebuilt when something changed). */
  text(): string {
    if (this.refs.length !== this.n) {
      this.refs.length = this.n;
      this.dirty = true;
    }
    if (this.dirty) {
      this.cat = this.refs.join("");
      this.dirty = false;
    }
    return this.cat;
  }

  /** Forgets every block (the rendering settings changed). */
  clear(): void {
    this.refs = [];
    this.n = 0;
    this.dirty = true;
    this.cat = "";
  }
}

/** Lines around line `n` (1-based) of a payload, numbered, for error logs. */
export function extractLines(payload: string, n: number, context = 2): string {
  const lines = payload.split("\n");
  const out: string[] = [];
  for (let i = Math.max(1, n - context); i <= Math.min(lines.length, n + context); i++) {
    out.push(`${i === n ? "=>" : "  "} ${i}: ${lines[i - 1]}`);
  }
  return out.join("\n");
}

/** Sums the time spent producing each item of `gen` into `acc` (the generation share of a streamed sync). */
export function* timed<T>(gen: Iterable<T>, acc: { ms: number }): Generator<T, void, undefined> {
  const it = gen[Symbol.iterator]();
  try {
    for (;;) {
      const t = performance.now();
      const r = it.next();
      acc.ms += performance.now() - t;
      if (r.done) return;
      yield r.value;
    }
  } finally {
    it.return?.();
  }
}
