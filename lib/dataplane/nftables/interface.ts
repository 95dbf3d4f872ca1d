/**
 * The one small interface every nftables user in the agent talks to, with two implementations:
 * `NftablesRunner` (real `nft`, nft_runner.ts) and `FakeNftables` (in memory, fake.ts).
 * @module
 */
import type { Element, Family } from "./objects.ts";
import type { Operation, Transaction } from "./transaction.ts";

/** Object types whose names can be listed. */
export type ListableType = "chain" | "set" | "map" | "counter";

/** nftables access for one table (`family` + `table`). */
export interface Nftables {
  readonly family: Family;
  readonly table: string;
  /** A new empty transaction for this table. */
  newTransaction(): Transaction;
  /**
   * Applies the transaction atomically.
   * @throws {NftablesError} when it is invalid or the kernel rejects it (nothing is changed then)
   */
  run(tx: Transaction): Promise<void>;
  /**
   * Applies the operations as one transaction, produced while it is sent (`nft -f -` reads them as they are
   * written: no transaction-sized text or buffer). Each operation is checked as the transaction checks it; an
   * invalid one, or an exception of the producer, stops the run before anything is applied.
   * @returns the input's size in bytes
   * @throws {NftablesError} when an operation is invalid or the kernel rejects the transaction (nothing is
   * changed then); an exception of the producer as it is
   */
  runOperations(ops: Iterable<Operation>): Promise<number>;
  /**
   * Checks the transaction without applying it (`nft --check`).
   * @throws {NftablesError} as run() would
   */
  check(tx: Transaction): Promise<void>;
  /** Whether the table exists. */
  tableExists(): Promise<boolean>;
  /**
   * Names of the table's objects of one type, in the kernel's order.
   * @throws {NftablesError} with code ENOENT when the table does not exist
   */
  list(type: ListableType): Promise<string[]>;
  /**
   * Names of all the table's chains, sets, maps and counters by type.
   * @throws {NftablesError} with code ENOENT when the table does not exist
   */
  listAll(): Promise<Record<ListableType, string[]>>;
  /**
   * The elements of a set or map, keys and values as nft prints them.
   * @throws {NftablesError} with code ENOENT when the table or the set/map does not exist
   */
  listElements(type: "set" | "map", name: string): Promise<Element[]>;
  /**
   * Deletes the table and everything in it.
   * @returns false when there was no such table
   * @throws {NftablesError} on any other failure
   */
  deleteTable(): Promise<boolean>;
}
