/**
 * Typed nftables objects (table, chain, rule, set, map, element, counter) and how each one is checked
 * and written as one line of `nft -f -` input for a verb, in the style of sigs.k8s.io/knftables: plain
 * data, the transaction supplies the family and table, comments are quoted, concatenations are joined
 * with `" . "`, and base-chain priorities are written as numbers (older nft rejects some named priorities
 * in some hooks, e.g. `dstnat` in `output`).
 * @module
 */

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

/** Longest table/chain/set/map/counter name the kernel accepts (256 with the NUL: "Numerical result out of range"). */
export const NAME_LENGTH_MAX = 255;

/** Longest comment nft accepts, in bytes ("comment too long, 128 characters maximum allowed"). */
export const COMMENT_LENGTH_MAX = 128;

const STD_PRIORITIES: Readonly<Record<string, number>> = {
  raw: -300,
  mangle: -150,
  dstnat: -100,
  filter: 0,
  security: 50,
  srcnat: 100,
};

const BRIDGE_PRIORITIES: Readonly<Record<string, number>> = {
  dstnat: -300,
  filter: -200,
  out: 100,
  srcnat: 300,
};

/**
 * Converts a base-chain priority into its number (`dstnat-10` → -110 in `ip`).
 * @returns the number, or undefined when the text is no number, no known name, or a bad offset
 */
export function parsePriority(family: Family, priority: ChainPriority): number | undefined {
  if (typeof priority === "number") return Number.isInteger(priority) ? priority : undefined;
  const text = priority.trim();
  if (/^[+-]?\d+$/.test(text)) return Number(text);
  const m = /^([a-z]+)\s*(?:([+-])\s*(\d+))?$/.exec(text);
  if (!m) return undefined;
  const table = family === "bridge" ? BRIDGE_PRIORITIES : STD_PRIORITIES;
  const base = table[m[1]];
  if (base === undefined) return undefined;
  if (m[2] === undefined) return base;
  return m[2] === "+" ? base + Number(m[3]) : base - Number(m[3]);
}

const encoder = new TextEncoder();

function byteLength(s: string): number {
  // ASCII fast path: most names and comments are plain ASCII.
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 127) return encoder.encode(s).length;
  return s.length;
}

