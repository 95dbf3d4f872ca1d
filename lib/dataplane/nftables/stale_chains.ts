/**
 * Stale chains: generated chains no longer used are flushed at once and deleted in a later transaction, at least
 * {@linkcode STALE_CHAIN_DELAY_MS} later (kernels before 6.2 notice late that a chain is no longer referenced by
 * a map element), as upstream. Unlike upstream, which deletes them in a transaction of its own before the
 * sync's, they go at the end of the next sync's own transaction (or of the syncPeriod poll's): every nft run
 * costs nft's fetch of the table's chains first (~0.9 s at 10k Services × 10 endpoints with nft 1.0.6), so a
 * sync runs nft once, not twice.
 * @module
 */

/** How long an emptied chain waits before it is deleted. */
export const STALE_CHAIN_DELAY_MS = 1000;

/** Emptied chains waiting for deletion, each with the time (ms) since when. */
export class StaleChains {
  #since = new Map<string, number>();

  /** @param now wall clock in ms */
  constructor(private readonly now: () => number) {}

  /** How many chains wait. */
  get size(): number {
    return this.#since.size;
  }

  /** Whether the chain waits for deletion. */
  has(chain: string): boolean {
    return this.#since.has(chain);
  }

  /** The chains waiting. */
  names(): IterableIterator<string> {
    return this.#since.keys();
  }

  /** The chains that have waited long enough to be deleted (they keep waiting). */
  due(): Set<string> {
    const cutoff = this.now() - STALE_CHAIN_DELAY_MS;
    const due = new Set<string>();
    for (const [chain, since] of this.#since) if (since <= cutoff) due.add(chain);
    return due;
  }

  /** The chains that have waited long enough to be deleted, taken out of the waiting list. */
  takeDue(): Set<string> {
    const due = this.due();
    for (const chain of due) this.#since.delete(chain);
    return due;
  }

  /** Forgets every waiting chain (a failed sync: the next full sync finds them again). */
  clear(): void {
    this.#since.clear();
  }

  /** After a full sync: exactly these chains wait, those waiting already since when they did, others from now. */
  keepOnly(chains: readonly string[]): void {
    const now = this.now();
    const stale = new Map<string, number>();
    for (const c of chains) stale.set(c, this.#since.get(c) ?? now);
    this.#since = stale;
  }

  /** After a partial sync: the revived chains (used again) no longer wait, the newly stale ones wait from now. */
  update(revived: readonly string[], stale: readonly string[]): void {
    const now = this.now();
    for (const c of revived) this.#since.delete(c);
    for (const c of stale) this.#since.set(c, now);
  }
}
