/**
 * An in-memory nftables for tests: applies a {@linkcode Transaction} all or nothing with the kernel's
 * semantics and error classes, and {@linkcode FakeNftables.dump} prints a table exactly as
 * `nft list table` does (nft 1.0.6, kernel 6.18), so that tests can compare the fake with the kernel.
 *
 * Semantics reproduced (each checked against the kernel in tests/dataplane/nftables/kernel_test.ts):
 * - `add` of an existing table, chain, set, map, counter or identical element is a no-op (a new comment is
 *   ignored); `create` of one fails with EEXIST; a base chain re-added with other type/hook/priority fails
 *   with EOPNOTSUPP ("Operation not supported"), a regular chain re-added as a base chain with EEXIST; a set
 *   re-added with another type or other flags fails with EEXIST, with the same ones it takes the new
 *   timeout and gc-interval (none clears them) and size (if given), as kernel 6.18 does;
 * - adding a map element whose key exists with another value fails with EEXIST;
 * - delete/flush/replace of a missing object, a rule naming a missing chain (`jump`/`goto`, also inside an
 *   anonymous vmap), set or map (`@name`) or counter, an element naming a missing chain, a rule `index` or
 *   `handle` that does not exist: ENOENT;
 * - deleting a chain still referenced by a rule or a map element, or a set/map/counter referenced by a
 *   rule, fails with EBUSY ("Device or resource busy"); deleting a chain deletes its rules;
 * - a rule with `update @s` / `add @s` makes set `s` dynamic and, if it had no size, size 65535;
 * - `flush table` empties every chain but not sets or maps;
 * - element timeouts need a timeout set (else "Invalid argument"); interval sets reject overlapping
 *   elements unless auto-merge merges them; element keys and values are checked against the datatypes
 *   and stored in the form nft prints (`fd00:0::1` → `fd00::1`, `10.0.0.0-10.0.0.255` → `10.0.0.0/24`).
 *
 * Not reproduced: rule syntax and expression type checks, chain type/hook compatibility (e.g. `dnat`
 * reachable from a filter chain: EOPNOTSUPP in the kernel), jump loops (ELOOP), counters' traffic.
 * @module
 */
import { NftablesError } from "./errors.ts";
import { applyTransaction } from "./fake_apply.ts";
import { dumpTable, orderedElements } from "./fake_dump.ts";
import type { FakeSet, FakeTable } from "./fake_objects.ts";
import type { ListableType, Nftables } from "./interface.ts";
import type { Element, Family } from "./objects.ts";
import { type Operation, Transaction } from "./transaction.ts";

export {
  type FakeBaseChain,
  FakeChain,
  FakeCounter,
  type FakeElement,
  type FakeRule,
  FakeSet,
  FakeTable,
} from "./fake_objects.ts";

/**
 * An in-memory nftables holding any number of tables. It implements {@linkcode Nftables} for its default
 * table and runs transactions for any table.
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { FakeNftables } from "./fake.ts";
 * const nft = new FakeNftables("ip", "kube-proxy");
 * const tx = nft.newTransaction();
 * tx.add({ kind: "table" });
 * tx.add({ kind: "chain", name: "services" });
 * await nft.run(tx);
 * assert.equal(nft.dump(), "table ip kube-proxy {\n\tchain services {\n\t}\n}\n");
 * ```
 */
export class FakeNftables implements Nftables {
  /** All tables, keyed `"<family> <name>"`, in creation order. */
  tables: Map<string, FakeTable> = new Map();
  /** The last transaction given to run() (not check()). */
  lastTransaction: Transaction | undefined;
  #nextTableHandle = 1;

  /**
   * @param family family of the default table
   * @param table name of the default table
   */
  constructor(readonly family: Family, readonly table: string) {}

  /** The default table, once it exists. */
  get defaultTable(): FakeTable | undefined {
    return this.tables.get(`${this.family} ${this.table}`);
  }

