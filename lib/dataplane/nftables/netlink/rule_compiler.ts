/**
 * The rules a service port's chains hold (`rules.ts`), compiled from their nft text into nf_tables expressions
 * and anonymous sets as nft 1.0.6 compiles them. Only those forms are known: any other text compiles to null,
 * and the transaction that holds it goes to nft instead. The forms:
 *
 * - matches: `fib saddr type local`, `meta l4proto tcp|udp|sctp`, `ip[6] saddr [!=] ADDR[/PREFIX]`,
 *   `ip[6] saddr [!=] { ADDR[/PREFIX] , ... }` (an anonymous interval set, as loadBalancerSourceRanges),
 *   `ip[6] saddr @SET`, `iifname [!=] NAME` or `iifname [!=] PREFIX*`;
 * - statements: `mark set mark or 0xMASK`, `update @SET { ip[6] saddr }`, `dnat to ADDR:PORT` (`[ADDR6]:PORT`),
 *   `dnat ip[6] addr . port to numgen random mod N map { I : ADDR . PORT , ... }`,
 *   `numgen random mod N vmap { I : goto CHAIN , ... }`;
 * - verdicts: `goto CHAIN`, `jump CHAIN`, `drop`, `accept`, `return`.
 * @module
 */
import { concatBytes } from "../../../bytes.ts";
import { ipValue } from "../../../net/ip.ts";
import {
  bitwise,
  CMP,
  cmp,
  concatRegister,
  dnat,
  dynsetUpdate,
  type Expr,
  fibSaddrType,
  hostU32,
  immediateData,
  immediateVerdict,
  lookup,
  META,
  metaLoad,
  metaSet,
  numgenRandom,
  payload,
  PAYLOAD_BASE,
  REG,
  type SetRef,
  VERDICT,
  type Verdict,
} from "./expressions.ts";
import { be32, NFPROTO } from "./wire.ts";

/** nft's datatype numbers (concatenations: 6 bits per part). */
export const DATATYPE = { INTEGER: 4, IPV4: 7, IPV6: 8, INET_PROTO: 12, INET_SERVICE: 13 } as const;

/** The kernel's data type of a verdict map. */
export const DATA_VERDICT = 0xffffff00;

/** Set flags. */
export const SET_FLAG = {
  ANONYMOUS: 0x1,
  CONSTANT: 0x2,
  INTERVAL: 0x4,
  MAP: 0x8,
  TIMEOUT: 0x10,
  EVAL: 0x20,
} as const;

/** One element of an anonymous set: its key and, in a map, its data or verdict. */
export interface AnonElement {
  readonly key: Uint8Array;
  readonly data?: Uint8Array;
  readonly verdict?: Verdict;
  /** NFT_SET_ELEM_INTERVAL_END: the element ends an interval (interval sets). */
  readonly intervalEnd?: boolean;
  /** nft's user data of the element (an interval open to the end of the address space). */
  readonly userdata?: Uint8Array;
}

/** An anonymous set a rule creates in the same batch (bound to the rule; gone with it). */
export interface AnonSet {
  readonly name: "__map%d" | "__set%d";
  readonly id: number;
  readonly flags: number;
  readonly keyType: number;
  readonly keyLen: number;
  readonly dataType?: number;
  readonly dataLen?: number;
  /** nft's user data for the set (byte orders and the like), which `nft list` reads back. */
  readonly userdata: Uint8Array;
  readonly elements: readonly AnonElement[];
  /** NFTA_SET_DESC_SIZE (nft's count of the set's elements before it merges intervals). */
  readonly size: number;
}

/** A compiled rule: its expressions and the anonymous sets to create before it. */
export interface CompiledRule {
  readonly exprs: readonly Expr[];
  readonly sets: readonly AnonSet[];
}

const hex = (s: string) => new Uint8Array(s.match(/../g)!.map((h) => parseInt(h, 16)));

