/**
 * Whether a dataplane's next sync must be full: the bookkeeping every mode shares. A full sync is due at the
 * start, after a failed sync, when the proxier asks for one (`changedServices === null`: its periodic resync or
 * its own retry), and when the mode saw the kernel changed behind its back or a setting that changes every
 * rule.
 * @module
 */
import type { ProxySnapshot } from "../proxy/types.ts";

/** The full-sync bookkeeping of one dataplane. */
export class FullSyncState {
  #due = true;
  #everSynced = false;

  /** Whether a sync has succeeded (before that the kernel holds nothing of ours to check). */
  get everSynced(): boolean {
    return this.#everSynced;
  }

  /** Whether a full sync was asked for since the last success. */
  get due(): boolean {
    return this.#due;
  }

  /** The next sync must be full. */
  request(): void {
    this.#due = true;
  }

  /** Whether the sync of `snapshot` must be full. */
  isFull(snapshot: Pick<ProxySnapshot, "changedServices">): boolean {
    return this.#due || snapshot.changedServices === null || !this.#everSynced;
  }

  /** A sync succeeded: the kernel holds what was written. */
  succeeded(): void {
    this.#due = false;
    this.#everSynced = true;
  }

  /**
   * The answer of `needsFullSync()` known without reading the kernel: false before the first sync, true while
   * one is due, null when the mode must look.
   */
  known(): boolean | null {
    if (!this.#everSynced) return false;
    return this.#due ? true : null;
  }
}
