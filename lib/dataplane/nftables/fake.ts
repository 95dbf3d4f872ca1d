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
import { type AddrInterval, formatInterval, intervalsOverlap, mergeIntervals } from "./addr.ts";
import { NftablesError, type NftErrorCode } from "./errors.ts";
import type { ListableType, Nftables } from "./interface.ts";
import {
  canonicalValue,
  elementsPerLine,
  formatDuration,
  formatElementList,
  formatPriority,
  type SetDatatypes,
  setDatatypes,
  valueInterval,
} from "./nft_format.ts";
import {
  type Chain,
  type ChainHook,
  type ChainPolicy,
  type ChainType,
  type Counter,
  type Element,
  type Family,
  type NftMap,
  type NftObject,
  type NftSet,
  parsePriority,
  type Rule,
  type SetFlag,
  type SetPolicy,
  type Table,
  type TableFlag,
} from "./objects.ts";
import { canonicalRule, ruleReferences, type RuleRefs } from "./rule_text.ts";
import { type Operation, Transaction } from "./transaction.ts";

/** A rule of a fake chain. */
export interface FakeRule {
  /** The rule text as written in the transaction. */
  readonly rule: string;
  readonly comment?: string;
  readonly handle: number;
  /** Chains, sets and counters it refers to. */
  readonly refs: RuleRefs;
}

/** Base-chain properties (priority as a number). */
export interface FakeBaseChain {
  readonly type: ChainType;
  readonly hook: ChainHook;
  readonly priority: number;
  readonly policy: ChainPolicy;
  readonly device?: string;
}

/** A chain of the fake. */
export class FakeChain {
  /** Rules in order. */
  rules: FakeRule[] = [];
  /** Rules and map elements that jump or go to this chain (the kernel's use count). */
  refs = 0;
  constructor(
    readonly name: string,
    readonly handle: number,
    readonly base: FakeBaseChain | undefined,
    readonly comment: string | undefined,
  ) {}
}

/** An element of a fake set or map, in the form nft prints it. */
export interface FakeElement {
  readonly key: readonly string[];
  readonly value?: readonly string[];
  readonly comment?: string;
  /** Element timeout in seconds. */
  readonly timeout?: number;
  /** For single-part address keys of interval sets: the addresses covered. */
  readonly interval?: AddrInterval;
}

/** A set or map of the fake. */
export class FakeSet {
  /** Elements by key (parts joined with `" . "`), in insertion order. */
  elements: Map<string, FakeElement> = new Map();
  /** Rules referring to it. */
  refs = 0;
  flags: SetFlag[];
  timeout: number | undefined;
  gcInterval: number | undefined;
  size: number | undefined;
  readonly datatypes: SetDatatypes;

  constructor(
    readonly kind: "set" | "map",
    readonly name: string,
    readonly handle: number,
    /** Creation order among the table's sets, maps and counters (the kernel lists them in this order). */
    readonly seq: number,
    /** `type` or `typeof` text as declared (spaces normalized). */
    readonly spec: string,
    readonly isTypeof: boolean,
    flags: SetFlag[],
    timeout: number | undefined,
    gcInterval: number | undefined,
    size: number | undefined,
    readonly policy: SetPolicy | undefined,
    readonly autoMerge: boolean,
    readonly comment: string | undefined,
  ) {
    this.flags = flags;
    this.timeout = timeout;
    this.gcInterval = gcInterval;
    this.size = size;
    this.datatypes = setDatatypes(spec, isTypeof);
  }

  /** Whether the set has the interval flag. */
  get interval(): boolean {
    return this.flags.includes("interval");
  }

  /** The element with this key (parts as written, canonicalized first), if any. */
  find(key: readonly string[]): FakeElement | undefined {
    const canon = canonicalKey(this, key);
    return "error" in canon ? undefined : this.elements.get(canon.id);
  }
}

