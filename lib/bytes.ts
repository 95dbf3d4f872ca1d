/**
 * Byte-array helpers shared by the binary encoders (netlink batches, protobuf frames in the benches).
 * @module
 */

/** The byte arrays one after the other in a new array. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
