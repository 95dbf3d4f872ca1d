/**
 * nf_tables expressions as the kernel takes them (attribute numbers from `linux/netfilter/nf_tables.h`), each
 * written with its attributes in the order nft 1.0.6 writes them, so that a rule sent by the agent is the rule
 * nft would have sent (the tests compare both batches byte for byte).
 * @module
 */
import { be32, type NetlinkWriter } from "./wire.ts";

/** One expression: its name and a writer of its attributes (inside NFTA_EXPR_DATA). */
export interface Expr {
  readonly name: string;
  readonly write: (w: NetlinkWriter) => void;
}

/** Registers: the verdict register, the 128-bit registers 1-4 and the 32-bit registers 8-23. */
export const REG = { VERDICT: 0, R1: 1, R2: 2 } as const;

/**
 * The register nft names for the 32-bit word `word` of a concatenation loaded from register 1: a 128-bit
 * register where the word starts one, a 32-bit register (8 + word) otherwise.
 */
export function concatRegister(word: number): number {
  return word % 4 === 0 ? word / 4 + 1 : 8 + word;
}

/** Verdict codes. */
export const VERDICT = { DROP: 0, ACCEPT: 1, JUMP: -3, GOTO: -4, RETURN: -5 } as const;

/** A verdict: a code, and the chain for jump and goto. */
export interface Verdict {
  readonly code: number;
  readonly chain?: string;
}

/** Writes NFTA_DATA_VERDICT { code, chain } (inside an NFTA_*_DATA nest). */
export function writeVerdict(w: NetlinkWriter, v: Verdict): void {
  w.open(2); // NFTA_DATA_VERDICT
  w.u32(1, v.code); // NFTA_VERDICT_CODE
  if (v.chain !== undefined) w.str(2, v.chain); // NFTA_VERDICT_CHAIN
  w.close();
}

/** Writes NFTA_DATA_VALUE (inside an NFTA_*_DATA nest). */
function writeValue(w: NetlinkWriter, type: number, bytes: Uint8Array): void {
  w.open(type);
  w.attr(1, bytes); // NFTA_DATA_VALUE
  w.close();
}

/** Payload bases. */
export const PAYLOAD_BASE = { NETWORK: 1, TRANSPORT: 2 } as const;

/** `payload load LEN @ BASE + OFFSET => reg DREG` */
export function payload(base: number, offset: number, len: number, dreg: number = REG.R1): Expr {
  return {
    name: "payload",
    write: (w) => {
      w.u32(1, dreg);
      w.u32(2, base);
      w.u32(3, offset);
      w.u32(4, len);
    },
  };
}

/** cmp operators. */
export const CMP = { EQ: 0, NEQ: 1 } as const;

/** `cmp OP reg SREG DATA` */
export function cmp(op: number, data: Uint8Array, sreg: number = REG.R1): Expr {
  return {
    name: "cmp",
    write: (w) => {
      w.u32(1, sreg);
      w.u32(2, op);
      writeValue(w, 3, data);
    },
  };
}

/** meta keys. */
export const META = { MARK: 3, IIFNAME: 6, L4PROTO: 16 } as const;

/** `meta load KEY => reg DREG` */
export function metaLoad(key: number, dreg: number = REG.R1): Expr {
  return {
    name: "meta",
    write: (w) => {
      w.u32(2, key);
      w.u32(1, dreg);
    },
  };
}

/** `meta set KEY with reg SREG` */
export function metaSet(key: number, sreg: number = REG.R1): Expr {
  return {
    name: "meta",
    write: (w) => {
      w.u32(2, key);
      w.u32(3, sreg);
    },
  };
}

/**
 * `bitwise reg = (reg & MASK) ^ XOR`; `withOp` writes NFTA_BITWISE_OP (boolean), as nft does for a statement
 * (`mark set mark or ...`) and not for a prefix match.
 */
export function bitwise(mask: Uint8Array, xor: Uint8Array, withOp: boolean, reg: number = REG.R1): Expr {
  return {
    name: "bitwise",
    write: (w) => {
      w.u32(1, reg);
      w.u32(2, reg);
      if (withOp) w.u32(6, 0);
      w.u32(3, mask.length);
      writeValue(w, 4, mask);
      writeValue(w, 5, xor);
    },
  };
}

/** fib: `fib saddr type => reg 1` (flags SADDR, result ADDRTYPE). */
export function fibSaddrType(): Expr {
  return {
    name: "fib",
    write: (w) => {
      w.u32(3, 1); // NFTA_FIB_FLAGS: NFTA_FIB_F_SADDR
      w.u32(2, 3); // NFTA_FIB_RESULT: NFT_FIB_RESULT_ADDRTYPE
      w.u32(1, REG.R1);
    },
  };
}

/** `immediate reg 0 VERDICT` */
export function immediateVerdict(v: Verdict): Expr {
  return {
    name: "immediate",
    write: (w) => {
      w.u32(1, REG.VERDICT);
      w.open(2);
      writeVerdict(w, v);
      w.close();
    },
  };
}

/** `immediate reg DREG DATA` */
export function immediateData(dreg: number, data: Uint8Array): Expr {
  return {
    name: "immediate",
    write: (w) => {
      w.u32(1, dreg);
      writeValue(w, 2, data);
    },
  };
}

/** A set a lookup or dynset refers to: by name, and by ID when the same batch creates it. */
export interface SetRef {
  readonly name: string;
  readonly id?: number;
}

/** `lookup reg 1 set SET [dreg DREG] [inverted]` */
export function lookup(set: SetRef, opts: { dreg?: number; inverted?: boolean } = {}): Expr {
  return {
    name: "lookup",
    write: (w) => {
      w.u32(2, REG.R1);
      if (opts.dreg !== undefined) w.u32(3, opts.dreg);
      w.str(1, set.name);
      if (set.id !== undefined) w.u32(4, set.id);
      if (opts.inverted) w.u32(5, 1); // NFT_LOOKUP_F_INV
    },
  };
}

/** `numgen reg 1 = random mod MODULUS` */
export function numgenRandom(modulus: number): Expr {
  return {
    name: "numgen",
    write: (w) => {
      w.u32(1, REG.R1);
      w.u32(2, modulus);
      w.u32(3, 1); // NFT_NG_RANDOM
      w.u32(4, 0);
    },
  };
}

/** `nat dnat FAMILY addr_min reg A proto_min reg P [flags]` */
export function dnat(nfproto: number, addrReg: number, protoReg: number, flags?: number): Expr {
  return {
    name: "nat",
    write: (w) => {
      w.u32(1, 1); // NFT_NAT_DNAT
      w.u32(2, nfproto);
      w.u32(3, addrReg);
      w.u32(5, protoReg);
      if (flags !== undefined) w.u32(7, flags);
    },
  };
}

/** `dynset update reg_key 1 set SET` */
export function dynsetUpdate(set: SetRef): Expr {
  return {
    name: "dynset",
    write: (w) => {
      w.u32(4, REG.R1);
      w.u32(3, 1); // NFT_DYNSET_OP_UPDATE
      w.str(1, set.name);
      if (set.id !== undefined) w.u32(2, set.id);
    },
  };
}

/** A u32 in host byte order (little-endian here), as nft stores integers such as numgen results. */
export function hostU32(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n, true);
  return b;
}

export { be32 };
