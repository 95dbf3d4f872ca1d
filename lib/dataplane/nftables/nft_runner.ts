/**
 * The real {@linkcode Nftables}: each transaction is one `nft -f -` run through the project's
 * {@linkcode CommandRunner}; a failure is reported with the failing input line and classified
 * (ENOENT/EEXIST/EBUSY) from nft's message. A streamed transaction (`runOperations`) is written to nft's stdin
 * a bounded chunk at a time as its operations are produced. Listing uses `nft --json --terse list table`, which
 * skips set elements, for the startup and cleanup needs of the agent.
 * @module
 */
import { CommandError, type CommandRunner } from "../../exec.ts";
import { ChunkWriter } from "../payload.ts";
import { classifyMessage, NftablesError, parseNftErrors } from "./errors.ts";
import type { ListableType, Nftables } from "./interface.ts";
import { type Element, type Family, validateObject, writeObject } from "./objects.ts";
import { type Operation, Transaction } from "./transaction.ts";

/** Options of {@linkcode NftablesRunner}. */
export interface NftablesRunnerOptions {
  readonly family: Family;
  readonly table: string;
  readonly runner: CommandRunner;
  /** Program name (must be in --allow-run). @default "nft" */
  readonly nft?: string;
  /** Kill nft after this long; a cold 5k-service transaction takes about 50 s here. @default 600000 */
  readonly timeoutMs?: number;
}

const encoder = new TextEncoder();

/**
 * Turns nft's stderr for a failed `nft -f -` into an {@linkcode NftablesError} naming the first failing
 * line. Only nft's message is classified, never the echoed input, so a comment containing "No such file
 * or directory" cannot make another failure look like ENOENT.
 * @param stderr nft's stderr
 * @param exitCode nft's exit code
 * @param lines the transaction's input lines (line n is `lines[n - 1]`)
 */
export function errorFromNft(stderr: string, exitCode: number, lines: readonly string[]): NftablesError {
  const reports = parseNftErrors(stderr);
  const first = reports[0];
  if (!first) {
    return new NftablesError(`nft failed (exit ${exitCode}): ${stderr.trim() || "no error output"}`, {
      stderr,
    });
  }
  const inputLine = first.line !== undefined ? (lines[first.line - 1] ?? first.echoed) : first.echoed;
  const more = reports.length > 1 ? ` (and ${reports.length - 1} more error(s))` : "";
  const where = first.line !== undefined ? ` (line ${first.line}: ${inputLine})` : "";
  return new NftablesError(`nft: ${first.message}${where}${more}`, {
    code: classifyMessage(first.message),
    line: first.line,
    inputLine,
    stderr,
  });
}

type JsonObj = Record<string, unknown>;

function parseNftJson(out: string): JsonObj[] {
  let doc: unknown;
  try {
    doc = JSON.parse(out);
  } catch (err) {
    throw new NftablesError(`could not parse nft output: ${(err as Error).message}`, { cause: err });
  }
  const list = (doc as { nftables?: unknown })?.nftables;
  if (!Array.isArray(list) || list.length === 0) {
    throw new NftablesError(`could not find result in nft output ${JSON.stringify(out.slice(0, 200))}`);
  }
  const meta = (list[0] as JsonObj)?.metainfo as JsonObj | undefined;
  if (!meta || meta.json_schema_version !== 1) {
    throw new NftablesError(`could not find supported json_schema_version in nft output`);
  }
  return list.slice(1) as JsonObj[];
}

/** One key or value of `nft --json` output as nft's text syntax (concatenations as several parts). */
export function jsonValueParts(v: unknown): string[] {
  if (typeof v === "string") return [v];
  if (typeof v === "number") return [String(v)];
  if (v && typeof v === "object") {
    const o = v as JsonObj;
    if (Array.isArray(o.concat)) return o.concat.flatMap(jsonValueParts);
    if (o.prefix && typeof o.prefix === "object") {
      const p = o.prefix as JsonObj;
      return [`${p.addr}/${p.len}`];
    }
    if (Array.isArray(o.range) && o.range.length === 2) {
      return [`${jsonValueParts(o.range[0])[0]}-${jsonValueParts(o.range[1])[0]}`];
    }
    const keys = Object.keys(o);
    if (keys.length === 1) {
      const inner = o[keys[0]];
      if (inner === null) return [keys[0]];
      if (inner && typeof inner === "object" && "target" in (inner as JsonObj)) {
        return [`${keys[0]} ${(inner as JsonObj).target}`];
      }
    }
  }
  throw new NftablesError(`unexpected element value in nft output: ${JSON.stringify(v)}`);
}