function checkName(what: string, name: string | undefined): string | undefined {
  if (name === undefined || name === "") return `no name specified for ${what}`;
  if (byteLength(name) > NAME_LENGTH_MAX) {
    return `${what} name "${name.slice(0, 40)}..." is longer than ${NAME_LENGTH_MAX} bytes`;
  }
  if (/[\s"'{};#@]/.test(name)) {
    return `${what} name ${JSON.stringify(name)} contains a character nft cannot parse`;
  }
  return undefined;
}

function checkComment(comment: string | undefined): string | undefined {
  if (comment === undefined) return undefined;
  if (byteLength(comment) > COMMENT_LENGTH_MAX) {
    return `comment ${JSON.stringify(comment)} is longer than ${COMMENT_LENGTH_MAX} bytes`;
  }
  if (/["\n\r\0]/.test(comment)) {
    return `comment ${JSON.stringify(comment)} contains a quote or line break, which nft cannot parse`;
  }
  return undefined;
}

function checkSeconds(what: string, v: number | undefined): string | undefined {
  if (v === undefined) return undefined;
  if (!Number.isInteger(v) || v < 0) return `${what} must be a whole number of seconds, got ${v}`;
  return undefined;
}

function checkHandle(h: number | undefined): string | undefined {
  if (h === undefined) return undefined;
  if (!Number.isInteger(h) || h < 1) return `invalid handle ${h}`;
  return undefined;
}

function checkText(what: string, s: string): string | undefined {
  return /[\n\r\0]/.test(s) ? `${what} ${JSON.stringify(s)} contains a line break` : undefined;
}

function isSimple(verb: Verb, allowed: readonly Verb[], noun: string): string | undefined {
  return allowed.includes(verb) ? undefined : `${verb} is not implemented for ${noun}`;
}

/**
 * Checks that `obj` can be written for `verb`.
 * @returns a message describing the first problem, or undefined when the operation is valid
 */
export function validateObject(verb: Verb, obj: NftObject, family: Family): string | undefined {
  switch (obj.kind) {
    case "table": {
      const bad = isSimple(verb, ["add", "create", "flush", "delete", "destroy"], "tables");
      if (bad) return bad;
      if ((verb === "add" || verb === "create" || verb === "flush") && obj.handle !== undefined) {
        return `cannot specify handle in ${verb} operation`;
      }
      return checkHandle(obj.handle) ?? checkComment(obj.comment);
    }
    case "chain": {
      const bad = isSimple(verb, ["add", "create", "flush", "delete", "destroy"], "chains");
      if (bad) return bad;
      if (obj.hook === undefined) {
        if (obj.type !== undefined || obj.priority !== undefined) {
          return `regular chain ${JSON.stringify(obj.name)} must not specify type or priority`;
        }
        if (obj.policy !== undefined) {
          return `regular chain ${JSON.stringify(obj.name)} must not specify policy`;
        }
        if (obj.device !== undefined) {
          return `regular chain ${JSON.stringify(obj.name)} must not specify device`;
        }
      } else {
        if (obj.type === undefined || obj.priority === undefined) {
          return `base chain ${JSON.stringify(obj.name)} must specify type and priority`;
        }
        if (parsePriority(family, obj.priority) === undefined) {
          return `base chain ${JSON.stringify(obj.name)} has an unknown priority ${
            JSON.stringify(obj.priority)
          }`;
        }
        if (obj.device !== undefined && /["\s]/.test(obj.device)) {
          return `device ${JSON.stringify(obj.device)} contains a character nft cannot parse`;
        }
      }
      if (verb === "add" || verb === "create" || verb === "flush") {
        const n = checkName("chain", obj.name);
        if (n) return n;
        if (obj.handle !== undefined) return `cannot specify handle in ${verb} operation`;
      } else {
        if ((obj.name === undefined || obj.name === "") && obj.handle === undefined) {
          return "must specify either name or handle";
        }
        if (obj.name) {
          const n = checkName("chain", obj.name);
          if (n) return n;
        }
      }
      return checkHandle(obj.handle) ?? checkComment(obj.comment);
    }
    case "rule": {
      const bad = isSimple(verb, ["add", "insert", "replace", "delete", "destroy"], "rules");
      if (bad) return bad;
      const n = checkName("chain", obj.chain);
      if (n) return obj.chain ? n : "no chain name specified for rule";
      if (obj.index !== undefined && obj.handle !== undefined) return "cannot specify both index and handle";
      if (obj.index !== undefined && (!Number.isInteger(obj.index) || obj.index < 0)) {
        return `invalid index ${obj.index}`;
      }
      if (verb === "add" || verb === "insert" || verb === "replace") {
        if (obj.rule === undefined || obj.rule.trim() === "") return "no rule specified";
        const t = checkText("rule", obj.rule);
        if (t) return t;
      }
      if ((verb === "replace" || verb === "delete" || verb === "destroy") && obj.handle === undefined) {
        return `must specify handle with ${verb}`;
      }
      return checkHandle(obj.handle) ?? checkComment(obj.comment);
    }
    case "set":
    case "map": {
      const noun = obj.kind === "set" ? "sets" : "maps";
      const bad = isSimple(verb, ["add", "create", "flush", "delete", "destroy"], noun);
      if (bad) return bad;
      if (verb === "add" || verb === "create") {
        const n = checkName(obj.kind, obj.name);
        if (n) return n;
        const hasType = obj.type !== undefined && obj.type !== "";
        const hasTypeof = obj.typeof !== undefined && obj.typeof !== "";
        if (hasType === hasTypeof) return `${obj.kind} must specify either type or typeof`;
        const spec = (hasType ? obj.type : obj.typeof) as string;
        const t = checkText("type", spec);
        if (t) return t;
        if (/[;{}"]/.test(spec)) {
          return `${obj.kind} type ${JSON.stringify(spec)} contains a character nft cannot parse`;
        }
        const isMapType = spec.includes(" : ");
        if (obj.kind === "map" && !isMapType) {
          return `map type ${JSON.stringify(spec)} has no " : " value type`;
        }
        if (obj.kind === "set" && isMapType) {
          return `set type ${JSON.stringify(spec)} has a value type; use a map`;
        }
        if (obj.handle !== undefined) return `cannot specify handle in ${verb} operation`;
        return checkSeconds("timeout", obj.timeout) ?? checkSeconds("gc-interval", obj.gcInterval) ??
          checkSeconds("size", obj.size) ?? checkComment(obj.comment);
      }
      if (verb === "flush") return checkName(obj.kind, obj.name);
      if ((obj.name === undefined || obj.name === "") && obj.handle === undefined) {
        return "must specify either name or handle";
      }
      return obj.name ? checkName(obj.kind, obj.name) : checkHandle(obj.handle);
    }
    case "element": {
      const bad = isSimple(verb, ["add", "create", "delete", "destroy"], "elements");
      if (bad) return bad;
      if (!obj.set && !obj.map) return "no set/map name specified for element";
      if (obj.set && obj.map) return "element specifies both a set name and a map name";
      const n = checkName(obj.set ? "set" : "map", obj.set ?? obj.map);
      if (n) return n;
      if (!obj.key || obj.key.length === 0) return "no key specified for element";
      for (const part of obj.key) {
        if (part === "" || /[\n\r\0{}"]/.test(part)) return `invalid key part ${JSON.stringify(part)}`;
      }
      if (obj.set && obj.value && obj.value.length !== 0) return "map value specified for set element";
      if (obj.value) {
        for (const part of obj.value) {
          if (part === "" || /[\n\r\0{}"]/.test(part)) return `invalid value part ${JSON.stringify(part)}`;
        }
      }
      if ((verb === "add" || verb === "create") && obj.map && (!obj.value || obj.value.length === 0)) {
        return "no map value specified for map element";
      }
      return checkSeconds("timeout", obj.timeout) ?? checkComment(obj.comment);
    }
    case "counter": {
      const bad = isSimple(verb, ["add", "create", "delete", "destroy", "reset"], "counters");
      if (bad) return bad;
      if (verb === "add" || verb === "create") {
        const n = checkName("counter", obj.name);
        if (n) return n;
        if (obj.handle !== undefined) return `cannot specify handle in ${verb} operation`;
        if ((obj.packets === undefined) !== (obj.bytes === undefined)) {
          return `cannot specify packets without bytes (or bytes without packets) in ${verb} operation`;
        }
        return checkComment(obj.comment);
      }
      if (verb === "reset") return checkName("counter", obj.name);
      if ((obj.name === undefined || obj.name === "") && obj.handle === undefined) {
        return "neither counter name nor handle specified";
      }
      return obj.name ? checkName("counter", obj.name) : checkHandle(obj.handle);
    }
  }
}

function q(s: string): string {
  return `"${s}"`;
}

/** The set/map header body after the name, e.g. ` { type ipv4_addr ; flags interval ; }`. */
function setBody(obj: NftSet | NftMap): string {
  let out = obj.type ? ` { type ${obj.type} ;` : ` { typeof ${obj.typeof} ;`;
  if (obj.flags && obj.flags.length !== 0) out += ` flags ${obj.flags.join(",")} ;`;
  if (obj.timeout !== undefined) out += ` timeout ${obj.timeout}s ;`;
  if (obj.gcInterval !== undefined) out += ` gc-interval ${obj.gcInterval}s ;`;
  if (obj.size !== undefined) out += ` size ${obj.size} ;`;
  if (obj.policy !== undefined) out += ` policy ${obj.policy} ;`;
  if (obj.kind === "set" && obj.autoMerge) out += " auto-merge ;";
  if (obj.comment !== undefined) out += ` comment ${q(obj.comment)} ;`;
  return out + " }";
}

/**
 * Writes one operation as a line of `nft -f -` input (without the newline). The object must have
 * passed {@linkcode validateObject} for this verb.
 * @param verb the nft verb
 * @param obj the object
 * @param family the transaction's family
 * @param table the transaction's table name
 * @returns the line, e.g. `add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips`
 */
export function writeObject(verb: Verb, obj: NftObject, family: Family, table: string): string {
  switch (obj.kind) {
    case "table": {
      if ((verb === "delete" || verb === "destroy") && obj.handle !== undefined) {
        return `${verb} table ${family} handle ${obj.handle}`;
      }
      let out = `${verb} table ${family} ${table}`;
      if ((verb === "add" || verb === "create") && (obj.comment !== undefined || obj.flags?.length)) {
        out += " {";
        if (obj.comment !== undefined) out += ` comment ${q(obj.comment)} ;`;
        if (obj.flags?.length) out += ` flags ${obj.flags.join(",")} ;`;
        out += " }";
      }
      return out;
    }
    case "chain": {
      if ((verb === "delete" || verb === "destroy") && obj.handle !== undefined) {
        return `${verb} chain ${family} ${table} handle ${obj.handle}`;
      }
      let out = `${verb} chain ${family} ${table} ${obj.name}`;
      if ((verb === "add" || verb === "create") && (obj.type !== undefined || obj.comment !== undefined)) {
        out += " {";
        if (obj.type !== undefined) {
          out += ` type ${obj.type} hook ${obj.hook}`;
          if (obj.device !== undefined) out += ` device ${q(obj.device)}`;
          out += ` priority ${parsePriority(family, obj.priority as ChainPriority)} ;`;
          if (obj.policy !== undefined) out += ` policy ${obj.policy} ;`;
        }
        if (obj.comment !== undefined) out += ` comment ${q(obj.comment)} ;`;
        out += " }";
      }
      return out;
    }
    case "rule": {
      let out = `${verb} rule ${family} ${table} ${obj.chain}`;
      if (obj.index !== undefined) out += ` index ${obj.index}`;
      else if (obj.handle !== undefined) out += ` handle ${obj.handle}`;
      if (verb === "add" || verb === "insert" || verb === "replace") {
        out += ` ${obj.rule}`;
        if (obj.comment !== undefined) out += ` comment ${q(obj.comment)}`;
      }
      return out;
    }
    case "set":
    case "map": {
      if ((verb === "delete" || verb === "destroy") && obj.handle !== undefined) {
        return `${verb} ${obj.kind} ${family} ${table} handle ${obj.handle}`;
      }
      const head = `${verb} ${obj.kind} ${family} ${table} ${obj.name}`;
      return verb === "add" || verb === "create" ? head + setBody(obj) : head;
    }
    case "element": {
      let out = `${verb} element ${family} ${table} ${obj.set ?? obj.map} { ${obj.key.join(" . ")}`;
      if (verb === "add" || verb === "create") {
        if (obj.timeout !== undefined) out += ` timeout ${obj.timeout}s`;
        if (obj.comment !== undefined) out += ` comment ${q(obj.comment)}`;
        if (obj.value && obj.value.length !== 0) out += ` : ${obj.value.join(" . ")}`;
      }
      return out + " }";
    }
    case "counter": {
      if ((verb === "delete" || verb === "destroy") && obj.handle !== undefined) {
        return `${verb} counter ${family} ${table} handle ${obj.handle}`;
      }
      let out = `${verb} counter ${family} ${table} ${obj.name}`;
      if ((verb === "add" || verb === "create") && (obj.comment !== undefined || obj.packets !== undefined)) {
        out += " {";
        if (obj.packets !== undefined) out += ` packets ${obj.packets} bytes ${obj.bytes} ;`;
        if (obj.comment !== undefined) out += ` comment ${q(obj.comment)} ;`;
        out += " }";
      }
      return out;
    }
  }
}

/** Joins words with spaces, as knftables' `Concat`: arrays are flattened and `"@"` glues to the next word. */
export function concat(...args: (string | number | readonly (string | number)[])[]): string {
  let out = "";
  let glue = true;
  const put = (w: string | number) => {
    const s = String(w);
    if (s === "") return;
    out += glue ? s : ` ${s}`;
    glue = s === "@";
  };
  for (const a of args) {
    if (Array.isArray(a)) { for (const w of a) put(w); }
    else put(a as string | number);
  }
  return out;
}