/** A named counter of the fake. */
export class FakeCounter {
  refs = 0;
  constructor(
    readonly name: string,
    readonly handle: number,
    readonly seq: number,
    readonly comment: string | undefined,
    public packets: number,
    public bytes: number,
  ) {}
}

/** A table of the fake. Its maps are public so tests can inspect them. */
export class FakeTable {
  chains: Map<string, FakeChain> = new Map();
  sets: Map<string, FakeSet> = new Map();
  maps: Map<string, FakeSet> = new Map();
  counters: Map<string, FakeCounter> = new Map();
  nextHandle = 1;
  nextSeq = 0;
  constructor(
    readonly family: Family,
    readonly name: string,
    readonly handle: number,
    public comment: string | undefined,
    public flags: TableFlag[],
  ) {}

  /** A set or map of this name. */
  setOrMap(name: string): FakeSet | undefined {
    return this.sets.get(name) ?? this.maps.get(name);
  }
}

const FLAG_ORDER: readonly SetFlag[] = ["constant", "dynamic", "interval", "timeout"];

function normalizeFlags(flags: readonly SetFlag[] | undefined, timeout: number | undefined): SetFlag[] {
  const set = new Set(flags ?? []);
  if (timeout !== undefined && timeout > 0) set.add("timeout");
  return FLAG_ORDER.filter((f) => set.has(f));
}

/** A failure inside a transaction: the strerror-like reason and its class. */
class Failure extends Error {
  constructor(readonly detail: string, readonly code?: NftErrorCode) {
    super(detail);
  }
}

const notFound = (what: string) => new Failure(`${what}: No such file or directory`, "ENOENT");
const exists = (what: string) => new Failure(`${what}: File exists`, "EEXIST");
const busy = (what: string) => new Failure(`${what}: Device or resource busy`, "EBUSY");

type CanonKey = { id: string; parts: string[]; interval?: AddrInterval } | { error: string };

function canonicalParts(
  datatypes: readonly string[],
  parts: readonly string[],
  interval: boolean,
  what: string,
): string[] | string {
  if (parts.length !== datatypes.length) {
    return `${what} has ${parts.length} part(s) but the type has ${datatypes.length}`;
  }
  const out: string[] = [];
  for (let i = 0; i < parts.length; i++) {
    const c = canonicalValue(datatypes[i], parts[i].trim(), interval);
    if (c.error !== undefined) return c.error;
    out.push(c.text);
  }
  return out;
}

function canonicalKey(set: FakeSet, key: readonly string[]): CanonKey {
  const parts = canonicalParts(set.datatypes.key, key, set.interval, "key");
  if (typeof parts === "string") return { error: parts };
  const interval = set.interval && parts.length === 1
    ? valueInterval(set.datatypes.key[0], parts[0])
    : undefined;
  return { id: parts.join(" . "), parts, interval };
}

function verdictTarget(value: readonly string[] | undefined): string | undefined {
  if (!value || value.length !== 1) return undefined;
  const m = /^(?:jump|goto) (\S+)$/.exec(value[0]);
  return m ? m[1] : undefined;
}

/** Records how to undo the changes of one transaction; each object is saved once, at its first change. */
class Undo {
  // One record per object and aspect: an object's fields, and separately a set's element map.
  readonly #saved = new Set<object>();
  readonly #savedElements = new Set<FakeSet>();
  readonly #steps: (() => void)[] = [];

  #first(obj: object, save: () => () => void): void {
    if (this.#saved.has(obj)) return;
    this.#saved.add(obj);
    this.#steps.push(save());
  }