  /** A table by family and name. */
  getTable(family: Family, name: string): FakeTable | undefined {
    return this.tables.get(`${family} ${name}`);
  }

  /** A new transaction for the default table. */
  newTransaction(): Transaction {
    return new Transaction(this.family, this.table);
  }

  /**
   * Applies the operations as one transaction of the default table through run() (so a subclass that
   * records run() sees it); the input's size in bytes.
   */
  async runOperations(ops: Iterable<Operation>): Promise<number> {
    const tx = this.newTransaction();
    for (const op of ops) tx.push(op);
    await this.run(tx);
    return tx.byteLength();
  }

  /** Applies tx to its own table (any family/name), all or nothing. */
  run(tx: Transaction): Promise<void> {
    this.lastTransaction = tx;
    try {
      this.#apply(tx, false);
      return Promise.resolve();
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Checks tx as run() would, changing nothing. */
  check(tx: Transaction): Promise<void> {
    try {
      this.#apply(tx, true);
      return Promise.resolve();
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Whether the default table exists. */
  tableExists(): Promise<boolean> {
    return Promise.resolve(this.defaultTable !== undefined);
  }

  #mustTable(): FakeTable {
    const t = this.defaultTable;
    if (!t) {
      throw new NftablesError(`no such table ${this.family} ${this.table}: No such file or directory`, {
        code: "ENOENT",
      });
    }
    return t;
  }

  /** Names of the default table's objects of one type, in the kernel's order. */
  list(type: ListableType): Promise<string[]> {
    try {
      return Promise.resolve(this.#listAll()[type]);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Names of all objects of the default table by type. */
  listAll(): Promise<Record<ListableType, string[]>> {
    try {
      return Promise.resolve(this.#listAll());
    } catch (err) {
      return Promise.reject(err);
    }
  }

  #listAll(): Record<ListableType, string[]> {
    const t = this.#mustTable();
    const bySeq = (m: Map<string, FakeSet>) =>
      [...m.values()].sort((a, b) => a.seq - b.seq).map((s) => s.name);
    return {
      chain: [...t.chains.keys()],
      set: bySeq(t.sets),
      map: bySeq(t.maps),
      counter: [...t.counters.values()].sort((a, b) => a.seq - b.seq).map((c) => c.name),
    };
  }

  /** Elements of a set or map of the default table, as nft lists them. */
  listElements(type: "set" | "map", name: string): Promise<Element[]> {
    try {
      const t = this.#mustTable();
      const s = type === "set" ? t.sets.get(name) : t.maps.get(name);
      if (!s) {
        throw new NftablesError(`no such ${type} ${name}: No such file or directory`, { code: "ENOENT" });
      }
      const out: Element[] = [];
      for (const e of orderedElements(s)) {
        const base = type === "set" ? { kind: "element" as const, set: name, key: e.key } : {
          kind: "element" as const,
          map: name,
          key: e.key,
          value: e.value,
        };
        out.push({
          ...base,
          ...(e.comment !== undefined ? { comment: e.comment } : {}),
          ...(e.timeout !== undefined ? { timeout: e.timeout } : {}),
        });
      }
      return Promise.resolve(out);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /** Deletes the default table; false when it did not exist. */
  async deleteTable(): Promise<boolean> {
    if (!this.defaultTable) return false;
    const tx = this.newTransaction();
    tx.delete({ kind: "table" });
    await this.run(tx);
    return true;
  }

  /**
   * The default table (or the given one) as `nft list table <family> <name>` prints it, without the
   * kernel's run-time state: no `expires` on elements, counters at their initial values. Elements of
   * interval sets are sorted as the kernel sorts them; others keep insertion order (the kernel's hash
   * order is unpredictable). Empty string when the table does not exist.
   */
  dump(family: Family = this.family, name: string = this.table): string {
    const t = this.getTable(family, name);
    return t ? dumpTable(t) : "";
  }

  #apply(tx: Transaction, dryRun: boolean): void {
    applyTransaction(this, () => this.#nextTableHandle++, tx, dryRun);
  }
}
