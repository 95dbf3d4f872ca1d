/**
 * A transaction: operations on one table of one family, sent to the kernel as one `nft -f -` batch
 * (all or nothing). Building never throws: the first invalid operation is kept and reported when the
 * transaction is run, as in knftables.
 * @module
 */
import { NftablesError } from "./errors.ts";
import {
  type Chain,
  type Counter,
  type Family,
  type NftMap,
  type NftObject,
  type NftSet,
  type Rule,
  type Table,
  validateObject,
  type Verb,
  writeObject,
} from "./objects.ts";

/** One queued operation. */
export interface Operation {
  readonly verb: Verb;
  readonly obj: NftObject;
}

const FAMILIES: readonly Family[] = ["ip", "ip6", "inet", "arp", "bridge", "netdev"];
const encoder = new TextEncoder();

/**
 * Operations on one table (`family` + `table`), in order. The transaction keeps references to the objects
 * passed in: do not change an object after adding it.
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { Transaction } from "./transaction.ts";
 * const tx = new Transaction("ip", "kube-proxy");
 * tx.add({ kind: "table", comment: "rules for kube-proxy" });
 * tx.add({ kind: "chain", name: "services" });
 * tx.flush({ kind: "chain", name: "services" });
 * assert.equal(
 *   tx.toString(),
 *   'add table ip kube-proxy { comment "rules for kube-proxy" ; }\n' +
 *     "add chain ip kube-proxy services\nflush chain ip kube-proxy services\n",
 * );
 * ```
 */
export class Transaction {
  readonly #ops: Operation[] = [];
  #error: NftablesError | undefined;

  /**
   * @param family the table's family (`ip` or `ip6` for kube-proxy)
   * @param table the table's name (`kube-proxy`)
   */
  constructor(readonly family: Family, readonly table: string) {
    if (!FAMILIES.includes(family)) {
      this.#error = new NftablesError(`invalid nftables family ${JSON.stringify(family)}`, { invalid: true });
    } else if (!/^[A-Za-z_][A-Za-z0-9_./-]{0,254}$/.test(table)) {
      this.#error = new NftablesError(`invalid table name ${JSON.stringify(table)}`, { invalid: true });
    }
  }

  /** The first invalid operation's error; such a transaction is never sent. */
  get error(): NftablesError | undefined {
    return this.#error;
  }

  /** The queued operations, in order (operation i is input line i + 1). */
  get operations(): readonly Operation[] {
    return this.#ops;
  }

  /** Number of queued operations. */
  get numOperations(): number {
    return this.#ops.length;
  }

  #queue(verb: Verb, obj: NftObject): void {
    if (this.#error) return;
    const problem = validateObject(verb, obj, this.family);
    if (problem !== undefined) {
      this.#error = new NftablesError(
        `invalid operation ${this.#ops.length + 1} (${verb} ${obj.kind}): ${problem}`,
        { invalid: true },
      );
      return;
    }
    this.#ops.push({ verb, obj });
  }

  /** `nft add`: ensures obj exists (a rule is appended, or placed after `index`/`handle`). */
  add(obj: NftObject): void {
    this.#queue("add", obj);
  }

  /** `nft create`: creates obj, which must not exist yet (else EEXIST when run). */
  create(obj: NftObject): void {
    this.#queue("create", obj);
  }

  /** `nft insert`: puts a rule at the start of its chain, or before `index`/`handle`. */
  insert(obj: Rule): void {
    this.#queue("insert", obj);
  }

  /** `nft replace`: replaces the rule with the given `handle`. */
  replace(obj: Rule): void {
    this.#queue("replace", obj);
  }

  /** `nft flush`: empties a table (its chains' rules), a chain, a set or a map, which must exist. */
  flush(obj: Table | Chain | NftSet | NftMap): void {
    this.#queue("flush", obj);
  }

  /** `nft delete`: deletes obj, which must exist (rules by `handle`). */
  delete(obj: NftObject): void {
    this.#queue("delete", obj);
  }

  /**
   * `nft destroy`: deletes obj if it exists. Needs nft ≥ 1.0.7 and kernel ≥ 6.3; kube-proxy uses add then
   * delete instead.
   */
  destroy(obj: NftObject): void {
    this.#queue("destroy", obj);
  }

  /** `nft reset`: zeroes a named counter. */
  reset(obj: Counter): void {
    this.#queue("reset", obj);
  }

  /** Queues an operation of any verb (checked as the verb's own method checks it). */
  push(op: Operation): void {
    this.#queue(op.verb, op.obj);
  }

  /** The input lines, one per operation, without newlines. */
  lines(): string[] {
    const out = new Array<string>(this.#ops.length);
    for (let i = 0; i < this.#ops.length; i++) {
      const op = this.#ops[i];
      out[i] = writeObject(op.verb, op.obj, this.family, this.table);
    }
    return out;
  }

  /** The input line of operation `index` (from 0). */
  line(index: number): string | undefined {
    const op = this.#ops[index];
    return op ? writeObject(op.verb, op.obj, this.family, this.table) : undefined;
  }

  /** The exact `nft -f -` input, one line per operation; ends with `# ERROR: …` if an operation was invalid. */
  toString(): string {
    const body = this.#ops.length === 0 ? "" : this.lines().join("\n") + "\n";
    return this.#error ? `${body}# ERROR: ${this.#error.message}` : body;
  }

  /** Size in bytes of the `nft -f -` input (UTF-8), without building the byte array. */
  byteLength(): number {
    let n = 0;
    for (const line of this.lines()) {
      n += line.length + 1;
      for (let i = 0; i < line.length; i++) {
        const c = line.charCodeAt(i);
        if (c < 0x80) continue;
        if (c < 0x800) n += 1;
        else if (c >= 0xd800 && c <= 0xdbff) {
          n += 2; // a surrogate pair: 4 bytes for 2 UTF-16 units
          i++;
        } else n += 2;
      }
    }
    return n;
  }

  /** The `nft -f -` input as UTF-8 bytes (without the error line). */
  encode(): Uint8Array {
    return encoder.encode(this.#ops.length === 0 ? "" : this.lines().join("\n") + "\n");
  }
}
