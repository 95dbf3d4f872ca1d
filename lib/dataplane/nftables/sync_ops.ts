/**
 * Single nft operations that the full and partial syncs both write: an operation from its verb and object, and an
 * affinity set's declaration.
 * @module
 */
import type { IPFamily } from "../../proxy/types.ts";
import type { NftObject } from "./objects.ts";
import type { Operation } from "./transaction.ts";

/** The operation `verb obj`. */
export function op(verb: Operation["verb"], obj: NftObject): Operation {
  return { verb, obj };
}

/** Adds a service port's affinity set (source addresses, dynamic, with the port's timeout in seconds). */
export function affinitySetOp(family: IPFamily, name: string, timeout: number): Operation {
  const type = family === "IPv6" ? "ipv6_addr" : "ipv4_addr";
  return op("add", { kind: "set", name, type, flags: ["dynamic", "timeout"], timeout });
}