  tables(fake: FakeNftables): void {
    this.#first(fake, () => {
      const old = fake.tables;
      fake.tables = new Map(old);
      return () => (fake.tables = old);
    });
  }

  table(t: FakeTable): void {
    this.#first(t, () => {
      const { chains, sets, maps, counters, comment, flags } = t;
      t.chains = new Map(chains);
      t.sets = new Map(sets);
      t.maps = new Map(maps);
      t.counters = new Map(counters);
      return () => Object.assign(t, { chains, sets, maps, counters, comment, flags });
    });
  }

  chain(c: FakeChain): void {
    this.#first(c, () => {
      const { rules, refs } = c;
      c.rules = rules.slice();
      return () => Object.assign(c, { rules, refs });
    });
  }

  setMeta(s: FakeSet): void {
    this.#first(s, () => {
      const { refs, flags, timeout, gcInterval, size } = s;
      return () => Object.assign(s, { refs, flags, timeout, gcInterval, size });
    });
  }

  setElements(s: FakeSet): void {
    if (this.#savedElements.has(s)) return;
    this.#savedElements.add(s);
    const old = s.elements;
    s.elements = new Map(old);
    this.#steps.push(() => (s.elements = old));
  }

  counter(c: FakeCounter): void {
    this.#first(c, () => {
      const { refs, packets, bytes } = c;
      return () => Object.assign(c, { refs, packets, bytes });
    });
  }

  rollback(): void {
    for (let i = this.#steps.length - 1; i >= 0; i--) this.#steps[i]();
  }
}

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
    if (tx.error) throw tx.error;
    const undo = new Undo();
    const ops = tx.operations;
    let i = 0;
    try {
      for (; i < ops.length; i++) this.#op(tx, ops[i].verb, ops[i].obj, undo);
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

  #op(tx: Transaction, verb: string, obj: NftObject, undo: Undo): void {
    const key = `${tx.family} ${tx.table}`;
    if (obj.kind === "table") return this.#tableOp(tx, key, verb, obj, undo);
    const t = this.tables.get(key);
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

  #tableOp(tx: Transaction, key: string, verb: string, obj: Table, undo: Undo): void {
    let t = this.tables.get(key);
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
        undo.tables(this);
        this.tables.set(
          key,
          new FakeTable(tx.family, tx.table, this.#nextTableHandle++, obj.comment, [...(obj.flags ?? [])]),
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
        undo.tables(this);
        this.tables.delete(key);
        return;
    }
  }
}

function clearRules(t: FakeTable, c: FakeChain, undo: Undo): void {
  if (c.rules.length === 0) return;
  undo.chain(c);
  for (const r of c.rules) releaseRule(t, r, undo);
  c.rules = [];
}

function releaseRule(t: FakeTable, r: FakeRule, undo: Undo): void {
  for (const name of r.refs.chains) {
    const c = t.chains.get(name);
    if (c) {
      undo.chain(c);
      c.refs--;
    }
  }
  for (const s of r.refs.sets) {
    const set = t.setOrMap(s.name);
    if (set) {
      undo.setMeta(set);
      set.refs--;
    }
  }
  for (const name of r.refs.counters) {
    const c = t.counters.get(name);
    if (c) {
      undo.counter(c);
      c.refs--;
    }
  }
}

function acquireRule(t: FakeTable, r: FakeRule, undo: Undo): void {
  for (const name of r.refs.chains) {
    if (!t.chains.has(name)) throw notFound(`no such chain ${name}`);
  }
  for (const s of r.refs.sets) {
    const set = t.setOrMap(s.name);
    if (!set) throw notFound(`no such ${s.map ? "map" : "set"} ${s.name}`);
    if (s.map && set.kind !== "map") throw new Failure(`@${s.name}: Expression is not a map`);
  }
  for (const name of r.refs.counters) {
    if (!t.counters.has(name)) throw notFound(`no such counter ${name}`);
  }
  for (const name of r.refs.chains) {
    const c = t.chains.get(name) as FakeChain;
    undo.chain(c);
    c.refs++;
  }
  for (const s of r.refs.sets) {
    const set = t.setOrMap(s.name) as FakeSet;
    undo.setMeta(set);
    set.refs++;
    if (s.dynamic) {
      // The kernel's dynset expression turns the set dynamic and gives it a size when it has none.
      if (!set.flags.includes("dynamic")) set.flags = normalizeFlags([...set.flags, "dynamic"], undefined);
      if (!set.size) set.size = 65535;
    }
  }
  for (const name of r.refs.counters) {
    const c = t.counters.get(name) as FakeCounter;
    undo.counter(c);
    c.refs++;
  }
}