/** nft's user data of a `numgen ... map { I : ADDR . PORT }` map and of a `numgen ... vmap`. */
const UDATA_NUMGEN_MAP = hex("000401000000010400000000060400000000");
const UDATA_NUMGEN_VMAP = hex("00040100000001040000000004080004010000000100060400000000");
/** nft's user data of an address interval set matched by `ip saddr` / `ip6 saddr` (byte order, merge, typeof). */
const UDATA_SADDR_INTERVALS = {
  ip: hex("0004020000000204010000000314000407000000010c00040c00000001040b000000"),
  ip6: hex("0004020000000204010000000314000407000000010c00040d000000010408000000"),
} as const;
/** An interval element's user data: NFTNL_UDATA_SET_ELEM_FLAGS = interval open (it runs to the last address). */
const UDATA_INTERVAL_OPEN = hex("010401000000");

const PROTOCOLS: Readonly<Record<string, number>> = { tcp: 6, udp: 17, sctp: 132 };
const IFNAMSIZ = 16;
const encoder = new TextEncoder();

/** The address family a rule is compiled for: the table's family and its address size. */
export interface RuleFamily {
  /** `ip` or `ip6`: the match keyword and table family. */
  readonly keyword: "ip" | "ip6";
  readonly nfproto: number;
  readonly addrLen: number;
  /** Offset of the source address in the network header. */
  readonly saddrOffset: number;
  readonly addrType: number;
}

/** The two families kube-proxy writes. */
export const RULE_FAMILY: Readonly<Record<"ip" | "ip6", RuleFamily>> = {
  ip: { keyword: "ip", nfproto: NFPROTO.IPV4, addrLen: 4, saddrOffset: 12, addrType: DATATYPE.IPV4 },
  ip6: { keyword: "ip6", nfproto: NFPROTO.IPV6, addrLen: 16, saddrOffset: 8, addrType: DATATYPE.IPV6 },
};

/** The bytes of an address of the family (network order), or null when `s` is not one. */
export function addressBytes(s: string, fam: RuleFamily): Uint8Array | null {
  const v = ipValue(s);
  if (v === null || s.includes("%") || (v.family === "IPv6") !== (fam.addrLen === 16)) return null;
  const out = new Uint8Array(fam.addrLen);
  let x = v.value;
  for (let i = fam.addrLen - 1; i >= 0; i--) {
    out[i] = Number(x & 0xffn);
    x >>= 8n;
  }
  return out;
}

/** A port (1-65535) as two bytes in network order, or null. */
export function portBytes(s: string): Uint8Array | null {
  if (!/^[1-9][0-9]{0,4}$/.test(s) || Number(s) > 65535) return null;
  const n = Number(s);
  return new Uint8Array([n >> 8, n & 0xff]);
}

/** The protocol number of `tcp`, `udp` or `sctp`, or null. */
export function protocolNumber(s: string): number | null {
  return PROTOCOLS[s] ?? null;
}

/** A chain name as a verdict's target (no quotes, no spaces: what the renderer writes). */
const CHAIN_NAME = /^[A-Za-z0-9_][A-Za-z0-9_./:+=@,-]*$/;

/** A set name as referenced by `@NAME`. */
const SET_NAME = /^[A-Za-z0-9_][A-Za-z0-9_./:+=,-]*$/;

/** Pads `b` with zeros to a multiple of 4 bytes (how each part of a concatenation is laid out). */
function pad4(b: Uint8Array): Uint8Array {
  const out = new Uint8Array((b.length + 3) & ~3);
  out.set(b);
  return out;
}

/**
 * Compiles one rule (without its comment). `setId` hands out the batch's set IDs; `setIdOf` gives the ID of a
 * named set the same batch creates (undefined for an existing set). Null when the text is not one of the known
 * forms (nothing is handed out then).
 */
