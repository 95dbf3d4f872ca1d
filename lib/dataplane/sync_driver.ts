/**
 * The sync driver every mode's dataplane runs its syncs through: what the three modes share behind the
 * `Dataplane` seam. It owns
 * - the family check of a snapshot,
 * - one lock that serializes the mode's kernel writes (syncs, and a mode's own writes between syncs such as
 *   ipvs's drain checks or nftables's stale-chain deletions),
 * - the full-sync bookkeeping ({@linkcode FullSyncState}): whether this sync must be full, a failed sync makes
 *   the next one full,
 * - the failure path (the mode's failure metric and log through `onFailure`, then the rejection),
 * - the success path: the `SyncProxyRules complete` log line with the mode's figures and the
 *   {@linkcode SyncResult}.
 *
 * A mode supplies only its own decisions: a `body` that renders and applies the sync and reports what it did.
 * @module
 */
import type { Logger } from "../log.ts";
import type { IPFamily, ProxySnapshot, SyncResult } from "../proxy/types.ts";
import { FullSyncState } from "./full_sync_state.ts";

/** What one mode's sync did: the driver logs it and returns it as the {@linkcode SyncResult}. */
export interface ModeSyncOutcome {
  /** Whether everything was written (a mode may make a partial sync full, e.g. when its settings changed). */
  readonly full: boolean;
  /** Bytes handed to the kernel tool(s). */
  readonly bytes: number;
  /** Milliseconds spent generating the payload (within `applyMs` where generation streams into the tool). */
  readonly generateMs: number;
  /** Milliseconds from the first write to the kernel tool to its exit. */
  readonly applyMs: number;
  /** The mode's own fields of the `SyncProxyRules complete` line (e.g. `virtualServers`, `deletedChains`). */
  readonly logFields?: Readonly<Record<string, unknown>>;
  /** The sync succeeded but the next one must be full all the same (e.g. a kubelet jump rule is missing). */
  readonly nextFull?: boolean;
}

/** The mode's part of one sync: renders and applies it, `full` as the driver decided it. */
export type ModeSyncBody = (full: boolean) => Promise<ModeSyncOutcome>;

/** How a mode is named and told about failures. */
export interface SyncDriverOptions {
  /** The mode, as its errors name it (`iptables`, `nftables`, `ipvs`). */
  readonly mode: string;
  readonly family: IPFamily;
  /** The family's logger (the success line is logged at v(2)). */
  readonly logger: Logger;
}

/** Runs one family's syncs for one mode (see the module doc). */
export class SyncDriver {
  readonly #opts: SyncDriverOptions;
  readonly #fullSync = new FullSyncState();
  #lock: Promise<unknown> = Promise.resolve();

  constructor(opts: SyncDriverOptions) {
    this.#opts = opts;
  }

  /** Whether a sync has succeeded (before that the kernel holds nothing of ours to check). */
  get everSynced(): boolean {
    return this.#fullSync.everSynced;
  }

  /** The next sync must be full (the kernel changed behind our back, a mode's own write failed). */
  requestFull(): void {
    this.#fullSync.request();
  }

  /**
   * The answer of `needsFullSync()` known without reading the kernel: false before the first sync, true while
   * one is due, null when the mode must look.
   */
  knownNeedsFull(): boolean | null {
    return this.#fullSync.known();
  }

  /** Runs `fn` under the lock every kernel write of this dataplane takes (one at a time, in call order). */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.#lock.then(fn, fn);
    this.#lock = p.catch(() => undefined);
    return p;
  }

  /**
   * Runs one sync of `snapshot` under the lock: decides whether it is full, runs the mode's `body`, and on
   * success logs and returns its figures. When `body` rejects, the next sync is full, `onFailure` (the mode's
   * metric and log) runs, and the rejection is passed on.
   */
  sync(
    snapshot: ProxySnapshot,
    body: ModeSyncBody,
    onFailure?: (err: unknown) => void,
  ): Promise<SyncResult> {
    const { mode, family } = this.#opts;
    if (snapshot.family !== family) {
      return Promise.reject(new Error(`${mode} dataplane for ${family} got a ${snapshot.family} snapshot`));
    }
    return this.exclusive(async () => {
      let out: ModeSyncOutcome;
      try {
        out = await body(this.#fullSync.isFull(snapshot));
      } catch (err) {
        this.#fullSync.request();
        onFailure?.(err);
        throw err;
      }
      this.#fullSync.succeeded();
      if (out.nextFull) this.#fullSync.request();
      this.#opts.logger.v(2).info("SyncProxyRules complete", {
        full: out.full,
        ...out.logFields,
        bytes: out.bytes,
        generateMs: Math.round(out.generateMs * 10) / 10,
        applyMs: Math.round(out.applyMs),
      });
      return { full: out.full, payloadBytes: out.bytes, generateMs: out.generateMs, applyMs: out.applyMs };
    });
  }
}
