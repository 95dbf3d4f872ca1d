/**
 * The hash upstream's proxiers put into generated names: RFC 4648 base32 (standard alphabet) of the SHA-256
 * of a name, truncated (16 characters for iptables chains, 8 for nftables chains and sets).
 * @module
 */

const B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

const K = new Uint32Array([
  0x428a2f98,
  0x71374491,
  0xb5c0fbcf,
  0xe9b5dba5,
  0x3956c25b,
  0x59f111f1,
  0x923f82a4,
  0xab1c5ed5,
  0xd807aa98,
  0x12835b01,
  0x243185be,
  0x550c7dc3,
  0x72be5d74,
  0x80deb1fe,
  0x9bdc06a7,
  0xc19bf174,
  0xe49b69c1,
  0xefbe4786,
  0x0fc19dc6,
  0x240ca1cc,
  0x2de92c6f,
  0x4a7484aa,
  0x5cb0a9dc,
  0x76f988da,
  0x983e5152,
  0xa831c66d,
  0xb00327c8,
  0xbf597fc7,
  0xc6e00bf3,
  0xd5a79147,
  0x06ca6351,
  0x14292967,
  0x27b70a85,
  0x2e1b2138,
  0x4d2c6dfc,
  0x53380d13,
  0x650a7354,
  0x766a0abb,
  0x81c2c92e,
  0x92722c85,
  0xa2bfe8a1,
  0xa81a664b,
  0xc24b8b70,
  0xc76c51a3,
  0xd192e819,
  0xd6990624,
  0xf40e3585,
  0x106aa070,
  0x19a4c116,
  0x1e376c08,
  0x2748774c,
  0x34b0bcb5,
  0x391c0cb3,
  0x4ed8aa4a,
  0x5b9cca4f,
  0x682e6ff3,
  0x748f82ee,
  0x78a5636f,
  0x84c87814,
  0x8cc70208,
  0x90befffa,
  0xa4506ceb,
  0xbef9a3f7,
  0xc67178f2,
]);
const W = new Uint32Array(64);
const H = new Uint32Array(8);
const utf8 = new TextEncoder();
let msg = new Uint8Array(256);

/**
 * SHA-256 of a string into `H` (a plain implementation of FIPS 180-4 on reused buffers: hashing a name
 * allocates nothing; node:crypto's digest buffers, one per name, live outside the JS heap and grew the process's
 * malloc heap by about 20 MiB at 10k Services × 10 endpoints).
 */
function sha256(input: string): void {
  if (input.length * 3 + 72 > msg.length) msg = new Uint8Array(input.length * 3 + 72);
  const n = utf8.encodeInto(input, msg).written;
  const total = ((n + 8) >> 6) + 1 << 6; // padded length: a multiple of 64 with room for 0x80 and the length
  msg.fill(0, n, total);
  msg[n] = 0x80;
  const bits = n * 8;
  msg[total - 4] = bits >>> 24;
  msg[total - 3] = bits >>> 16;
  msg[total - 2] = bits >>> 8;
  msg[total - 1] = bits;
  H[0] = 0x6a09e667, H[1] = 0xbb67ae85, H[2] = 0x3c6ef372, H[3] = 0xa54ff53a;
  H[4] = 0x510e527f, H[5] = 0x9b05688c, H[6] = 0x1f83d9ab, H[7] = 0x5be0cd19;
  for (let off = 0; off < total; off += 64) {
    for (let i = 0; i < 16; i++) {
      const j = off + i * 4;
      W[i] = (msg[j] << 24) | (msg[j + 1] << 16) | (msg[j + 2] << 8) | msg[j + 3];
    }
    for (let i = 16; i < 64; i++) {
      const w15 = W[i - 15], w2 = W[i - 2];
      const s0 = ((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3);
      const s1 = ((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10);
      W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
    }
    let a = H[0], b = H[1], c = H[2], d = H[3], e = H[4], f = H[5], g = H[6], h = H[7];
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (h + S1 + ((e & f) ^ (~e & g)) + K[i] + W[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g, g = f, f = e, e = (d + t1) | 0, d = c, c = b, b = a, a = (t1 + t2) | 0;
    }
    H[0] += a, H[1] += b, H[2] += c, H[3] += d, H[4] += e, H[5] += f, H[6] += g, H[7] += h;
  }
}

const codes = new Array<number>(51);

/** The first `chars` (at most 51) base32 characters of SHA-256(`input`), as one flat string. */
export function base32Sha256(input: string, chars: number): string {
  sha256(input);
  codes.length = chars;
  let k = 0, bits = 0, value = 0;
  for (let i = 0; i < 32 && k < chars; i++) {
    const byte = (H[i >> 2] >>> (24 - 8 * (i & 3))) & 0xff;
    value = ((value << 8) | byte) & 0xffff;
    bits += 8;
    while (bits >= 5 && k < chars) {
      codes[k++] = B32.charCodeAt((value >>> (bits - 5)) & 31);
      bits -= 5;
    }
  }
  // One flat string (appending characters one by one would leave a chain of cons strings behind).
  return String.fromCharCode.apply(null, codes);
}
