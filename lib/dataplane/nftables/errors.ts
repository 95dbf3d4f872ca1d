/**
 * The error type of the nftables library, its classification (not found, already exists, busy) as
 * knftables does it, and the parser for nft's error output.
 * @module
 */

/** Error classes callers branch on: ENOENT, EEXIST and EBUSY as nft reports them. */
export type NftErrorCode = "ENOENT" | "EEXIST" | "EBUSY";

/** One `Error:` block of nft's stderr. */
export interface NftErrorReport {
  /** Line of the `nft -f -` input (from 1); undefined for errors without a location. */
  readonly line?: number;
  /** The message after `Error: `. */
  readonly message: string;
  /** The input line nft echoed under the message, if any. */
  readonly echoed?: string;
}

/** Details attached to an {@linkcode NftablesError}. */
export interface NftablesErrorDetails {
  readonly code?: NftErrorCode;
  /** Input line (from 1) of the first failing operation. */
  readonly line?: number;
  /** Text of that input line. */
  readonly inputLine?: string;
  /** nft's complete stderr, when nft ran. */
  readonly stderr?: string;
  /** True for a transaction that was invalid before anything ran. */
  readonly invalid?: boolean;
  readonly cause?: unknown;
}

/**
 * A failed nftables operation: an invalid transaction, an nft failure (with the failing input line), or
 * the same failure reported by the fake.
 */
export class NftablesError extends Error {
  /** ENOENT / EEXIST / EBUSY when the failure is one of those. */
  readonly code?: NftErrorCode;
  /** Input line (from 1) of the first failing operation. */
  readonly line?: number;
  /** Text of that input line. */
  readonly inputLine?: string;
  /** nft's complete stderr, when nft ran. */
  readonly stderr?: string;
  /** True for a transaction that was invalid before anything ran. */
  readonly invalid: boolean;

  constructor(message: string, details: NftablesErrorDetails = {}) {
    super(message, details.cause !== undefined ? { cause: details.cause } : undefined);
    this.name = "NftablesError";
    this.code = details.code;
    this.line = details.line;
    this.inputLine = details.inputLine;
    this.stderr = details.stderr;
    this.invalid = details.invalid ?? false;
  }
}

/** True when `err` is an nftables "not found" failure (missing table, chain, set, map, element, rule). */
export function isNotFound(err: unknown): boolean {
  return err instanceof NftablesError && err.code === "ENOENT";
}

/** True when `err` is an nftables "already exists" failure (`create` of an existing object, clashing element). */
export function isAlreadyExists(err: unknown): boolean {
  return err instanceof NftablesError && err.code === "EEXIST";
}

/** True when `err` is an nftables "busy" failure (deleting a chain, set or map still referenced). */
export function isBusy(err: unknown): boolean {
  return err instanceof NftablesError && err.code === "EBUSY";
}

/**
 * Classifies one nft error message. nft does not call setlocale(), so the strerror texts are English.
 * Only the message itself is examined, never the echoed input line, so a rule comment that says "No such
 * file or directory" does not make a syntax error look like ENOENT (knftables' "misleading" case).
 */
export function classifyMessage(message: string): NftErrorCode | undefined {
  if (message.includes("No such file or directory")) return "ENOENT";
  if (message.includes("File exists")) return "EEXIST";
  if (message.includes("Device or resource busy")) return "EBUSY";
  return undefined;
}

// The file name has no spaces (`/dev/stdin`); an echoed input line always has a space before any colon,
// so an input line quoting "x:3:4: Error: y" in a comment is never taken for a location.
const LOCATED = /^[^\s:]+:(\d+):\d+(?:-\d+)?: Error: (.*)$/;

/**
 * Parses nft's stderr into its error blocks. A located block is
 * `/dev/stdin:3:1-20: Error: Could not process rule: No such file or directory`, then the input line,
 * then a caret line; other blocks are `Error: …` or `netlink: Error: …` lines.
 */
export function parseNftErrors(stderr: string): NftErrorReport[] {
  const lines = stderr.split("\n");
  const out: NftErrorReport[] = [];
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i];
    const m = LOCATED.exec(l);
    if (m) {
      const echoed = i + 1 < lines.length && !LOCATED.test(lines[i + 1]) ? lines[i + 1] : undefined;
      out.push({ line: Number(m[1]), message: m[2], echoed });
      if (echoed !== undefined) i += 2; // the echoed line and its caret line
      continue;
    }
    const at = l.indexOf("Error: ");
    if (at !== -1 && (at === 0 || l.startsWith("netlink: Error: "))) {
      out.push({ message: l.slice(at + "Error: ".length) });
    }
  }
  return out;
}
