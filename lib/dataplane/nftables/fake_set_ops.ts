/**
 * The set, map and element operations of a fake transaction: type and flag checks on re-adding a set, element
 * keys and values checked and stored as nft prints them, interval overlap and auto-merge, and the use counts
 * verdict map elements hold on the chains they jump or go to.
 * @module
 */
import { formatInterval, intervalsOverlap, mergeIntervals } from "./addr.ts";
import {
  canonicalKey,
  canonicalParts,
  type FakeChain,
  type FakeElement,
  FakeSet,
  type FakeTable,
  normalizeFlags,
} from "./fake_objects.ts";
import { busy, exists, Failure, notFound } from "./fake_errors.ts";
import type { Undo } from "./fake_undo.ts";
import { setDatatypes } from "./nft_format.ts";
import type { Element, NftMap, NftSet } from "./objects.ts";

function verdictTarget(value: readonly string[] | undefined): string | undefined {
  if (!value || value.length !== 1) return undefined;
  const m = /^(?:jump|goto) (\S+)$/.exec(value[0]);
  return m ? m[1] : undefined;
}

/** Applies one set or map operation (`add`, `create`, `flush`, `delete`, `destroy`) to the table. */
export function setOp(t: FakeTable, verb: string, obj: NftSet | NftMap, undo: Undo): void {
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

/** Applies one element operation (`add`, `create`, `delete`, `destroy`) to the table. */
export function elementOp(t: FakeTable, verb: string, obj: Element, undo: Undo): void {
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