function chainOp(t: FakeTable, verb: string, obj: Chain, undo: Undo): void {
  let c = obj.name ? t.chains.get(obj.name) : undefined;
  if (obj.handle !== undefined) {
    c = [...t.chains.values()].find((x) => x.handle === obj.handle && (!obj.name || x.name === obj.name));
  }
  const what = `chain ${obj.name ?? `handle ${obj.handle}`}`;
  switch (verb) {
    case "add":
    case "create": {
      const base: FakeBaseChain | undefined = obj.hook === undefined ? undefined : {
        type: obj.type as ChainType,
        hook: obj.hook,
        priority: parsePriority(t.family, obj.priority as string | number) as number,
        policy: obj.policy ?? "accept",
        ...(obj.device !== undefined ? { device: obj.device } : {}),
      };
      if (c) {
        if (verb === "create") throw exists(what);
        if (base) {
          if (!c.base) throw exists(what);
          const same = c.base.type === base.type && c.base.hook === base.hook &&
            c.base.priority === base.priority &&
            c.base.device === base.device;
          if (!same) throw new Failure(`${what}: Operation not supported`);
        }
        return;
      }
      undo.table(t);
      t.chains.set(obj.name, new FakeChain(obj.name, t.nextHandle++, base, obj.comment));
      return;
    }
    case "flush":
      if (!c) throw notFound(what);
      clearRules(t, c, undo);
      return;
    case "delete":
    case "destroy":
      if (!c) {
        if (verb === "destroy") return;
        throw notFound(what);
      }
      if (c.refs > 0) throw busy(what);
      clearRules(t, c, undo);
      undo.table(t);
      t.chains.delete(c.name);
      return;
  }
}

function ruleIndex(c: FakeChain, handle: number): number {
  return c.rules.findIndex((r) => r.handle === handle);
}

function ruleOp(t: FakeTable, verb: string, obj: Rule, undo: Undo): void {
  const c = t.chains.get(obj.chain);
  if (!c) throw notFound(`no such chain ${obj.chain}`);
  let at = -1;
  if (obj.handle !== undefined) {
    at = ruleIndex(c, obj.handle);
    if (at === -1) {
      if (verb === "destroy") return;
      throw notFound(`no rule with handle ${obj.handle} in chain ${obj.chain}`);
    }
  } else if (obj.index !== undefined) {
    if (obj.index >= c.rules.length) throw notFound(`no rule at index ${obj.index} in chain ${obj.chain}`);
    at = obj.index;
  }
  if (verb === "delete" || verb === "destroy") {
    undo.chain(c);
    releaseRule(t, c.rules[at], undo);
    c.rules.splice(at, 1);
    return;
  }
  const text = obj.rule as string;
  const handle = verb === "replace" ? c.rules[at].handle : t.nextHandle++;
  const rule: FakeRule = {
    rule: text,
    handle,
    refs: ruleReferences(text),
    ...(obj.comment !== undefined ? { comment: obj.comment } : {}),
  };
  acquireRule(t, rule, undo);
  undo.chain(c);
  if (verb === "replace") {
    releaseRule(t, c.rules[at], undo);
    c.rules[at] = rule;
  } else if (verb === "add") {
    if (at === -1) c.rules.push(rule);
    else c.rules.splice(at + 1, 0, rule);
  } else {
    c.rules.splice(at === -1 ? 0 : at, 0, rule);
  }
}

