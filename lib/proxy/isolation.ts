/**
 * Finding what a kernel tool refuses, above the dataplane seam (the same for every mode): when a sync fails,
 * the proxier retries it with subsets of the suspect service ports (bisection), each attempt a full sync
 * through the same `Dataplane.sync`, until the ports the tool refuses are known; the rest is programmed.
 *
 * Suspects are the ports whose Services changed since the last successful sync (every port when there was
 * none) and the quarantined ports being retried; the others were accepted by the tool before and are trusted.
 * Each attempt is a full sync, so a failed attempt never leaves the dataplane expecting a partial one. While
 * the search runs, the rules of suspects outside the subset being tried are briefly absent (trusted ports are
 * in every attempt); docs/operations.md says so.
 * @module
 */

/** What {@linkcode isolateRefused} found. */
export interface Isolation<T, R> {
  /** The items programmed by the last (successful) attempt: trusted and accepted suspects. */
  readonly accepted: readonly T[];
  /** The suspects the tool refused, each with the error of the attempt that singled it out. */
  readonly refused: readonly { readonly item: T; readonly error: unknown }[];
  /** The result of the successful attempt that programmed `accepted`. */
  readonly result: R;
  /** Number of attempts made (each one a full sync). */
  readonly attempts: number;
}

/**
 * Bisects `suspects` (whose sync together with `trusted` failed with `firstError`) into those the tool accepts
 * and those it refuses. Returns null when the failure is not caused by suspects (the trusted items alone
 * fail), when there are no suspects, or when more than `maxAttempts` syncs would be needed; the caller then
 * treats the sync as failed as a whole.
 */
export async function isolateRefused<T, R>(
  trusted: readonly T[],
  suspects: readonly T[],
  firstError: unknown,
  trySync: (items: readonly T[]) => Promise<R>,
  maxAttempts = 64,
): Promise<Isolation<T, R> | null> {
  if (suspects.length === 0) return null;
  let attempts = 0;
  const accepted: T[] = [...trusted];
  const refused: { item: T; error: unknown }[] = [];
  let lastOk: { result: R } | null = null;
  let lastAttemptOk = false;

  class TooManyAttempts extends Error {}
  const attempt = async (
    items: readonly T[],
  ): Promise<{ ok: true; result: R } | { ok: false; error: unknown }> => {
    if (++attempts > maxAttempts) throw new TooManyAttempts();
    try {
      const result = await trySync(items);
      lastOk = { result };
      lastAttemptOk = true;
      return { ok: true, result };
    } catch (error) {
      lastAttemptOk = false;
      return { ok: false, error };
    }
  };

  // `error` set: `candidates` are known (inferred) to fail together with `accepted`. A single port is only
  // refused after an attempt of exactly `accepted` plus that port failed, so a transient failure of the tool
  // quarantines nothing.
  const search = async (candidates: readonly T[], inferred: unknown | undefined): Promise<void> => {
    let error = inferred;
    if (error === undefined || candidates.length === 1) {
      const r = await attempt([...accepted, ...candidates]);
      if (r.ok) {
        accepted.push(...candidates);
        return;
      }
      error = r.error;
    }
    if (candidates.length === 1) {
      refused.push({ item: candidates[0], error });
      return;
    }
    const mid = Math.ceil(candidates.length / 2);
    const first = candidates.slice(0, mid);
    const before = accepted.length;
    await search(first, undefined);
    const firstAllAccepted = accepted.length - before === first.length;
    // The whole set failed: if the first half went through as a whole, the second half holds the culprit.
    await search(candidates.slice(mid), firstAllAccepted ? error : undefined);
  };

  try {
    // Trusted ports alone: if the tool refuses those, no subset of suspects explains the failure.
    const base = await attempt(accepted);
    if (!base.ok) return null;
    await search(suspects, firstError);
    if (!lastAttemptOk) {
      const final = await attempt(accepted);
      if (!final.ok) return null;
    }
  } catch (err) {
    if (err instanceof TooManyAttempts) return null;
    throw err;
  }
  return { accepted, refused, result: (lastOk as { result: R } | null)!.result, attempts };
}
