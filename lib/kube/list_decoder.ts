/**
 * Decodes a list response (`{"kind":..., "metadata":{...}, "items":[{...}, ...]}`) as its body arrives: each
 * item is parsed and handed over as soon as its closing brace is read, so neither the whole body text nor every
 * decoded item is ever held at once (at 10k EndpointSlices the body is about 25 MB, and a buffer that size left
 * the allocator's heap that much larger for the life of the process).
 *
 * The scanner only tracks JSON structure (nesting, strings and escapes) byte by byte; each item's bytes are
 * parsed with `JSON.parse`, and so is the rest of the document (with an empty `items`), for the list metadata.
 * @module
 */

const QUOTE = 0x22, BACKSLASH = 0x5c, LBRACE = 0x7b, RBRACE = 0x7d, LBRACKET = 0x5b, RBRACKET = 0x5d;
const COMMA = 0x2c;
const ITEMS = "items";

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/** The body was not a JSON list document. */
export class ListDecodeError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ListDecodeError";
  }
}

/** Bytes collected over several chunks. */
class Bytes {
  private parts: Uint8Array[] = [];
  private n = 0;

  get empty(): boolean {
    return this.n === 0;
  }

  push(b: Uint8Array): void {
    if (b.length === 0) return;
    this.parts.push(b.slice()); // chunks may be reused by the producer
    this.n += b.length;
  }

  take(): Uint8Array {
    const parts = this.parts;
    this.parts = [];
    const n = this.n;
    this.n = 0;
    if (parts.length === 1) return parts[0];
    const out = new Uint8Array(n);
    let p = 0;
    for (const x of parts) {
      out.set(x, p);
      p += x.length;
    }
    return out;
  }
}

/**
 * Incremental list decoder: feed it the body's chunks in order, then call {@linkcode ListDecoder.end} for the
 * document without its items (kind, apiVersion, metadata).
 */
export class ListDecoder<T> {
  readonly #onItem: (item: T) => void;
  readonly #dec = new TextDecoder();
  #depth = 0;
  #inString = false;
  #escape = false;
  /** Inside the top-level `items` array. */
  #inItems = false;
  #itemsSeen = false;
  /** Collecting an item (from its `{`). */
  #inItem = false;
  readonly #item = new Bytes();
  /** Collecting a top-level string (a key, or a scalar value). */
  #topString: number[] | null = null;
  #lastTopString = "";
  /** Everything but the items' bytes. */
  readonly #skeleton = new Bytes();
  /** Items handed over. */
  count = 0;

  constructor(onItem: (item: T) => void) {
    this.#onItem = onItem;
  }

  /** Scans one chunk; hands over every item that ends in it. */
  push(chunk: Uint8Array): void {
    // The scan state lives in locals for the loop (a field read per byte costs the scan about half its speed)
    // and goes back to the fields at the end; an error leaves the decoder unusable anyway.
    let depth = this.#depth;
    let inString = this.#inString;
    let escape = this.#escape;
    let inItems = this.#inItems;
    let inItem = this.#inItem;
    let topString = this.#topString;
    let itemFrom = inItem ? 0 : -1;
    let skelFrom = inItems && depth >= 2 ? -1 : 0;
    let nextBackslash = -1; // position of the next backslash at or after i (Infinity: none), kept up to date lazily
    const n = chunk.length;
    for (let i = 0; i < n; i++) {
      if (inString && topString === null && !escape) {
        // Most of a list is string contents: jump to the next quote (native search) unless an escape comes first.
        const q = chunk.indexOf(QUOTE, i);
        if (nextBackslash < i) {
          nextBackslash = chunk.indexOf(BACKSLASH, i);
          if (nextBackslash < 0) nextBackslash = Infinity;
        }
        const b = nextBackslash === Infinity ? -1 : nextBackslash;
        if (q < 0 && b < 0) break;
        if (b < 0 || (q >= 0 && q < b)) {
          inString = false;
          i = q;
          continue;
        }
        escape = true;
        i = b;
        continue;
      }
      const c = chunk[i];
      if (inString) {
        if (escape) escape = false;
        else if (c === BACKSLASH) escape = true;
        else if (c === QUOTE) {
          inString = false;
          if (topString !== null) {
            this.#lastTopString = String.fromCharCode(...topString);
            topString = null;
          }
          continue;
        }
        if (topString !== null && topString.length < 16) topString.push(c);
        continue;
      }
      if (depth > 2) {
        // Inside an item: only strings and nesting matter (the common case, kept short).
        if (c === QUOTE) inString = true;
        else if (c === LBRACE || c === LBRACKET) depth++;
        else if (c === RBRACE || c === RBRACKET) {
          depth--;
          if (inItem && depth === 2) {
            const tail = chunk.subarray(itemFrom, i + 1);
            itemFrom = -1;
            inItem = false;
            // An item within one chunk is decoded in place; one spread over chunks from its collected bytes.
            if (this.#item.empty) this.#emit(tail);
            else {
              this.#item.push(tail);
              this.#emit(this.#item.take());
            }
          }
        }
        continue;
      }
      if (inItems && depth === 2 && c !== LBRACE && c !== RBRACKET && c !== COMMA && !isSpace(c)) {
        throw new ListDecodeError("list items must be objects");
      }
      switch (c) {
        case QUOTE:
          inString = true;
          if (depth === 1) topString = [];
          break;
        case LBRACE:
        case LBRACKET:
          if (depth === 1 && c === LBRACKET && this.#lastTopString === ITEMS && !this.#itemsSeen) {
            inItems = true;
            this.#itemsSeen = true;
            // The skeleton keeps the `[`; the items' bytes are left out of it.
            this.#skeleton.push(chunk.subarray(skelFrom, i + 1));
            skelFrom = -1;
          } else if (inItems && depth === 2) {
            inItem = true;
            itemFrom = i;
          }
          depth++;
          break;
        case RBRACE:
        case RBRACKET:
          depth--;
          if (depth < 0) throw new ListDecodeError("unbalanced list document");
          if (inItems && depth === 1) {
            // The closing `]` of items: back to the skeleton.
            inItems = false;
            skelFrom = i;
          }
          break;
      }
    }
    if (itemFrom >= 0) this.#item.push(chunk.subarray(itemFrom));
    if (skelFrom >= 0) this.#skeleton.push(chunk.subarray(skelFrom));
    this.#depth = depth;
    this.#inString = inString;
    this.#escape = escape;
    this.#inItems = inItems;
    this.#inItem = inItem;
    this.#topString = topString;
  }

  #emit(bytes: Uint8Array): void {
    const text = this.#dec.decode(bytes);
    let item: T;
    try {
      item = JSON.parse(text);
    } catch (e) {
      throw new ListDecodeError(`malformed list item: ${text.slice(0, 200)}`, { cause: e });
    }
    this.count++;
    this.#onItem(item);
  }

  /** The document without its items (`items` is `[]`); throws if the body was not a complete list. */
  end<L>(): L {
    if (this.#depth !== 0 || this.#inString || this.#inItem) {
      throw new ListDecodeError("truncated list document");
    }
    const text = this.#dec.decode(this.#skeleton.take());
    try {
      return JSON.parse(text) as L;
    } catch (e) {
      throw new ListDecodeError(`malformed list document: ${text.slice(0, 200)}`, { cause: e });
    }
  }
}
