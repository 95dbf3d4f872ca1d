/**
 * {@linkcode NetlinkNftables}: the opt-in netlink path (`--nftables-netlink`). A transaction whose every
 * operation `batch.ts` can encode (a partial sync's, a full sync's run ahead) is sent to the kernel as one
 * nf_tables batch on the agent's own socket: no nft process, and no cache fetch (nft 1.0.6 reads every set of the
 * table before any `add rule` or `add element`, 85-90 % of a change's cost at 10k Services). Everything else (a
 * full sync's own transaction, checks, listings, other transactions) goes to the wrapped {@linkcode Nftables},
 * nft. Errors carry the failing operation's input line and ENOENT/EEXIST/EBUSY as nft's would.
 * @module
 */
import { NftablesError, type NftErrorCode } from "../errors.ts";
import type { ListableType, Nftables } from "../interface.ts";
import { type Element, type Family, validateObject, writeObject } from "../objects.ts";
import type { Operation, Transaction } from "../transaction.ts";
import { nftablesTransactionsTotal } from "../../../metrics.ts";
import { encodeBatch } from "./batch.ts";
import { errnoText, NetfilterSocket } from "./socket.ts";
import { NetlinkWriter, NLMSG, parseError } from "./wire.ts";

const CODES: Readonly<Record<number, NftErrorCode>> = { 2: "ENOENT", 17: "EEXIST", 16: "EBUSY" };

/** The largest write buffer kept between batches. */
const KEEP_BUFFER_BYTES = 256 * 1024;

/** How many transactions went each way (for the log and the tests). */
export interface NetlinkCounts {
  netlink: number;
  nft: number;
}

/** {@linkcode Nftables} sending encodable transactions over netlink, the rest through `fallback`. */
export class NetlinkNftables implements Nftables {
  readonly family: Family;
  readonly table: string;
  /** Transactions sent each way so far. */
  readonly counts: NetlinkCounts = { netlink: 0, nft: 0 };
  readonly #fallback: Nftables;
  #socket: NetfilterSocket | undefined;
  /**
   * One buffer for the batches, reused (a full sync's runs ahead are 1-5 MiB each at 1 000 ports: one buffer
   * grown once, not one per run), and let go when the full sync's own transaction follows them, so that a large
   * one is not held for the agent's life (partial syncs need KiB).
   */
  #writer = new NetlinkWriter();
  readonly #netns: string | undefined;

  /**
   * @param fallback nft, for what netlink does not carry
   * @param netns tests: the named network namespace to open the socket in (the agent uses its own)
   */
  constructor(fallback: Nftables, netns?: string) {
    this.#fallback = fallback;
    this.#netns = netns;
    this.family = fallback.family;
    this.table = fallback.table;
  }

  /**
   * Opens the socket now, so that a missing `--allow-ffi` or libc fails the start, not the first change.
   * @throws when the socket cannot be opened
   */
  open(): void {
    this.#socket ??= new NetfilterSocket(this.#netns);
  }

  newTransaction(): Transaction {
    return this.#fallback.newTransaction();
  }

  async run(tx: Transaction): Promise<void> {
    if (tx.error) throw tx.error;
    if (tx.numOperations === 0) return;
    if (!await this.#send(tx.operations, () => tx.lines())) return this.#fallback.run(tx);
  }

  /**
   * Sends the operations as one batch when every one encodes; false (nothing sent) when one does not.
   * @throws {NftablesError} when the kernel refuses the batch (nothing applied)
   */
  async #send(ops: readonly Operation[], lines: () => string[]): Promise<boolean> {
    const socket = this.#socket ??= new NetfilterSocket(this.#netns);
    const batch = encodeBatch(this.family, this.table, ops, socket.nextSeq, this.#writer);
    const ipFamily = this.family === "ip6" ? "IPv6" : "IPv4";
    if (batch === null) {
      this.counts.nft++;
      nftablesTransactionsTotal.inc({ ip_family: ipFamily, path: "nft" });
      return false;
    }
    socket.usedSeq(batch.endSeq);
    this.counts.netlink++;
    nftablesTransactionsTotal.inc({ ip_family: ipFamily, path: "netlink" });
    const replies = await socket.exchange(batch.bytes);
    let first: { errno: number; op?: number } | undefined;
    let errors = 0;
    for (const m of replies) {
      if (m.type !== NLMSG.ERROR) continue;
      const e = parseError(m);
      // Only this batch's answers (a reply left from an interrupted exchange is not about this batch).
      if (e.errno === 0 || e.seq < batch.firstSeq || e.seq >= batch.endSeq) continue;
      errors++;
      const op = batch.opOfSeq.get(e.seq);
      // The first failing operation by position (the kernel reports them in batch order; a commit-time failure
      // names the batch itself).
      if (first === undefined || (op !== undefined && (first.op === undefined || op < first.op))) {
        first = { errno: e.errno, op };
      }
    }
    if (first === undefined) return true;
    const line = first.op === undefined ? undefined : first.op + 1;
    const inputLine = first.op === undefined ? undefined : lines()[first.op];
    const where = line !== undefined ? ` (line ${line}: ${inputLine})` : "";
    const more = errors > 1 ? ` (and ${errors - 1} more error(s))` : "";
    throw new NftablesError(`netlink: ${errnoText(first.errno)}${where}${more}`, {
      code: CODES[first.errno],
      line,
      inputLine,
    });
  }

  /**
   * A list of operations (a full sync's run ahead) goes over netlink when every one encodes; a generator (the
   * full sync's own transaction, produced while it is sent) and anything else to nft.
   */
  async runOperations(ops: Iterable<Operation>): Promise<number> {
    if (Array.isArray(ops)) {
      const list = ops as readonly Operation[];
      for (const [n, o] of list.entries()) {
        // Checked as nft's path checks each operation before anything is sent.
        const problem = validateObject(o.verb, o.obj, this.family);
        if (problem !== undefined) {
          throw new NftablesError(`invalid operation ${n + 1} (${o.verb} ${o.obj.kind}): ${problem}`, {
            invalid: true,
          });
        }
      }
      const lines = () => list.map((o) => writeObject(o.verb, o.obj, this.family, this.table));
      if (list.length > 0 && await this.#send(list, lines)) return 0;
      return this.#fallback.runOperations(list);
    }
    this.counts.nft++;
    nftablesTransactionsTotal.inc({ ip_family: this.family === "ip6" ? "IPv6" : "IPv4", path: "nft" });
    if (this.#writer.capacity > KEEP_BUFFER_BYTES) this.#writer = new NetlinkWriter();
    return this.#fallback.runOperations(ops);
  }

  check(tx: Transaction): Promise<void> {
    return this.#fallback.check(tx);
  }

  tableExists(): Promise<boolean> {
    return this.#fallback.tableExists();
  }

  list(type: ListableType): Promise<string[]> {
    return this.#fallback.list(type);
  }

  listAll(): Promise<Record<ListableType, string[]>> {
    return this.#fallback.listAll();
  }

  listElements(type: "set" | "map", name: string): Promise<Element[]> {
    return this.#fallback.listElements(type, name);
  }

  deleteTable(): Promise<boolean> {
    return this.#fallback.deleteTable();
  }

  /** Closes the socket. */
  close(): void {
    this.#socket?.close();
    this.#socket = undefined;
  }
}
