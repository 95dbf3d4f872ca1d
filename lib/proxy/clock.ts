/**
 * An injectable clock (now + timers), so that the runner, the proxier and the health servers can be
 * driven by {@linkcode FakeClock} in tests instead of real sleeping.
 * @module
 */

/** Opaque timer handle. */
export type TimerId = number;

/** Time source and timers. */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Calls `fn` once after `ms` milliseconds. */
  setTimeout(fn: () => void, ms: number): TimerId;
  /** Cancels a timer; unknown or fired ids are ignored. */
  clearTimeout(id: TimerId): void;
}

/** The wall clock and the global timers. */
export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms) as unknown as TimerId,
  clearTimeout: (id) => clearTimeout(id as unknown as Parameters<typeof clearTimeout>[0]),
};

interface FakeTimer {
  id: TimerId;
  at: number;
  fn: () => void;
}

/**
 * A manual clock for tests: time moves only through {@linkcode FakeClock.advance}, which fires due
 * timers in time order and lets promises settle between them.
 *
 * @example Usage
 * ```ts ignore
 * const clock = new FakeClock(0);
 * let fired = false;
 * clock.setTimeout(() => fired = true, 1000);
 * await clock.advance(1000); // fired === true
 * ```
 */
export class FakeClock implements Clock {
  #now: number;
  #next = 1;
  #timers: FakeTimer[] = [];

  /** @param startMs Initial time in ms since the epoch. */
  constructor(startMs = Date.UTC(2026, 0, 1)) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  setTimeout(fn: () => void, ms: number): TimerId {
    const id = this.#next++;
    this.#timers.push({ id, at: this.#now + Math.max(0, ms), fn });
    return id;
  }

  clearTimeout(id: TimerId): void {
    this.#timers = this.#timers.filter((t) => t.id !== id);
  }

  /** Number of armed timers. */
  get pendingTimers(): number {
    return this.#timers.length;
  }

  /** Lets pending promise callbacks (and 0 ms real macrotasks) run. */
  async settle(): Promise<void> {
    for (let i = 0; i < 3; i++) await new Promise<void>((r) => setTimeout(r, 0));
  }

  /** Moves time forward by `ms`, firing every timer that falls due, in order, settling after each. */
  async advance(ms: number): Promise<void> {
    const end = this.#now + ms;
    await this.settle();
    for (;;) {
      let due: FakeTimer | undefined;
      for (const t of this.#timers) if (t.at <= end && (!due || t.at < due.at)) due = t;
      if (!due) break;
      this.#timers = this.#timers.filter((t) => t !== due);
      this.#now = Math.max(this.#now, due.at);
      due.fn();
      await this.settle();
    }
    this.#now = end;
    await this.settle();
  }
}
