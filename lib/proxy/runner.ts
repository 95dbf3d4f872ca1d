/**
 * Bounded-frequency runner with upstream's v1.34 semantics (`pkg/proxy/runner/bounded_frequency_runner.go`):
 *
 * 1. `minIntervalMs` passes between the *end* of one run and the *start* of the next; requests made
 *    meanwhile coalesce into one run right after the wait (no burst).
 * 2. `fn` runs at least once per `maxIntervalMs` (the timer restarts after each run).
 * 3. A failed run (rejected promise) runs again after `retryIntervalMs` unless something else runs it
 *    sooner; a later success cancels the retry.
 * 4. Never two runs at once.
 * @module
 */
import { log } from "../log.ts";
import { type Clock, realClock, type TimerId } from "./clock.ts";

/** Intervals of a {@linkcode BoundedFrequencyRunner}, in milliseconds. */
export interface RunnerOptions {
  minIntervalMs: number;
  retryIntervalMs: number;
  maxIntervalMs: number;
  /** @default realClock */
  clock?: Clock;
}

type State = "stopped" | "idle" | "running" | "cooldown";

/** Runs an async function on request, no more often than allowed and at least periodically. */
export class BoundedFrequencyRunner {
  readonly #clock: Clock;
  #state: State = "stopped";
  #pending = false;
  #maxTimer: TimerId | null = null;
  #retryTimer: TimerId | null = null;
  #minTimer: TimerId | null = null;
  #inFlight: Promise<void> | null = null;
  #runs = 0;

  /**
   * @param name Name for logs.
   * @param fn The work; a rejection counts as a failure and schedules a retry.
   * @param opts Intervals and clock.
   * @throws {RangeError} When maxIntervalMs < minIntervalMs.
   */
  constructor(
    readonly name: string,
    private readonly fn: () => Promise<void>,
    private readonly opts: RunnerOptions,
  ) {
    if (opts.maxIntervalMs < opts.minIntervalMs) {
      throw new RangeError(
        `${name}: maxInterval (${opts.maxIntervalMs} ms) must be >= minInterval (${opts.minIntervalMs} ms)`,
      );
    }
    this.#clock = opts.clock ?? realClock;
  }

  /** Number of completed runs. */
  get runs(): number {
    return this.#runs;
  }

  /** True while `fn` executes. */
  get running(): boolean {
    return this.#state === "running";
  }

  /** Starts the loop: arms the periodic timer, and runs at once if a request came before start. */
  start(): void {
    if (this.#state !== "stopped") return;
    log.v(3).info("Loop running", { name: this.name });
    this.#state = "idle";
    this.#armMax();
    if (this.#pending) {
      this.#pending = false;
      this.#execute();
    }
  }

  /** Asks for a run as soon as allowed. Requests coalesce. Before start() the request is kept for start(). */
  run(): void {
    if (this.#state === "idle") this.#execute();
    else this.#pending = true;
  }

  /** Stops the loop and waits for a run in progress to finish. */
  async stop(): Promise<void> {
    this.#state = "stopped";
    this.#pending = false;
    for (const t of [this.#maxTimer, this.#retryTimer, this.#minTimer]) {
      if (t !== null) this.#clock.clearTimeout(t);
    }
    this.#maxTimer = this.#retryTimer = this.#minTimer = null;
    if (this.#inFlight) await this.#inFlight;
    log.v(3).info("Loop stopping", { name: this.name });
  }

  #armMax(): void {
    if (this.#maxTimer !== null) this.#clock.clearTimeout(this.#maxTimer);
    this.#maxTimer = this.#clock.setTimeout(() => {
      this.#maxTimer = null;
      this.run();
    }, this.opts.maxIntervalMs);
  }

  #execute(): void {
    this.#state = "running";
    if (this.#maxTimer !== null) this.#clock.clearTimeout(this.#maxTimer);
    this.#maxTimer = null;
    const run = (async () => {
      let failed = false;
      try {
        await this.fn();
      } catch (err) {
        failed = true;
        log.v(3).info("retrying", {
          name: this.name,
          intervalMs: this.opts.retryIntervalMs,
          err: String(err),
        });
      }
      this.#runs++;
      if (this.#state === "stopped") return;
      if (this.#retryTimer !== null) this.#clock.clearTimeout(this.#retryTimer);
      this.#retryTimer = null;
      if (failed) {
        this.#retryTimer = this.#clock.setTimeout(() => {
          this.#retryTimer = null;
          this.run();
        }, this.opts.retryIntervalMs);
      }
      this.#armMax();
      this.#state = "cooldown";
      if (this.opts.minIntervalMs <= 0) this.#endCooldown();
      else {
        this.#minTimer = this.#clock.setTimeout(() => {
          this.#minTimer = null;
          this.#endCooldown();
        }, this.opts.minIntervalMs);
      }
    })();
    this.#inFlight = run;
    run.finally(() => {
      if (this.#inFlight === run) this.#inFlight = null;
    });
  }

  #endCooldown(): void {
    if (this.#state !== "cooldown") return;
    this.#state = "idle";
    if (this.#pending) {
      this.#pending = false;
      this.#execute();
    }
  }
}
