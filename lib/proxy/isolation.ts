/**
 * Finding what a kernel tool refuses, above the dataplane seam (the same for every mode): when a sync fails,
 * the proxier bisects the suspect service ports until the ports the tool refuses are known; the rest is
 * programmed.
 *
 * Suspects are the ports whose Services changed since the last successful sync (every port when there was
 * none) and the quarantined ports being retried; the others were accepted by the tool before and are trusted.
 *
 * - With a check (`Dataplane.check`: iptables and nftables modes): every attempt of the search is a check of
 *   the full sync of a subset in the tool's check mode (`iptables-restore --test`, `nft -c -f -`), which
 *   commits nothing; then ONE real full sync of the accepted ports. The kernel only ever holds the last good
 *   rules or the new accepted set: no Service's rules are absent while the search runs, on a restart too.
 *   Should that real sync still fail (the kernel refuses what the check accepted), the search is run again
 *   with real syncs, as below.
 * - Without (ipvs mode: ipvsadm and ipset have no check mode): each attempt is a real full sync through the
 *   same `Dataplane.sync`, so a failed attempt never leaves the dataplane expecting a partial one. While the
 *   search runs, the rules of suspects outside the subset being tried are briefly absent (trusted ports are in
 *   every attempt); on the first sync after a restart every port is a suspect. docs/operations.md says so.
 * @module
 */

/** What {@linkcode isolateRefused} found. */
export interface Isolation<T, R> {
  /** The items programmed by the last (successful) real sync: trusted and accepted suspects. */
  readonly accepted: readonly T[];
  /** The suspects the tool refused, each with the error of the attempt that singled it out. */
  readonly refused: readonly { readonly item: T; readonly error: unknown }[];
  /** The result of the successful real sync that programmed `accepted`. */
  readonly result: R;
  /** Number of attempts made (checks and real full syncs). */
  readonly attempts: number;
  /** Number of those attempts that were real syncs (1 when the checks found the answer). */
  readonly realSyncs: number;
}

/** Options of {@linkcode isolateRefused}. */
export interface IsolateOptions<T> {
  /** Give up (null) when the search would need more attempts than this. @default 64 */
  readonly maxAttempts?: number;
  /**
   * Checks a set of items without committing anything (rejects as the sync would). When given, the search
   * uses it for every attempt and `trySync` runs once, with the accepted items.
   */
  readonly check?: (items: readonly T[]) => Promise<void>;
}

/**
 * Bisects `suspects` (whose sync together with `trusted` failed with `firstError`) into those the tool accepts
 * and those it refuses, with `options.check` when given (then one `trySync` of the accepted items), else with
 * `trySync` itself. Returns null when the failure is not caused by suspects (the trusted items alone fail),
 * when there are no suspects, or when more than `maxAttempts` attempts would be needed; the caller then treats
 * the sync as failed as a whole.
 */
export async function isolateRefused<T, R>(
  trusted: readonly T[],
  suspects: readonly T[],
  firstError: unknown,
  trySync: (items: readonly T[]) => Promise<R>,
  options: IsolateOptions<T> = {},
): Promise<Isolation<T, R> | null> {
  const max = options.maxAttempts ?? 64;
  const check = options.check;
  if (suspects.length === 0) return null;
  if (check === undefined) {
    const found = await bisect(trusted, suspects, firstError, trySync, max, true);
    return found && { ...found, realSyncs: found.attempts };
  }
  const checked = await bisect(trusted, suspects, firstError, check, max, false);
  if (!checked) return null;
  let result: R;
  try {
    result = await trySync(checked.accepted);
  } catch {
    // The kernel refused what its tool's check accepted: search again with real syncs.
    const real = await bisect(trusted, suspects, firstError, trySync, max, true);
    const attempts = checked.attempts + 1 + (real?.attempts ?? 0);
    return real && { ...real, attempts, realSyncs: 1 + real.attempts };
  }
  return {
    accepted: checked.accepted,
    refused: checked.refused,
    result,
    attempts: checked.attempts + 1,
    realSyncs: 1,
  };
}

/**
 * The search itself; every attempt goes through `attempt`. With `finish`, the last attempt is one of exactly
 * the accepted items (its result returned); without, that last attempt is left to the caller.
 */
async function bisect<T, R>(
  trusted: readonly T[],
  suspects: readonly T[],
  firstError: unknown,
  trySync: (items: readonly T[]) => Promise<R>,
  maxAttempts: number,
  finish: boolean,
): Promise<{ accepted: T[]; refused: { item: T; error: unknown }[]; result: R; attempts: number } | null> {
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
    if (finish && !lastAttemptOk) {
      const final = await attempt(accepted);
      if (!final.ok) return null;
    }
  } catch (err) {
    if (err instanceof TooManyAttempts) return null;
    throw err;
  }
  return { accepted, refused, result: (lastOk as { result: R } | null)!.result, attempts };
}
