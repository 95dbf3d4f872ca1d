/**
 * Ownership of the elements of the shared maps and sets: which service ports contribute each element, and which
 * value the kernel holds for it. Elements are known by `container key` and their value as `value\tcomment`.
 * @module
 */
import type { Operation } from "./transaction.ts";
import { elementObject, type NftElement } from "./rules.ts";
import { op } from "./sync_ops.ts";

/**
 * Owners of an element in the shared maps and sets: the one port that contributes it (the kernel then holds that
 * port's value), or, when several do, each port's value in the order they came (the first one's is the kernel's).
 */
export type Owners = string | Map<string, string>;

/** An element's `container key`. */
export function elementKey(e: NftElement): string {
  return `${e.container} ${e.key}`;
}

/** An element's `value\tcomment`. */
export function elementValue(e: NftElement): string {
  return `${e.value ?? ""}\t${e.comment ?? ""}`;
}

/** An element operation from its `container key` and `value\tcomment`. */
export function elementOp(verb: "add" | "delete", ckey: string, value: string | null): Operation {
  const sp = ckey.indexOf(" ");
  if (value === null) return op(verb, elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), null, null));
  const tab = value.indexOf("\t");
  const v = value.slice(0, tab), comment = value.slice(tab + 1);
  return op(verb, elementObject(ckey.slice(0, sp), ckey.slice(sp + 1), v || null, comment || null));
}

/** The elements in the kernel with their owners, by `container key`. */
export class ElementOwnership {
  /** Owners of every element in the kernel. */
  readonly owners: Map<string, Owners> = new Map();
  /** Element values in the kernel (`value\tcomment`). */
  readonly kernel: Map<string, string> = new Map();

  /** Records that `port` contributes the element (a full sync, port by port: the first port's value is kept). */
  add(port: string, ckey: string, value: string): void {
    const { owners, kernel } = this;
    const o = owners.get(ckey);
    if (o === undefined) {
      owners.set(ckey, port);
      kernel.set(ckey, value);
    } else if (typeof o === "string") {
      if (o !== port) owners.set(ckey, new Map([[o, kernel.get(ckey)!], [port, value]]));
    } else if (!o.has(port)) o.set(port, value);
  }

  /** The owners of an element as a map of port → value (a copy). */
  ownerMap(ckey: string): Map<string, string> {
    const o = this.owners.get(ckey);
    if (o === undefined) return new Map();
    if (typeof o === "string") return new Map([[o, this.kernel.get(ckey)!]]);
    return new Map(o);
  }

  /**
   * Takes a partial sync's changes: the new owners (port → value) of the elements whose owners changed, and the
   * kernel's new value of the elements it changed (null: deleted).
   */
  apply(
    newOwners: ReadonlyMap<string, Map<string, string>>,
    kernelChanges: ReadonlyMap<string, string | null>,
  ): void {
    for (const [ckey, m] of newOwners) {
      if (m.size === 0) this.owners.delete(ckey);
      else if (m.size === 1) this.owners.set(ckey, m.keys().next().value!);
      else this.owners.set(ckey, m);
    }
    for (const [ckey, v] of kernelChanges) {
      if (v === null) this.kernel.delete(ckey);
      else this.kernel.set(ckey, v);
    }
  }
}