export function compileRule(
  text: string,
  fam: RuleFamily,
  setId: () => number,
  setIdOf: (name: string) => number | undefined = () => undefined,
): CompiledRule | null {
  const t = text.split(" ");
  const exprs: Expr[] = [];
  const sets: AnonSet[] = [];
  let i = 0;
  const ref = (name: string): SetRef => ({ name, id: setIdOf(name) });
  // Defer handing out IDs until the whole rule compiled.
  const pendingSets: ((id: number) => AnonSet)[] = [];
  const pendingLookups: { index: number; make: (id: number) => Expr }[] = [];

  const verdictAt = (j: number): [Verdict, number] | null => {
    const w = t[j];
    if (w === "drop") return [{ code: VERDICT.DROP }, 1];
    if (w === "accept") return [{ code: VERDICT.ACCEPT }, 1];
    if (w === "return") return [{ code: VERDICT.RETURN }, 1];
    if ((w === "goto" || w === "jump") && j + 1 < t.length && CHAIN_NAME.test(t[j + 1])) {
      return [{ code: w === "goto" ? VERDICT.GOTO : VERDICT.JUMP, chain: t[j + 1] }, 2];
    }
    return null;
  };
  // `{ I : X , I : X , ... }` from t[j] (`{`): the items and the index after `}`.
  const mapItems = (j: number): [string[][], number] | null => {
    if (t[j] !== "{") return null;
    const items: string[][] = [];
    let cur: string[] = [];
    for (let k = j + 1; k < t.length; k++) {
      if (t[k] === "," || t[k] === "}") {
        items.push(cur);
        cur = [];
        if (t[k] === "}") return [items, k + 1];
      } else cur.push(t[k]);
    }
    return null;
  };

  // `numgen random mod N` into an anonymous map from 0..N-1 (to endpoints or verdicts), looked up into `dreg`.
  const numgenMap = (
    n: number,
    dataType: number,
    dataLen: number,
    userdata: Uint8Array,
    elements: AnonElement[],
    dreg: number,
  ) => {
    pendingSets.push((id) => ({
      name: "__map%d",
      id,
      flags: SET_FLAG.ANONYMOUS | SET_FLAG.CONSTANT | SET_FLAG.MAP,
      keyType: DATATYPE.INTEGER,
      keyLen: 4,
      dataType,
      dataLen,
      userdata,
      elements,
      size: elements.length,
    }));
    exprs.push(numgenRandom(n));
    pendingLookups.push({ index: exprs.length, make: (id) => lookup({ name: "__map%d", id }, { dreg }) });
    exprs.push(null as unknown as Expr);
  };

  while (i < t.length) {
    const w = t[i];
    const v = verdictAt(i);
    if (v !== null) {
      exprs.push(immediateVerdict(v[0]));
      i += v[1];
      if (i !== t.length) return null; // a verdict ends a rule
      continue;
    }
    if (w === "fib" && t[i + 1] === "saddr" && t[i + 2] === "type" && t[i + 3] === "local") {
      exprs.push(fibSaddrType(), cmp(CMP.EQ, hostU32(2))); // RTN_LOCAL
      i += 4;
      continue;
    }
    if (w === "meta" && t[i + 1] === "l4proto") {
      const p = protocolNumber(t[i + 2] ?? "");
      if (p === null) return null;
      exprs.push(metaLoad(META.L4PROTO), cmp(CMP.EQ, new Uint8Array([p])));
      i += 3;
      continue;
    }
    if (w === fam.keyword && t[i + 1] === "saddr") {
      let j = i + 2;
      const neq = t[j] === "!=";
      if (neq) j++;
      const arg = t[j] ?? "";
      if (arg === "{") {
        // `ip saddr [!=] { A , B/N , ... }`: an anonymous interval set.
        const items: string[] = [];
        let k = j + 1;
        for (; k < t.length && t[k] !== "}"; k++) {
          if ((k - j) % 2 === 0 ? t[k] !== "," : t[k] === ",") return null;
          if (t[k] !== ",") items.push(t[k]);
        }
        if (k >= t.length || items.length === 0) return null;
        if (items.length === 1) {
          // nft turns a set of one into a plain match.
          const match = prefixMatch(items[0], fam, neq ? CMP.NEQ : CMP.EQ);
          if (match === null) return null;
          exprs.push(...match);
          i = k + 1;
          continue;
        }
        const set = intervalElements(items, fam);
        if (set === null) return null;
        pendingSets.push((id) => ({
          name: "__set%d",
          id,
          flags: SET_FLAG.ANONYMOUS | SET_FLAG.CONSTANT | SET_FLAG.INTERVAL,
          keyType: fam.addrType,
          keyLen: fam.addrLen,
          userdata: UDATA_SADDR_INTERVALS[fam.keyword],
          elements: set.elements,
          size: set.size,
        }));
        exprs.push(payload(PAYLOAD_BASE.NETWORK, fam.saddrOffset, fam.addrLen));
        pendingLookups.push({
          index: exprs.length,
          make: (id) => lookup({ name: "__set%d", id }, { inverted: neq }),
        });
        exprs.push(null as unknown as Expr);
        i = k + 1;
        continue;
      }
      if (arg.startsWith("@")) {
        if (neq || !SET_NAME.test(arg.slice(1))) return null;
        exprs.push(payload(PAYLOAD_BASE.NETWORK, fam.saddrOffset, fam.addrLen), lookup(ref(arg.slice(1))));
      } else {
        const match = prefixMatch(arg, fam, neq ? CMP.NEQ : CMP.EQ);
        if (match === null) return null;
        exprs.push(...match);
      }
      i = j + 1;
      continue;
    }
    if (w === "iifname") {
      let j = i + 1;
      const neq = t[j] === "!=";
      if (neq) j++;
      const name = (t[j] ?? "").replace(/^"(.*)"$/, "$1");
      const wildcard = name.endsWith("*");
      const base = wildcard ? name.slice(0, -1) : name;
      const bytes = encoder.encode(base);
      if (!/^[A-Za-z0-9_.:@-]+$/.test(base) || bytes.length >= IFNAMSIZ) return null;
      const data = wildcard ? bytes : new Uint8Array(IFNAMSIZ);
      if (!wildcard) data.set(bytes);
      exprs.push(metaLoad(META.IIFNAME), cmp(neq ? CMP.NEQ : CMP.EQ, data));
      i = j + 1;
      continue;
    }
    if (w === "mark" && t[i + 1] === "set" && t[i + 2] === "mark" && t[i + 3] === "or") {
      const m = (t[i + 4] ?? "").match(/^0x([0-9a-fA-F]{1,8})$/);
      if (m === null) return null;
      const bits = parseInt(m[1], 16) >>> 0;
      // The mark is a host-order u32 register: mask ~bits, xor bits.
      exprs.push(metaLoad(META.MARK), bitwise(hostU32(~bits >>> 0), hostU32(bits), true), metaSet(META.MARK));
      i += 5;
      continue;
    }
    if (w === "update" && (t[i + 1] ?? "").startsWith("@")) {
      const set = t[i + 1].slice(1);
      if (!SET_NAME.test(set) || t[i + 2] !== "{" || t[i + 3] !== fam.keyword || t[i + 4] !== "saddr") {
        return null;
      }
      if (t[i + 5] !== "}") return null;
      exprs.push(payload(PAYLOAD_BASE.NETWORK, fam.saddrOffset, fam.addrLen), dynsetUpdate(ref(set)));
      i += 6;
      continue;
    }
    if (w === "dnat" && t[i + 1] === "to") {
      const m = (t[i + 2] ?? "").match(
        fam.addrLen === 16 ? /^\[([0-9a-fA-F:.]+)\]:(\d+)$/ : /^([0-9.]+):(\d+)$/,
      );
      const addr = m ? addressBytes(m[1], fam) : null;
      const port = m ? portBytes(m[2]) : null;
      if (addr === null || port === null) return null;
      exprs.push(
        immediateData(REG.R1, addr),
        immediateData(REG.R2, port),
        dnat(fam.nfproto, REG.R1, REG.R2, 2),
      );
      i += 3;
      continue;
    }
    if (
      w === "dnat" && t[i + 1] === fam.keyword && t[i + 2] === "addr" && t[i + 3] === "." &&
      t[i + 4] === "port" && t[i + 5] === "to" && t[i + 6] === "numgen" && t[i + 7] === "random" &&
      t[i + 8] === "mod" && t[i + 10] === "map"
    ) {
      const n = modulus(t[i + 9]);
      const parsed = mapItems(i + 11);
      if (n === null || parsed === null) return null;
      const elements: AnonElement[] = [];
      for (const [k, item] of parsed[0].entries()) {
        // `I : ADDR . PORT`
        if (item.length !== 5 || item[0] !== String(k) || item[1] !== ":" || item[3] !== ".") return null;
        const addr = addressBytes(item[2], fam), port = portBytes(item[4]);
        if (addr === null || port === null) return null;
        elements.push({ key: hostU32(k), data: concatBytes([addr, pad4(port)]) });
      }
      if (elements.length !== n) return null;
      numgenMap(
        n,
        (fam.addrType << 6) | DATATYPE.INET_SERVICE,
        fam.addrLen + 4,
        UDATA_NUMGEN_MAP,
        elements,
        REG.R1,
      );
      exprs.push(dnat(fam.nfproto, REG.R1, concatRegister(fam.addrLen / 4)));
      i = parsed[1];
      continue;
    }
    if (w === "numgen" && t[i + 1] === "random" && t[i + 2] === "mod" && t[i + 4] === "vmap") {
      const n = modulus(t[i + 3]);
      const parsed = mapItems(i + 5);
      if (n === null || parsed === null || parsed[1] !== t.length) return null;
      const elements: AnonElement[] = [];
      for (const [k, item] of parsed[0].entries()) {
        // `I : goto CHAIN`
        if (item.length !== 4 || item[0] !== String(k) || item[1] !== ":") return null;
        const v = verdictAt2(item[2], item[3]);
        if (v === null) return null;
        elements.push({ key: hostU32(k), verdict: v });
      }
      if (elements.length !== n) return null;
      numgenMap(n, DATA_VERDICT, 0, UDATA_NUMGEN_VMAP, elements, REG.VERDICT);
      i = parsed[1];
      continue;
    }
    return null;
  }
  if (exprs.length === 0) return null;
  for (const [k, make] of pendingSets.entries()) {
    const id = setId();
    sets.push(make(id));
    const l = pendingLookups[k];
    exprs[l.index] = l.make(id);
  }
  return { exprs, sets };
}

