/**
 * What `explain --live` says in every mode: the lines (rules, elements, real servers, addresses) on the
 * packet's path that the kernel lacks or has beyond what the agent would write now, found as multisets (a
 * line the agent writes twice must be there twice).
 * @module
 */

/** A line of one side but not the other. */
export interface DriftLine {
  /** Where it is: `nat KUBE-SERVICES`, `chain services`, `virtual server -t 10.96.0.1:443`... */
  readonly object: string;
  /** `missing`: the agent would write it and the kernel lacks it; `extra`: in the kernel, not the agent's. */
  readonly kind: "missing" | "extra";
  readonly line: string;
}

/**
 * Appends to `out` the lines of `want` that `have` lacks and those of `have` that `want` lacks; `keyOf` gives
 * the form two lines are compared in (the line itself by default). `keepExtra` filters the extra lines.
 */
export function diffLines<T>(
  object: string,
  want: readonly T[],
  have: readonly T[],
  out: DriftLine[],
  text: (x: T) => string,
  keyOf: (x: T) => string = text,
  keepExtra: (x: T) => boolean = () => true,
): void {
  const left = new Map<string, number>();
  for (const x of have) left.set(keyOf(x), (left.get(keyOf(x)) ?? 0) + 1);
  for (const x of want) {
    const n = left.get(keyOf(x)) ?? 0;
    if (n > 0) left.set(keyOf(x), n - 1);
    else out.push({ object, kind: "missing", line: text(x) });
  }
  for (const x of have) {
    const n = left.get(keyOf(x)) ?? 0;
    if (n === 0) continue;
    left.set(keyOf(x), n - 1);
    if (keepExtra(x)) out.push({ object, kind: "extra", line: text(x) });
  }
}

/** The drift as the lines explain prints after its live section's heading. */
export function formatDrift(drift: readonly DriftLine[]): string[] {
  if (drift.length === 0) {
    return ["Drift:      none on this packet's path: the kernel has exactly what the agent would write now"];
  }
  return [
    "Drift:      the kernel differs from what the agent would write now on this packet's path:",
    ...drift.map((d) =>
      `  ${
        d.kind === "missing" ? "missing from the kernel" : "in the kernel, not the agent's"
      }: ${d.object}: ${d.line}`
    ),
  ];
}
