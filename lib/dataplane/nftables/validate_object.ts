/**
 * Checks of an nftables object for a verb before it is written (`validateObject`), with the kernel's name and
 * nft's comment length limits: a bad operation is refused when added to a transaction, not when nft runs.
 * @module
 */
import type { Family, NftObject, Verb } from "./objects.ts";
import { parsePriority } from "./priority.ts";

/** Longest table/chain/set/map/counter name the kernel accepts (256 with the NUL: "Numerical result out of range"). */
export const NAME_LENGTH_MAX = 255;

/** Longest comment nft accepts, in bytes ("comment too long, 128 characters maximum allowed"). */
export const COMMENT_LENGTH_MAX = 128;

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