/** Elements of a `nft --json list set|map` result as {@linkcode Element}s. */
export function elementsFromJson(type: "set" | "map", name: string, objs: JsonObj[]): Element[] {
  const holder = objs.find((o) => o[type] !== undefined)?.[type] as JsonObj | undefined;
  if (!holder) throw new NftablesError(`unexpected nft output: no ${type} ${name}`);
  const elems = (holder.elem ?? []) as unknown[];
  const out: Element[] = [];
  for (const raw of elems) {
    let key: unknown = raw, value: unknown;
    if (type === "map") {
      if (!Array.isArray(raw) || raw.length !== 2) {
        throw new NftablesError(
          `unexpected nft output: map element is not [key, value]: ${JSON.stringify(raw)}`,
        );
      }
      [key, value] = raw;
    }
    let comment: string | undefined, timeout: number | undefined;
    if (key && typeof key === "object" && (key as JsonObj).elem) {
      const e = (key as JsonObj).elem as JsonObj;
      key = e.val;
      if (typeof e.comment === "string") comment = e.comment;
      if (typeof e.timeout === "number") timeout = e.timeout;
    }
    out.push({
      kind: "element",
      ...(type === "set" ? { set: name, key: jsonValueParts(key) } : {
        map: name,
        key: jsonValueParts(key),
        value: jsonValueParts(value),
      }),
      ...(comment !== undefined ? { comment } : {}),
      ...(timeout !== undefined ? { timeout } : {}),
    });
  }
  return out;
}

/**
 * nftables through the `nft` binary.
 *
 * @example Usage
 * ```ts ignore
 * import { DenoCommandRunner } from "../../exec.ts";
 * import { NftablesRunner } from "./nft_runner.ts";
 * const nft = new NftablesRunner({ family: "ip", table: "kube-proxy", runner: new DenoCommandRunner() });
 * const tx = nft.newTransaction();
 * tx.add({ kind: "table", comment: "rules for kube-proxy" });
 * await nft.run(tx);
 * ```
 */
export class NftablesRunner implements Nftables {
  readonly family: Family;
  readonly table: string;
  readonly #runner: CommandRunner;
  readonly #nft: string;
  readonly #timeoutMs: number;

  constructor(opts: NftablesRunnerOptions) {
    this.family = opts.family;
    this.table = opts.table;
    this.#runner = opts.runner;
    this.#nft = opts.nft ?? "nft";
    this.#timeoutMs = opts.timeoutMs ?? 600_000;
  }

  /** A new transaction for this table. */
  newTransaction(): Transaction {
    return new Transaction(this.family, this.table);
  }

  /** Sends tx with `nft -f -`. */
  run(tx: Transaction): Promise<void> {
    return this.#send(tx, false);
  }

  /** Sends tx with `nft --check -f -`. */
  check(tx: Transaction): Promise<void> {
    return this.#send(tx, true);
  }

