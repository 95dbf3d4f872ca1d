/**
 * Rollback of a fake transaction: each object's state is saved before its first change, so that a failed
 * transaction (or a check) leaves every table as it was.
 * @module
 */
import type { FakeChain, FakeCounter, FakeSet, FakeTable, FakeTables } from "./fake_objects.ts";

/** Records how to undo the changes of one transaction; each object is saved once, at its first change. */
export class Undo {
  // One record per object and aspect: an object's fields, and separately a set's element map.
  readonly #saved = new Set<object>();
  readonly #savedElements = new Set<FakeSet>();
  readonly #steps: (() => void)[] = [];

  #first(obj: object, save: () => () => void): void {
    if (this.#saved.has(obj)) return;
    this.#saved.add(obj);
    this.#steps.push(save());
  }

  /** Saves the fake's table map (before a table is created or deleted). */
  tables(fake: FakeTables): void {
    this.#first(fake, () => {
      const old = fake.tables;
      fake.tables = new Map(old);
      return () => (fake.tables = old);
    });
  }

  /** Saves a table's object maps, comment and flags. */
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

  /** Saves a chain's rules and use count. */
  chain(c: FakeChain): void {
    this.#first(c, () => {
      const { rules, refs } = c;
      c.rules = rules.slice();
      return () => Object.assign(c, { rules, refs });
    });
  }

  /** Saves a set's use count, flags, timeout, gc-interval and size. */
  setMeta(s: FakeSet): void {
    this.#first(s, () => {
      const { refs, flags, timeout, gcInterval, size } = s;
      return () => Object.assign(s, { refs, flags, timeout, gcInterval, size });
    });
  }

  /** Saves a set's elements. */
  setElements(s: FakeSet): void {
    if (this.#savedElements.has(s)) return;
    this.#savedElements.add(s);
    const old = s.elements;
    s.elements = new Map(old);
    this.#steps.push(() => (s.elements = old));
  }

  /** Saves a counter's use count and values. */
  counter(c: FakeCounter): void {
    this.#first(c, () => {
      const { refs, packets, bytes } = c;
      return () => Object.assign(c, { refs, packets, bytes });
    });
  }

  /** Restores everything saved, latest first. */
  rollback(): void {
    for (let i = this.#steps.length - 1; i >= 0; i--) this.#steps[i]();
  }
}
