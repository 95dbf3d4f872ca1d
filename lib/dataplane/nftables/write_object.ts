/**
 * Writing nftables objects as `nft -f -` input: one line per operation (`writeObject`; comments quoted,
 * concatenations joined with `" . "`, base-chain priorities as numbers) and knftables' `concat` for rule text.
 * @module
 */
import type { ChainPriority, Family, NftMap, NftObject, NftSet, Verb } from "./objects.ts";
import { parsePriority } from "./priority.ts";

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