/** The verdict of a vmap element (`goto CHAIN`, `jump CHAIN`), or null. */
function verdictAt2(word: string, chain: string): Verdict | null {
  if ((word === "goto" || word === "jump") && CHAIN_NAME.test(chain)) {
    return { code: word === "goto" ? VERDICT.GOTO : VERDICT.JUMP, chain };
  }
  return null;
}

/** A numgen modulus (1 or more), or null. */
function modulus(s: string | undefined): number | null {
  return s !== undefined && /^[1-9][0-9]{0,8}$/.test(s) ? Number(s) : null;
}

/** An address or CIDR as the half-open range [start, end) of addresses, or null. */
function addressRange(item: string, fam: RuleFamily): [bigint, bigint] | null {
  const slash = item.indexOf("/");
  const addr = addressBytes(slash < 0 ? item : item.slice(0, slash), fam);
  const bits = fam.addrLen * 8;
  const suffix = item.slice(slash + 1);
  const prefix = slash < 0 ? bits : /^[0-9]{1,3}$/.test(suffix) ? Number(suffix) : -1;
  if (addr === null || prefix < 0 || prefix > bits) return null;
  let v = 0n;
  for (const b of addr) v = (v << 8n) | BigInt(b);
  const span = 1n << BigInt(bits - prefix);
  const start = (v / span) * span;
  return [start, start + span];
}

