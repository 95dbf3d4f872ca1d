/**
 * Application of a transaction to the fake's tables, all or nothing: each operation goes to its kind's handler,
 * and a failure rolls back every change made so far.
 * @module
 */
import { NftablesError } from "./errors.ts";
import { chainOp, clearRules, counterOp, ruleOp } from "./fake_chain_ops.ts";
import { exists, Failure, notFound } from "./fake_errors.ts";
import { FakeTable, type FakeTables } from "./fake_objects.ts";
import { elementOp, setOp } from "./fake_set_ops.ts";
import { Undo } from "./fake_undo.ts";
import type { NftObject, Table } from "./objects.ts";
import type { Transaction } from "./transaction.ts";

/**
 * Applies the transaction to the tables of `fake`, all or nothing (`dryRun`: nothing, only checked); a failing
 * step rolls back and throws an {@linkcode NftablesError} naming its input line. `newTableHandle` numbers a
 * created table.
 */
export function applyTransaction(
  fake: FakeTables,
  newTableHandle: () => number,
  tx: Transaction,
  dryRun: boolean,
): void {
  if (tx.error) throw tx.error;
  const undo = new Undo();
  const ops = tx.operations;
  let i = 0;
  try {
    for (; i < ops.length; i++) applyOp(fake, newTableHandle, tx, ops[i].verb, ops[i].obj, undo);
  } catch (err) {
    undo.rollback();
    if (!(err instanceof Failure)) throw err;
    const inputLine = tx.line(i);
    throw new NftablesError(`${err.detail} (line ${i + 1}: ${inputLine})`, {
      code: err.code,
      line: i + 1,
      inputLine,
    });
  }
  if (dryRun) undo.rollback();
}

/** Applies one operation of the transaction. */
function applyOp(
  fake: FakeTables,
  newTableHandle: () => number,
  tx: Transaction,
  verb: string,
  obj: NftObject,
  undo: Undo,
): void {
  const key = `${tx.family} ${tx.table}`;
  if (obj.kind === "table") return tableOp(fake, newTableHandle, tx, key, verb, obj, undo);
  const t = fake.tables.get(key);
  if (!t) throw notFound(`no such table ${key}`);
  switch (obj.kind) {
    case "chain":
      return chainOp(t, verb, obj, undo);
    case "rule":
      return ruleOp(t, verb, obj, undo);
    case "set":
    case "map":
      return setOp(t, verb, obj, undo);
    case "element":
      return elementOp(t, verb, obj, undo);
    case "counter":
      return counterOp(t, verb, obj, undo);
  }
}

function tableOp(
  fake: FakeTables,
  newTableHandle: () => number,
  tx: Transaction,
  key: string,
  verb: string,
  obj: Table,
  undo: Undo,
): void {
  let t = fake.tables.get(key);
  if (obj.handle !== undefined && t && t.handle !== obj.handle) t = undefined;
  switch (verb) {
    case "add":
    case "create":
      if (t) {
        if (verb === "create") throw exists(`table ${key}`);
        if (obj.flags) {
          undo.table(t);
          t.flags = [...obj.flags];
        }
        return;
      }
      undo.tables(fake);
      fake.tables.set(
        key,
        new FakeTable(tx.family, tx.table, newTableHandle(), obj.comment, [...(obj.flags ?? [])]),
      );
      return;
    case "flush":
      if (!t) throw notFound(`no such table ${key}`);
      for (const c of t.chains.values()) clearRules(t, c, undo);
      return;
    case "delete":
    case "destroy":
      if (!t) {
        if (verb === "destroy") return;
        throw notFound(`no such table ${key}`);
      }
      undo.tables(fake);
      fake.tables.delete(key);
      return;
  }
}
