/**
 * The hash upstream's proxiers put into generated names: RFC 4648 base32 (standard alphabet) of the SHA-256
 * of a name, truncated (16 characters for iptables chains, 8 for nftables chains and sets).
 * @module
 */
import { createHash } from "node:crypto";

const B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/** The first `chars` (at most 51) base32 characters of SHA-256(`input`). */
export function base32Sha256(input: string, chars: number): string {
  const d = createHash("sha256").update(input).digest();
  let out = "";
  let bits = 0;
  let value = 0;
  for (let i = 0; i < d.length && out.length < chars; i++) {
    value = ((value << 8) | d[i]) & 0xffff;
    bits += 8;
    while (bits >= 5 && out.length < chars) {
      out += B32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  return out;
}