/** `v` as `len` bytes in network order. */
function bigBytes(v: bigint, len: number): Uint8Array {
  const out = new Uint8Array(len);
  for (let i = len - 1; i >= 0; i--) {
    out[i] = Number(v & 0xffn);
    v >>= 8n;
  }
  return out;
}

/**
 * The elements of an anonymous interval set of addresses as nft 1.0.6 sends them: overlapping and adjacent
 * ranges merged, sorted; an interval end at address 0 first unless the first range starts there; each range a
 * start element and an end element (its first address after), except a range running to the last address,
 * whose start element says so in its user data. `size`: nft's count before merging (two per range, one more
 * for the leading end). Null when an item does not parse.
 */
function intervalElements(
  items: readonly string[],
  fam: RuleFamily,
): { elements: AnonElement[]; size: number } | null {
  const ranges: [bigint, bigint][] = [];
  for (const item of items) {
    const r = addressRange(item, fam);
    if (r === null) return null;
    ranges.push(r);
  }
  ranges.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const merged: [bigint, bigint][] = [];
  for (const r of ranges) {
    const last = merged.at(-1);
    if (last !== undefined && r[0] <= last[1]) {
      if (r[1] > last[1]) last[1] = r[1];
    } else merged.push([r[0], r[1]]);
  }
  const top = 1n << BigInt(fam.addrLen * 8);
  const elements: AnonElement[] = [];
  if (merged[0][0] !== 0n) elements.push({ key: new Uint8Array(fam.addrLen), intervalEnd: true });
  for (const [start, end] of merged) {
    if (end === top) {
      elements.push({ key: bigBytes(start, fam.addrLen), userdata: UDATA_INTERVAL_OPEN });
    } else {
      elements.push({ key: bigBytes(start, fam.addrLen) });
      elements.push({ key: bigBytes(end, fam.addrLen), intervalEnd: true });
    }
  }
  return { elements, size: 2 * merged.length + (merged[0][0] !== 0n ? 1 : 0) };
}