function setOp(t: FakeTable, verb: string, obj: NftSet | NftMap, undo: Undo): void {
  let s = obj.name ? t.setOrMap(obj.name) : undefined;
  if (obj.handle !== undefined) {
    s = [...t.sets.values(), ...t.maps.values()].find((x) => x.handle === obj.handle);
  }
  const what = `${obj.kind} ${obj.name ?? `handle ${obj.handle}`}`;
  switch (verb) {
    case "add":
    case "create": {
      const isTypeof = obj.type === undefined || obj.type === "";
      const spec = ((isTypeof ? obj.typeof : obj.type) as string).trim().replace(/\s+/g, " ");
      const flags = normalizeFlags(obj.flags, obj.timeout);
      if (s) {
        if (verb === "create") throw exists(what);
        const dt = setDatatypes(spec, isTypeof);
        const sameType = s.kind === obj.kind && dt.key.join(" . ") === s.datatypes.key.join(" . ") &&
          (dt.value ?? []).join(" . ") === (s.datatypes.value ?? []).join(" . ");
        if (!sameType || flags.join(",") !== s.flags.join(",")) throw exists(what);
        // Kernel 6.18 updates these on a re-add: timeout and gc-interval always, size when given.
        undo.setMeta(s);
        s.timeout = obj.timeout || undefined;
        s.gcInterval = obj.gcInterval || undefined;
        if (obj.size) s.size = obj.size;
        return;
      }
      undo.table(t);
      const created = new FakeSet(
        obj.kind,
        obj.name,
        t.nextHandle++,
        t.nextSeq++,
        spec,
        isTypeof,
        flags,
        obj.timeout || undefined,
        obj.gcInterval || undefined,
        obj.size || undefined,
        obj.policy,
        obj.kind === "set" && obj.autoMerge === true,
        obj.comment,
      );
      (obj.kind === "set" ? t.sets : t.maps).set(obj.name, created);
      return;
    }
    case "flush":
      if (!s || s.kind !== obj.kind) throw notFound(what);
      clearElements(t, s, undo);
      return;
    case "delete":
    case "destroy":
      if (!s || s.kind !== obj.kind) {
        if (verb === "destroy") return;
        throw notFound(what);
      }
      if (s.refs > 0) throw busy(what);
      clearElements(t, s, undo);
      undo.table(t);
      (s.kind === "set" ? t.sets : t.maps).delete(s.name);
      return;
  }
}

function clearElements(t: FakeTable, s: FakeSet, undo: Undo): void {
  if (s.elements.size === 0) return;
  if (s.kind === "map") {
    for (const e of s.elements.values()) releaseElement(t, e, undo);
  }
  undo.setElements(s);
  s.elements = new Map();
}

function releaseElement(t: FakeTable, e: FakeElement, undo: Undo): void {
  const target = verdictTarget(e.value);
  const c = target === undefined ? undefined : t.chains.get(target);
  if (c) {
    undo.chain(c);
    c.refs--;
  }
}

