/**
 * A token bucket, as client-go's flowcontrol limiter: `qps` tokens per second, at most `burst` stored.
 * @module
 */

/** Token-bucket rate limiter. */
export class TokenBucket {
  private tokens: number;
  private last: number;

  /**
   * @param qps tokens added per second (<= 0: unlimited)
   * @param burst bucket size (at least 1)
   * @param now clock in ms (tests inject it)
   */
  constructor(
    readonly qps: number,
    readonly burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.burst = Math.max(1, Math.floor(burst));
    this.tokens = this.burst;
    this.last = this.now();
  }

  private refill(): void {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.qps);
    this.last = t;
  }

  /** Takes a token if one is available now; never waits. */
  tryTake(): boolean {
    if (this.qps <= 0) return true;
    this.refill();
    if (this.tokens >= 1) {
      this.tokens -= 1;
      return true;
    }
    return false;
  }

  /** Waits (fairly, in call order) until a token is available, then takes it. Rejects if `signal` aborts. */
  take(signal?: AbortSignal): Promise<void> {
    if (this.qps <= 0) return Promise.resolve();
    this.refill();
    // Reserve: the balance may go negative; the caller waits until it would have been refilled.
    this.tokens -= 1;
    if (this.tokens >= 0) return Promise.resolve();
    const waitMs = (-this.tokens / this.qps) * 1000;
    return new Promise((resolve, reject) => {
      const onAbort = () => {
        clearTimeout(timer);
        this.tokens += 1;
        reject(signal!.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, waitMs);
      if (signal) {
        if (signal.aborted) return onAbort();
        signal.addEventListener("abort", onAbort, { once: true });
      }
    });
  }
}
