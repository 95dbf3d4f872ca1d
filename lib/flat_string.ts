/**
 * Compact copies of strings kept for a long time.
 *
 * V8 builds a string made by concatenation (`a + b`, template literals) as a tree of cons strings, each piece
 * kept: a 130-character rule line built from a template occupies about 240 bytes of heap instead of 150. Using a
 * string as a Set key makes V8 flatten and internalize it in place (equal strings then share one copy), and the
 * garbage collector later replaces references to the tree with the flat copy.
 * @module
 */

const scratch = new Set<string>();

/** `s`, flattened and internalized in place (the same value; it costs less once the next GC has run). */
export function flatString(s: string): string {
  if (s.length < 13) return s; // V8 builds short concatenations flat already
  scratch.add(s);
  scratch.delete(s);
  return s;
}

/** A copy of `s` that does not keep a larger string it was sliced from (a whole command output) alive. */
export function ownString(s: string): string {
  return s.length < 13 ? s : (" " + s).slice(1);
}