function elementOp(t: FakeTable, verb: string, obj: Element, undo: Undo): void {
  const name = (obj.set ?? obj.map) as string;
  const s = t.setOrMap(name);
  if (!s) throw notFound(`no such ${obj.set ? "set" : "map"} ${name}`);
  const canon = canonicalKey(s, obj.key);
  if ("error" in canon) throw new Failure(`element of ${s.kind} ${name}: ${canon.error}`);
  const existing = s.elements.get(canon.id);
  const what = `element ${canon.id} of ${s.kind} ${name}`;
  if (verb === "delete" || verb === "destroy") {
    if (!existing) {
      if (verb === "destroy") return;
      // nft itself rejects this for interval sets, without an errno.
      if (s.interval) throw new Failure(`${what}: element does not exist`);
      throw notFound(what);
    }
    if (s.kind === "map") releaseElement(t, existing, undo);
    undo.setElements(s);
    s.elements.delete(canon.id);
    return;
  }
  // add / create
  let value: string[] | undefined;
  if (s.kind === "map") {
    if (!obj.value || obj.value.length === 0) throw new Failure(`${what}: map element needs a value`);
    const v = canonicalParts(s.datatypes.value ?? [], obj.value, false, "value");
    if (typeof v === "string") throw new Failure(`${what}: ${v}`);
    value = v;
  } else if (obj.value && obj.value.length) {
    throw new Failure(`${what}: set element with a value`);
  }
  if (obj.timeout !== undefined && !s.flags.includes("timeout")) {
    throw new Failure(`${what}: timeout on a set without the timeout flag: Invalid argument`);
  }
  if (existing) {
    if (verb === "create") throw exists(what);
    if ((existing.value ?? []).join(" . ") !== (value ?? []).join(" . ")) throw exists(what);
    return; // the kernel keeps the existing element (and its comment)
  }
  const target = verdictTarget(value);
  if (target !== undefined && !t.chains.has(target)) throw notFound(`no such chain ${target}`);
  const elem: FakeElement = {
    key: canon.parts,
    ...(value ? { value } : {}),
    ...(obj.comment !== undefined ? { comment: obj.comment } : {}),
    ...(obj.timeout !== undefined ? { timeout: obj.timeout } : {}),
    ...(canon.interval ? { interval: canon.interval } : {}),
  };
  if (canon.interval) {
    const overlapping = [...s.elements.values()].filter((e) =>
      e.interval && intervalsOverlap(e.interval, canon.interval!)
    );
    if (overlapping.length) {
      if (!s.autoMerge) throw new Failure(`${what}: interval overlaps with an existing one`);
      addMerged(s, overlapping, elem, undo);
      return;
    }
    if (s.autoMerge) {
      const adjacent = [...s.elements.values()].filter((e) =>
        e.interval &&
        (e.interval.end + 1n === canon.interval!.start || canon.interval!.end + 1n === e.interval.start)
      );
      if (adjacent.length) {
        addMerged(s, adjacent, elem, undo);
        return;
      }
    }
  }
  if (target !== undefined) {
    const c = t.chains.get(target) as FakeChain;
    undo.chain(c);
    c.refs++;
  }
  undo.setElements(s);
  s.elements.set(canon.id, elem);
}

/** auto-merge: replaces `others` and `elem` with their union. */
function addMerged(s: FakeSet, others: FakeElement[], elem: FakeElement, undo: Undo): void {
  undo.setElements(s);
  for (const o of others) s.elements.delete(o.key.join(" . "));
  const merged = mergeIntervals([...others.map((o) => o.interval!), elem.interval!]);
  for (const iv of merged) {
    const c = canonicalKey(s, [formatInterval(iv)]);
    if ("error" in c) continue;
    s.elements.set(c.id, { key: c.parts, ...(c.interval ? { interval: c.interval } : {}) });
  }
}

function counterOp(t: FakeTable, verb: string, obj: Counter, undo: Undo): void {
  let c = obj.name ? t.counters.get(obj.name) : undefined;
  if (obj.handle !== undefined) c = [...t.counters.values()].find((x) => x.handle === obj.handle);
  const what = `counter ${obj.name ?? `handle ${obj.handle}`}`;
  switch (verb) {
    case "add":
    case "create":
      if (c) {
        if (verb === "create") throw exists(what);
        return;
      }
      undo.table(t);
      t.counters.set(
        obj.name,
        new FakeCounter(obj.name, t.nextHandle++, t.nextSeq++, obj.comment, obj.packets ?? 0, obj.bytes ?? 0),
      );
      return;
    case "reset":
      if (!c) throw notFound(what);
      undo.counter(c);
      c.packets = 0;
      c.bytes = 0;
      return;
    case "delete":
    case "destroy":
      if (!c) {
        if (verb === "destroy") return;
        throw notFound(what);
      }
      if (c.refs > 0) throw busy(what);
      undo.table(t);
      t.counters.delete(c.name);
      return;
  }
}

