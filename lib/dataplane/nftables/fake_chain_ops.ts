/**
 * The chain, rule and counter operations of a fake transaction, with the use counts rules hold on the chains,
 * sets, maps and counters they refer to.
 * @module
 */
import {
  type FakeBaseChain,
  FakeChain,
  FakeCounter,
  type FakeRule,
  type FakeSet,
  type FakeTable,
  normalizeFlags,
} from "./fake_objects.ts";
import { busy, exists, Failure, notFound } from "./fake_errors.ts";
import type { Undo } from "./fake_undo.ts";
import { type Chain, type ChainType, type Counter, parsePriority, type Rule } from "./objects.ts";
import { ruleReferences } from "./rule_text.ts";

/** Deletes every rule of the chain, releasing what they refer to. */
export function clearRules(t: FakeTable, c: FakeChain, undo: Undo): void {
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

/** Applies one chain operation (`add`, `create`, `flush`, `delete`, `destroy`) to the table. */
export function chainOp(t: FakeTable, verb: string, obj: Chain, undo: Undo): void {
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

/** Applies one rule operation (`add`, `insert`, `replace`, `delete`, `destroy`; by index or handle) to the table. */
export function ruleOp(t: FakeTable, verb: string, obj: Rule, undo: Undo): void {
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

/** Applies one counter operation (`add`, `create`, `reset`, `delete`, `destroy`) to the table. */
export function counterOp(t: FakeTable, verb: string, obj: Counter, undo: Undo): void {
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