  async #send(tx: Transaction, check: boolean): Promise<void> {
    if (tx.error) throw tx.error;
    if (tx.numOperations === 0) return;
    const lines = tx.lines();
    const stdin = encoder.encode(lines.join("\n") + "\n");
    const args = check ? ["--check", "-f", "-"] : ["-f", "-"];
    const r = await this.#exec(args, stdin, false);
    if (r.code !== 0) throw errorFromNft(r.stderr, r.code, lines);
  }

  /**
   * Sends the operations with `nft -f -` as they are produced, 256 KiB at a time. The failing line of an error
   * is the one nft echoes (the input is not kept).
   */
  async runOperations(ops: Iterable<Operation>): Promise<number> {
    const family = this.family, table = this.table;
    const w = new ChunkWriter();
    let invalid: NftablesError | undefined;
    function* chunks(): Generator<Uint8Array, void, undefined> {
      let n = 0;
      for (const op of ops) {
        n++;
        const problem = validateObject(op.verb, op.obj, family);
        if (problem !== undefined) {
          invalid = new NftablesError(`invalid operation ${n} (${op.verb} ${op.obj.kind}): ${problem}`, {
            invalid: true,
          });
          throw invalid;
        }
        yield* w.text(writeObject(op.verb, op.obj, family, table));
        yield* w.text("\n");
      }
      yield* w.end();
    }
    let r;
    try {
      r = await this.#runner.tryRun({
        cmd: this.#nft,
        args: ["-f", "-"],
        stdin: chunks(),
        captureStdout: false,
        timeoutMs: this.#timeoutMs,
      });
    } catch (err) {
      // nft could not be started; any other exception is the producer's (nft was killed before it could apply
      // anything, invalid operations included) and is passed on as it is.
      if (err !== invalid && err instanceof CommandError) {
        throw new NftablesError(`failed to run nft: ${err.message}`, { cause: err });
      }
      throw err;
    }
    if (r.code !== 0) throw errorFromNft(r.stderr, r.code, []);
    return w.total;
  }

  async #exec(args: string[], stdin: Uint8Array | undefined, capture: boolean) {
    try {
      return await this.#runner.tryRun({
        cmd: this.#nft,
        args,
        ...(stdin ? { stdin } : {}),
        captureStdout: capture,
        timeoutMs: this.#timeoutMs,
      });
    } catch (err) {
      throw new NftablesError(`failed to run nft: ${(err as Error).message}`, { cause: err });
    }
  }

  async #list(args: string[]): Promise<JsonObj[]> {
    const r = await this.#exec(args, undefined, true);
    if (r.code !== 0) {
      const first = parseNftErrors(r.stderr)[0];
      const msg = first?.message ?? (r.stderr.trim() || `exit ${r.code}`);
      throw new NftablesError(`failed to run nft ${args.join(" ")}: ${msg}`, {
        code: first ? classifyMessage(first.message) : undefined,
        stderr: r.stderr,
      });
    }
    return parseNftJson(r.stdout);
  }

  /**
   * Whether the table exists. Not `nft list tables`: nft 1.0.6 fetches every chain, set and element of the
   * family into its cache for it (3.2 s, 2.6 s of it in the kernel, with 10k Services), and this runs every
   * syncPeriod per family. `nft list flowtables <family>` needs no rule or element and prints every table of
   * the family as `table ip kube-proxy {` (0.01 s); where an nft prints only tables holding flowtables,
   * `nft list chains <family>` (declarations only, 0.1 s at 10k) decides.
   */
  async tableExists(): Promise<boolean> {
    const header = (out: string) =>
      out.split("\n").some((l) => l.trim() === `table ${this.family} ${this.table} {`);
    const f = await this.#exec(["list", "flowtables", this.family], undefined, true);
    if (f.code === 0 && header(f.stdout)) return true;
    const r = await this.#exec(["list", "chains", this.family], undefined, true);
    if (r.code !== 0) throw errorFromNft(r.stderr, r.code, []);
    return header(r.stdout);
  }

  /** Names of all chains, sets, maps and counters of the table. */
  async listAll(): Promise<Record<ListableType, string[]>> {
    const objs = await this.#list(["--json", "--terse", "list", "table", this.family, this.table]);
    const out: Record<ListableType, string[]> = { chain: [], set: [], map: [], counter: [] };
    for (const o of objs) {
      for (const type of ["chain", "set", "map", "counter"] as const) {
        const v = o[type] as JsonObj | undefined;
        if (v && typeof v.name === "string") out[type].push(v.name);
      }
    }
    return out;
  }

  /**
   * Names of the table's objects of one type, from `nft --json list chains|sets|maps|counters <family>`
   * (declarations only: no rules, no elements, so cheap even for a large table).
   */
  async list(type: ListableType): Promise<string[]> {
    const objs = await this.#list(["--json", "list", `${type}s`, this.family]);
    const out: string[] = [];
    for (const o of objs) {
      const v = o[type] as JsonObj | undefined;
      if (v && v.table === this.table && typeof v.name === "string") out.push(v.name);
    }
    // Nothing of this type: tell an empty table from a missing one, as the interface promises.
    if (out.length === 0 && !(await this.tableExists())) {
      throw new NftablesError(`table ${this.family} ${this.table} does not exist`, { code: "ENOENT" });
    }
    return out;
  }

  /** Elements of a set or map (`nft --json list set|map …`). */
  async listElements(type: "set" | "map", name: string): Promise<Element[]> {
    const objs = await this.#list(["--json", "list", type, this.family, this.table, name]);
    return elementsFromJson(type, name, objs);
  }

  /** `delete table`; false when it did not exist. */
  async deleteTable(): Promise<boolean> {
    const tx = this.newTransaction();
    tx.delete({ kind: "table" });
    try {
      await this.run(tx);
      return true;
    } catch (err) {
      if (err instanceof NftablesError && err.code === "ENOENT") return false;
      throw err;
    }
  }
}
