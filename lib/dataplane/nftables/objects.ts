/**
 * Typed nftables objects (table, chain, rule, set, map, element, counter), in the style of sigs.k8s.io/knftables:
 * plain data with a `kind` tag; the transaction supplies the family and table. How each one is checked for a verb
 * (`validate_object.ts`), written as one line of `nft -f -` input (`write_object.ts`: comments quoted,
 * concatenations joined with `" . "`, base-chain priorities as numbers, as older nft rejects some named priorities
 * in some hooks, e.g. `dstnat` in `output`) and the priorities (`priority.ts`) are apart, re-exported here.
 * @module
 */

export * from "./priority.ts";
export * from "./validate_object.ts";
export * from "./write_object.ts";

/** An nftables address family. kube-proxy uses `ip` and `ip6`. */
export type Family = "ip" | "ip6" | "inet" | "arp" | "bridge" | "netdev";

/** The verbs of `nft`, as transaction operations. */
export type Verb = "add" | "create" | "insert" | "replace" | "flush" | "delete" | "destroy" | "reset";

/** Type of a base chain. */
export type ChainType = "filter" | "nat" | "route";

/** Netfilter hook of a base chain. */
export type ChainHook = "prerouting" | "input" | "forward" | "output" | "postrouting" | "ingress" | "egress";

/** Policy of a base chain for packets no rule accepted or dropped. */
export type ChainPolicy = "accept" | "drop";

/**
 * Priority of a base chain: a number, a standard name (`raw`, `mangle`, `dstnat`, `filter`, `security`,
 * `srcnat`; bridge: `dstnat`, `filter`, `out`, `srcnat`), or a name plus or minus a number, spelled
 * `dstnat-10` (as knftables: `DNATPriority + "-10"`), `dstnat - 10` or `filter+5`.
 */
export type ChainPriority = number | string;

/** A table flag. */
export type TableFlag = "dormant";

/** A set or map flag. `timeout` is implied by a set timeout. */
export type SetFlag = "constant" | "dynamic" | "interval" | "timeout";

/** Storage policy of a set or map. */
export type SetPolicy = "performance" | "memory";

/** The transaction's table (family and name come from the transaction). */
export interface Table {
  readonly kind: "table";
  /** Free text, at most 128 bytes, no `"` (nft cannot escape quotes). Kernel ≥ 5.10. */
  readonly comment?: string;
  readonly flags?: readonly TableFlag[];
  /** Only for delete/destroy by handle. */
  readonly handle?: number;
}

/** A chain: a base chain when `type`, `hook` and `priority` are set, a regular chain otherwise. */
export interface Chain {
  readonly kind: "chain";
  readonly name: string;
  readonly type?: ChainType;
  readonly hook?: ChainHook;
  readonly priority?: ChainPriority;
  /** Base chains only. */
  readonly policy?: ChainPolicy;
  /** Base chains on the ingress/egress hooks only. */
  readonly device?: string;
  readonly comment?: string;
  /** Only for delete/destroy by handle. */
  readonly handle?: number;
}

/** A rule in a chain. */
export interface Rule {
  readonly kind: "rule";
  readonly chain: string;
  /** The rule in nft syntax, without its comment (not needed for delete). */
  readonly rule?: string;
  readonly comment?: string;
  /**
   * Position (from 0) of an existing rule to add this one after (`add`) or insert it before (`insert`).
   * Exclusive with `handle`.
   */
  readonly index?: number;
  /** Handle of an existing rule: add after / insert before it; required for replace and delete. */
  readonly handle?: number;
}

/** Fields shared by sets and maps. */
interface SetLike {
  readonly name: string;
  /** Key type (sets) or `key : value` types (maps) as nft datatypes, e.g. `ipv4_addr . inet_proto`. */
  readonly type?: string;
  /** Key (and value) as nft expressions, e.g. `ip saddr`; exclusive with `type`. */
  readonly typeof?: string;
  readonly flags?: readonly SetFlag[];
  /** Default element timeout, in whole seconds. */
  readonly timeout?: number;
  /** Garbage-collection interval, in whole seconds. */
  readonly gcInterval?: number;
  /** Maximum number of elements. */
  readonly size?: number;
  readonly policy?: SetPolicy;
  readonly comment?: string;
  /** Only for delete/destroy by handle. */
  readonly handle?: number;
}

/** A named set (its elements are {@linkcode Element}s). */
export interface NftSet extends SetLike {
  readonly kind: "set";
  /** Merge adjacent and overlapping intervals (interval sets only). */
  readonly autoMerge?: boolean;
}

/** A named map (its elements are {@linkcode Element}s with a value). */
export interface NftMap extends SetLike {
  readonly kind: "map";
}

/** An element of a set (`set`) or map (`map`). */
export interface Element {
  readonly kind: "element";
  readonly set?: string;
  readonly map?: string;
  /** The key; several parts for a concatenation (written joined by `" . "`). */
  readonly key: readonly string[];
  /** The value of a map element (several parts for a concatenated value); none for a set element. */
  readonly value?: readonly string[];
  readonly comment?: string;
  /** Element timeout in whole seconds (the set needs the timeout flag). */
  readonly timeout?: number;
}

/** A named counter. */
export interface Counter {
  readonly kind: "counter";
  readonly name: string;
  readonly comment?: string;
  /** Initial packets (with `bytes`). */
  readonly packets?: number;
  /** Initial bytes (with `packets`). */
  readonly bytes?: number;
  /** Only for delete/destroy by handle. */
  readonly handle?: number;
}

/** Any object a transaction operates on. */
export type NftObject = Table | Chain | Rule | NftSet | NftMap | Element | Counter;
