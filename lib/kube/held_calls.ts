/**
 * Informer callbacks held until their receiver exists: the agent starts its Service and EndpointSlice lists
 * while it still waits for its Node and sets up the kernel, and the proxier gets what arrived meanwhile, in
 * order, once it is built.
 * @module
 */
import { log } from "../log.ts";

/** Calls queued until {@linkcode HeldCalls.release}, then run in order; after the release each runs at once. */
export class HeldCalls {
  #queue: (() => void)[] | null = [];

  /** Runs `fn` now if released, else queues it. */
  run(fn: () => void): void {
    if (this.#queue === null) fn();
    else this.#queue.push(fn);
  }

  /** Number of calls waiting for the release. */
  get held(): number {
    return this.#queue?.length ?? 0;
  }

  /** Runs the queued calls in order (one that throws is logged, the others still run) and stops holding. */
  release(): void {
    const queue = this.#queue;
    this.#queue = null;
    for (const fn of queue ?? []) {
      try {
        fn();
      } catch (err) {
        log.error("A held informer callback failed", err);
      }
    }
  }
}
