/**
 * The failures of one step of a fake transaction: the strerror-like reason and its errno class, turned into an
 * `NftablesError` naming the failing input line when the transaction is rolled back.
 * @module
 */
import type { NftErrorCode } from "./errors.ts";

/** A failure inside a transaction: the strerror-like reason and its class. */
export class Failure extends Error {
  constructor(readonly detail: string, readonly code?: NftErrorCode) {
    super(detail);
  }
}

/** ENOENT: the object does not exist. */
export const notFound = (what: string) => new Failure(`${what}: No such file or directory`, "ENOENT");
/** EEXIST: the object exists already. */
export const exists = (what: string) => new Failure(`${what}: File exists`, "EEXIST");
/** EBUSY: the object is still referenced. */
export const busy = (what: string) => new Failure(`${what}: Device or resource busy`, "EBUSY");