/** Elements in the order nft lists them: interval sets sorted by address, others in insertion order. */
function orderedElements(s: FakeSet): FakeElement[] {
  const list = [...s.elements.values()];
  if (s.interval) {
    list.sort((a, b) => {
      if (!a.interval || !b.interval) return 0;
      return a.interval.start < b.interval.start ? -1 : a.interval.start > b.interval.start ? 1 : 0;
    });
  }
  return list;
}

function printElement(s: FakeSet, e: FakeElement): string {
  let out = e.key.join(" . ");
  if (e.timeout !== undefined && e.timeout !== s.timeout) {
    out += ` timeout ${formatDuration(e.timeout * 1000)}`;
  }
  if (e.comment !== undefined) out += ` comment "${e.comment}"`;
  if (e.value) out += ` : ${e.value.join(" . ")}`;
  return out;
}

function dumpSet(s: FakeSet): string {
  let out = `\t${s.kind} ${s.name} {\n\t\t${s.isTypeof ? "typeof" : "type"} ${s.spec}\n`;
  if (!s.flags.includes("constant")) {
    if (s.policy === "memory") out += "\t\tpolicy memory\n";
    if (s.size) out += `\t\tsize ${s.size}\n`;
  }
  const shown = s.timeout ? s.flags.filter((f) => f !== "timeout") : s.flags;
  if (shown.length) out += `\t\tflags ${s.flags.join(",")}\n`;
  if (s.autoMerge) out += "\t\tauto-merge\n";
  if (s.timeout) out += `\t\ttimeout ${formatDuration(s.timeout * 1000)}\n`;
  if (s.gcInterval) out += `\t\tgc-interval ${formatDuration(s.gcInterval * 1000)}\n`;
  if (s.comment !== undefined) out += `\t\tcomment "${s.comment}"\n`;
  if (s.elements.size) {
    const items = orderedElements(s).map((e) => printElement(s, e));
    out += `\t\telements = ${formatElementList(items, elementsPerLine(s.datatypes.key))}\n`;
  }
  return out + "\t}\n";
}

function dumpChain(t: FakeTable, c: FakeChain): string {
  let out = `\tchain ${c.name} {\n`;
  if (c.comment !== undefined) out += `\t\tcomment "${c.comment}"\n`;
  if (c.base) {
    out += `\t\ttype ${c.base.type} hook ${c.base.hook}`;
    if (c.base.device !== undefined) out += ` device "${c.base.device}"`;
    out += ` priority ${formatPriority(t.family, c.base.hook, c.base.priority)}; policy ${c.base.policy};\n`;
  }
  for (const r of c.rules) {
    out += `\t\t${canonicalRule(r.rule)}`;
    if (r.comment !== undefined) out += ` comment "${r.comment}"`;
    out += "\n";
  }
  return out + "\t}\n";
}

function dumpTable(t: FakeTable): string {
  const parts: string[] = [`table ${t.family} ${t.name} {\n`];
  let delim = "";
  if (t.flags.length) {
    parts.push(`\tflags ${t.flags.join(",")}\n`);
    delim = "\n";
  }
  if (t.comment !== undefined) parts.push(`\tcomment "${t.comment}"\n`);
  for (const c of [...t.counters.values()].sort((a, b) => a.seq - b.seq)) {
    let block = `\tcounter ${c.name} {\n`;
    if (c.comment !== undefined) block += `\t\tcomment "${c.comment}"\n`;
    block += `\t\tpackets ${c.packets} bytes ${c.bytes}\n\t}\n`;
    parts.push(delim, block);
    delim = "\n";
  }
  for (const s of [...t.sets.values(), ...t.maps.values()].sort((a, b) => a.seq - b.seq)) {
    parts.push(delim, dumpSet(s));
    delim = "\n";
  }
  for (const c of t.chains.values()) {
    parts.push(delim, dumpChain(t, c));
    delim = "\n";
  }
  parts.push("}\n");
  return parts.join("");
}
