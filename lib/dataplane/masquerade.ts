/**
 * The masquerade mark every mode sets on packets that must be SNATed: Go's `%#08x` of `1 << masqueradeBit`,
 * as upstream formats it (bit 14 → `0x00004000`).
 * @module
 */

/** The mark for a masqueradeBit. */
export function masqueradeMark(bit: number): string {
  return "0x" + ((1 << bit) >>> 0).toString(16).padStart(8, "0");
}