/**
 * `ip[6] saddr [!=] ADDR[/PREFIX]` as nft compiles it: a prefix on a byte boundary loads and compares only its
 * bytes; any other prefix loads the whole address, masks it and compares.
 */
function prefixMatch(arg: string, fam: RuleFamily, op: number): Expr[] | null {
  const slash = arg.indexOf("/");
  const addr = addressBytes(slash < 0 ? arg : arg.slice(0, slash), fam);
  const bits = fam.addrLen * 8;
  const prefix = slash < 0
    ? bits
    : /^[0-9]{1,3}$/.test(arg.slice(slash + 1))
    ? Number(arg.slice(slash + 1))
    : -1;
  if (addr === null || prefix < 0 || prefix > bits) return null;
  const mask = new Uint8Array(fam.addrLen);
  for (let b = 0; b < prefix; b++) mask[b >> 3] |= 0x80 >> (b & 7);
  const masked = addr.map((x, k) => x & mask[k]);
  if (prefix % 8 === 0 && prefix > 0) {
    const n = prefix / 8;
    return [payload(PAYLOAD_BASE.NETWORK, fam.saddrOffset, n), cmp(op, masked.slice(0, n))];
  }
  return [
    payload(PAYLOAD_BASE.NETWORK, fam.saddrOffset, fam.addrLen),
    bitwise(mask, new Uint8Array(fam.addrLen), false),
    cmp(op, masked),
  ];
}

export { be32 };
