/**
 * The objects of the in-memory nftables (`FakeNftables`, `fake.ts`): tables, chains, rules, sets and maps, their
 * elements and counters, with what the kernel keeps of each (handles, creation order, use counts); and the
 * canonical form of set flags and element keys, as nft prints them.
 * @module
 */
import type { AddrInterval } from "./addr.ts";
import { canonicalValue, type SetDatatypes, setDatatypes, valueInterval } from "./nft_format.ts";
import type { ChainHook, ChainPolicy, ChainType, Family, SetFlag, SetPolicy, TableFlag } from "./objects.ts";
import type { RuleRefs } from "./rule_text.ts";

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

/** The holder of the fake's tables, keyed `"<family> <name>"` (a transaction replaces the map it changes). */
export interface FakeTables {
  tables: Map<string, FakeTable>;
}

const FLAG_ORDER: readonly SetFlag[] = ["constant", "dynamic", "interval", "timeout"];

/** Set flags in the order nft prints them, with `timeout` added when the set has a timeout. */
export function normalizeFlags(
  flags: readonly SetFlag[] | undefined,
  timeout: number | undefined,
): SetFlag[] {
  const set = new Set(flags ?? []);
  if (timeout !== undefined && timeout > 0) set.add("timeout");
  return FLAG_ORDER.filter((f) => set.has(f));
}

/** An element key in the form nft prints it, and its covered addresses (single-part keys of interval sets). */
export type CanonKey = { id: string; parts: string[]; interval?: AddrInterval } | { error: string };

/** Parts of an element key or value in the form nft prints them, or why they are not valid for the datatypes. */
export function canonicalParts(
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

/** A key of the set in the form nft prints it (its id: the parts joined with `" . "`), or why it is invalid. */
export function canonicalKey(set: FakeSet, key: readonly string[]): CanonKey {
  const parts = canonicalParts(set.datatypes.key, key, set.interval, "key");
  if (typeof parts === "string") return { error: parts };
  const interval = set.interval && parts.length === 1
    ? valueInterval(set.datatypes.key[0], parts[0])
    : undefined;
  return { id: parts.join(" . "), parts, interval };
}
