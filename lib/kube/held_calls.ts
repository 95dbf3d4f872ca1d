/**
 * Informer callbacks held until their receiver exists: the agent starts its Service and EndpointSlice lists
 * while it still waits for its Node and sets up the kernel, and the proxier gets what arrived meanwhile, in
 * order, once it is built.
 * @module
 */
import { log } from "../log.ts";

/**
 * Calls on a receiver `R` that does not exist yet: queued until {@linkcode HeldCalls.release} hands the
 * receiver over, then run in order; after the release each runs at once.
 */
export class HeldCalls<R> {
  #queue: ((receiver: R) => void)[] = [];
  #receiver: R | undefined;
  #released = false;

  /** Runs `fn` on the receiver now if released, else queues it. */
  run(fn: (receiver: R) => void): void {
    if (this.#released) fn(this.#receiver as R);
    else this.#queue.push(fn);
  }

  /** Number of calls waiting for the release. */
  get held(): number {
    return this.#queue.length;
  }

  /**
   * Runs the queued calls on `receiver` in order (one that throws is logged, the others still run; a call queued
   * meanwhile runs after them), then runs later calls at once.
   */
  release(receiver: R): void {
    this.#receiver = receiver;
    for (let i = 0; i < this.#queue.length; i++) {
      try {
        this.#queue[i](receiver);
      } catch (err) {
        log.error("A held informer callback failed", err);
      }
    }
    this.#queue = [];
    this.#released = true;
  }
}
