/**
 * A transaction of a partial sync, or a full sync's run ahead, as one nf_tables netlink batch: the operations a
 * service port's changes are made of (add, flush and delete of regular chains; rules of the forms
 * `rule_compiler.ts` knows; affinity sets; elements of the shared maps and sets), and the table and the shared
 * maps' declarations a run ahead starts with, each as the message nft 1.0.6 sends for it. Any other operation
 * makes the whole transaction unencodable (null), and it goes to nft.
 * @module
 */
import { concatBytes } from "../../../bytes.ts";
import type { Family, NftMap, NftSet } from "../objects.ts";
import type { Operation } from "../transaction.ts";
import { SET } from "../names.ts";
import { VERDICT, type Verdict, writeVerdict } from "./expressions.ts";
import {
  addressBytes,
  type AnonSet,
  compileRule,
  DATA_VERDICT,
  DATATYPE,
  portBytes,
  protocolNumber,
  RULE_FAMILY,
  type RuleFamily,
  SET_FLAG,
} from "./rule_compiler.ts";
import { AttributeTooLongError, cstr, NetlinkWriter, NFNL, NFT_MSG, NLM_F } from "./wire.ts";

/** The parts of an element key or value in the shared containers. */
type Part = "addr" | "proto" | "port";

/** The key layout of each shared set and map kube-proxy writes elements into (`layout.ts`). */
const CONTAINERS: ReadonlyMap<string, readonly Part[]> = new Map<string, readonly Part[]>([
  [SET.clusterIPs, ["addr"]],
  [SET.nodePortIPs, ["addr"]],
  [SET.hairpinConnections, ["addr", "addr", "proto", "port"]],
  [SET.serviceIPs, ["addr", "proto", "port"]],
  [SET.noEndpointServices, ["addr", "proto", "port"]],
  [SET.firewallIPs, ["addr", "proto", "port"]],
  [SET.serviceNodePorts, ["proto", "port"]],
  [SET.noEndpointNodePorts, ["proto", "port"]],
  [SET.localhostNodePortRejects, ["proto", "port"]],
]);

/** A batch ready to send: its bytes and, per message sequence number, the operation (input line) it came from. */
export interface EncodedBatch {
  /** The batch (in the writer's buffer when one was passed: valid until it is used again). */
  readonly bytes: Uint8Array;
  /** Sequence number → index of the operation in the transaction (from 0). */
  readonly opOfSeq: ReadonlyMap<number, number>;
  /** The sequence number of the batch's first message (the batch begin). */
  readonly firstSeq: number;
  /** The sequence number after the batch's last message. */
  readonly endSeq: number;
}

/** Key bytes of an element of a shared container, or null when a part does not parse. */
function keyBytes(parts: readonly string[], layout: readonly Part[], fam: RuleFamily): Uint8Array | null {
  if (parts.length !== layout.length) return null;
  const out: Uint8Array[] = [];
  for (const [k, kind] of layout.entries()) {
    const s = parts[k];
    let b: Uint8Array | null;
    if (kind === "addr") b = addressBytes(s, fam);
    else if (kind === "proto") {
      const p = protocolNumber(s);
      b = p === null ? null : new Uint8Array([p, 0, 0, 0]);
    } else {
      const p = portBytes(s);
      b = p === null ? null : new Uint8Array([p[0], p[1], 0, 0]);
    }
    if (b === null) return null;
    out.push(b);
  }
  return concatBytes(out);
}

/** A map element's verdict (`goto CHAIN`, `jump CHAIN`, `drop`, `accept`), or null. */
function elementVerdict(value: readonly string[] | undefined): Verdict | null {
  if (value === undefined || value.length !== 1) return null;
  const v = value[0].split(" ");
  if (v.length === 1 && v[0] === "drop") return { code: VERDICT.DROP };
  if (v.length === 1 && v[0] === "accept") return { code: VERDICT.ACCEPT };
  if (v.length === 2 && (v[0] === "goto" || v[0] === "jump") && /^[A-Za-z0-9_][^\s"]*$/.test(v[1])) {
    return { code: v[0] === "goto" ? VERDICT.GOTO : VERDICT.JUMP, chain: v[1] };
  }
  return null;
}

/** nft's user data of a comment (rules and elements): TLV type 0, the text and its NUL. */
function commentUserdata(comment: string): Uint8Array {
  const s = cstr(comment);
  const out = new Uint8Array(2 + s.length);
  out[0] = 0;
  out[1] = s.length;
  out.set(s, 2);
  return out;
}

/** nft's user data of a set of addresses it declares (`type ipv4_addr`: key byte order big endian). */
const UDATA_ADDR_SET = new Uint8Array([0, 4, 2, 0, 0, 0]);

/**
 * Encodes a transaction's operations on `family`/`table` as one batch, sequence numbers from `seq`.
 * Null when an operation is not one a partial sync writes in a form known here, or does not fit one netlink
 * message (nft splits such element lists; the transaction goes to nft then). `writer`: a writer to reuse (its
 * buffer stays allocated between batches instead of a new one per batch).
 */
export function encodeBatch(
  family: Family,
  table: string,
  ops: readonly Operation[],
  seq: number,
  writer?: NetlinkWriter,
): EncodedBatch | null {
  try {
    return encode(family, table, ops, seq, writer);
  } catch (err) {
    if (err instanceof AttributeTooLongError) return null;
    throw err;
  }
}

function encode(
  family: Family,
  table: string,
  ops: readonly Operation[],
  seq: number,
  writer: NetlinkWriter | undefined,
): EncodedBatch | null {
  if (family !== "ip" && family !== "ip6") return null;
  const fam = RULE_FAMILY[family];
  const w = writer ?? new NetlinkWriter();
  w.reset();
  const firstSeq = seq;
  const opOfSeq = new Map<number, number>();
  let nextSetId = 1;
  const createdSets = new Map<string, number>();
  const begin = (type: number, flags: number, op: number) => {
    opOfSeq.set(seq, op);
    w.begin((NFNL.SUBSYS_NFTABLES << 8) | type, NLM_F.REQUEST | flags, seq++, fam.nfproto);
    w.str(1, table);
  };

  w.begin(NFNL.BATCH_BEGIN, NLM_F.REQUEST, seq++, 0, NFNL.SUBSYS_NFTABLES);
  w.end();
  for (const [index, { verb, obj }] of ops.entries()) {
    switch (obj.kind) {
      case "table": {
        // `add table ... { comment "..." ; }`, as a full sync's runs ahead start.
        if (verb !== "add" || obj.flags !== undefined || obj.handle !== undefined) return null;
        opOfSeq.set(seq, index);
        w.begin((NFNL.SUBSYS_NFTABLES << 8) | NFT_MSG.NEWTABLE, NLM_F.REQUEST, seq++, fam.nfproto);
        w.str(1, table);
        w.u32(2, 0); // NFTA_TABLE_FLAGS
        if (obj.comment !== undefined) w.attr(6, commentUserdata(obj.comment));
        w.end();
        break;
      }
      case "chain": {
        if (obj.type !== undefined || obj.hook !== undefined || obj.comment !== undefined) return null;
        if (obj.handle !== undefined) return null;
        if (verb === "add") {
          begin(NFT_MSG.NEWCHAIN, NLM_F.CREATE, index);
          w.str(3, obj.name);
        } else if (verb === "flush") {
          begin(NFT_MSG.DELRULE, 0, index);
          w.str(2, obj.name);
        } else if (verb === "delete") {
          begin(NFT_MSG.DELCHAIN, 0, index);
          w.str(3, obj.name);
        } else return null;
        w.end();
        break;
      }
      case "rule": {
        if (verb !== "add" || obj.rule === undefined || obj.index !== undefined || obj.handle !== undefined) {
          return null;
        }
        const compiled = compileRule(obj.rule, fam, () => nextSetId++, (name) => createdSets.get(name));
        if (compiled === null) return null;
        for (const set of compiled.sets) writeAnonSet(w, set, begin, index);
        begin(NFT_MSG.NEWRULE, NLM_F.CREATE | NLM_F.APPEND, index);
        w.str(2, obj.chain);
        w.open(4); // NFTA_RULE_EXPRESSIONS
        for (const e of compiled.exprs) {
          w.open(1); // NFTA_LIST_ELEM
          w.str(1, e.name);
          w.open(2);
          e.write(w);
          w.close();
          w.close();
        }
        w.close();
        if (obj.comment !== undefined) w.attr(7, commentUserdata(obj.comment));
        w.end();
        break;
      }
      case "map":
      case "set": {
        if (verb === "add" && (obj.kind === "map" || obj.timeout === undefined)) {
          // A named set or map of the shared layout: `type A . B [: verdict] ; comment "..."`.
          const decl = declaration(obj.kind === "map", obj);
          if (decl === null) return null;
          const id = nextSetId++;
          createdSets.set(obj.name, id);
          begin(NFT_MSG.NEWSET, NLM_F.CREATE, index);
          w.str(2, obj.name);
          w.u32(3, decl.flags);
          w.u32(4, decl.keyType);
          w.u32(5, decl.keyLen);
          if (decl.verdicts) {
            w.u32(6, DATA_VERDICT);
            w.u32(7, 0);
          }
          w.u32(10, id);
          w.attr(13, decl.userdata);
          w.end();
          break;
        }
        if (obj.kind === "map") return null;
        if (verb === "delete") {
          if (obj.handle !== undefined) return null;
          begin(NFT_MSG.DELSET, 0, index);
          w.str(2, obj.name);
          w.end();
          break;
        }
        // The affinity sets: `type ipv4_addr|ipv6_addr ; flags dynamic,timeout ; timeout Ns`.
        const type = family === "ip" ? "ipv4_addr" : "ipv6_addr";
        const flags = obj.flags ?? [];
        if (
          verb !== "add" || obj.type !== type || obj.typeof !== undefined || obj.timeout === undefined ||
          flags.length !== 2 || !flags.includes("dynamic") || !flags.includes("timeout") ||
          obj.gcInterval !== undefined || obj.size !== undefined || obj.policy !== undefined ||
          obj.comment !== undefined || obj.autoMerge !== undefined || obj.handle !== undefined
        ) {
          return null;
        }
        const id = nextSetId++;
        createdSets.set(obj.name, id);
        begin(NFT_MSG.NEWSET, NLM_F.CREATE, index);
        w.str(2, obj.name);
        w.u32(3, SET_FLAG.TIMEOUT | SET_FLAG.EVAL);
        w.u32(4, fam.addrType);
        w.u32(5, fam.addrLen);
        w.u32(10, id);
        w.u64(11, obj.timeout * 1000);
        w.attr(13, UDATA_ADDR_SET);
        w.end();
        break;
      }
      case "element": {
        const container = obj.set ?? obj.map;
        const layout = container === undefined ? undefined : CONTAINERS.get(container);
        if (layout === undefined || obj.timeout !== undefined) return null;
        const key = keyBytes(obj.key, layout, fam);
        if (key === null) return null;
        const isMap = obj.map !== undefined;
        let verdict: Verdict | null = null;
        if (isMap && verb === "add") {
          verdict = elementVerdict(obj.value);
          if (verdict === null) return null;
        } else if (obj.value !== undefined && verb === "add") return null;
        if (verb !== "add" && verb !== "delete") return null;
        begin(
          verb === "add" ? NFT_MSG.NEWSETELEM : NFT_MSG.DELSETELEM,
          verb === "add" ? NLM_F.CREATE : 0,
          index,
        );
        w.str(2, container!);
        const id = createdSets.get(container!);
        if (id !== undefined) w.u32(4, id);
        w.open(3); // NFTA_SET_ELEM_LIST_ELEMENTS
        w.open(1);
        w.open(1); // NFTA_SET_ELEM_KEY
        w.attr(1, key);
        w.close();
        if (verdict !== null) {
          w.open(2); // NFTA_SET_ELEM_DATA
          writeVerdict(w, verdict);
          w.close();
        }
        if (obj.comment !== undefined && verb === "add") w.attr(6, commentUserdata(obj.comment));
        w.close();
        w.close();
        w.end();
        break;
      }
      default:
        return null;
    }
  }
  w.begin(NFNL.BATCH_END, NLM_F.REQUEST, seq++, 0, NFNL.SUBSYS_NFTABLES);
  w.end();
  return { bytes: writer === undefined ? w.bytes() : w.view(), opOfSeq, firstSeq, endSeq: seq };
}

/** A named set's or map's netlink form: flags, key type and length, whether it maps to verdicts, user data. */
interface Declaration {
  flags: number;
  keyType: number;
  keyLen: number;
  verdicts: boolean;
  userdata: Uint8Array;
}

/** nft's datatypes of the shared containers' keys: number and size in a key. */
const KEY_TYPES: Readonly<Record<string, [type: number, len: number]>> = {
  ipv4_addr: [DATATYPE.IPV4, 4],
  ipv6_addr: [DATATYPE.IPV6, 16],
  inet_proto: [DATATYPE.INET_PROTO, 1],
  inet_service: [DATATYPE.INET_SERVICE, 2],
};

/** nft's user data of a concatenation ending in inet_service (as it writes it for every such key). */
const UDATA_CONCAT_SERVICE = new Uint8Array([3, 8, 0, 4, 13, 0, 0, 0, 1, 0]);

/**
 * The declaration of a named set (`type A[ . B ...]`) or verdict map (`type A[ . B ...] : verdict`) with an
 * optional comment, as nft 1.0.6 sends it; null for anything else (flags, timeouts, typeof, other types).
 */
function declaration(isMap: boolean, obj: NftSet | NftMap): Declaration | null {
  if (
    obj.type === undefined || obj.typeof !== undefined || obj.flags !== undefined ||
    obj.timeout !== undefined ||
    obj.gcInterval !== undefined || obj.size !== undefined || obj.policy !== undefined ||
    obj.handle !== undefined ||
    ("autoMerge" in obj && obj.autoMerge !== undefined)
  ) {
    return null;
  }
  const [keyText, dataText, extra] = obj.type.split(" : ");
  if (extra !== undefined || (dataText !== undefined) !== isMap || (isMap && dataText !== "verdict")) {
    return null;
  }
  const parts = keyText.split(" . ").map((p) => KEY_TYPES[p]);
  if (parts.some((p) => p === undefined)) return null;
  const concat = parts.length > 1;
  if (concat && parts.at(-1)![0] !== DATATYPE.INET_SERVICE) return null;
  if (isMap && !concat) return null;
  if (!concat && parts[0][0] !== DATATYPE.IPV4 && parts[0][0] !== DATATYPE.IPV6) return null;
  const udata: Uint8Array[] = [new Uint8Array([0, 4, concat ? 0 : 2, 0, 0, 0])]; // key byte order
  if (isMap) udata.push(new Uint8Array([1, 4, 0, 0, 0, 0])); // data byte order
  if (concat) udata.push(UDATA_CONCAT_SERVICE);
  if (isMap) udata.push(new Uint8Array([6, 4, 0, 0, 0, 0])); // data interval
  if (obj.comment !== undefined) {
    const c = commentUserdata(obj.comment);
    c[0] = 7; // NFTNL_UDATA_SET_COMMENT
    udata.push(c);
  }
  return {
    flags: isMap ? SET_FLAG.MAP : 0,
    keyType: parts.reduce((t, p) => (t << 6) | p[0], 0),
    keyLen: concat ? parts.reduce((n, p) => n + ((p[1] + 3) & ~3), 0) : parts[0][1],
    verdicts: isMap,
    userdata: concatBytes(udata),
  };
}

/** NEWSET and NEWSETELEM of an anonymous set, before the rule that binds it. */
function writeAnonSet(
  w: NetlinkWriter,
  set: AnonSet,
  begin: (type: number, flags: number, op: number) => void,
  op: number,
): void {
  begin(NFT_MSG.NEWSET, NLM_F.CREATE, op);
  w.str(2, set.name);
  w.u32(3, set.flags);
  w.u32(4, set.keyType);
  w.u32(5, set.keyLen);
  if (set.dataType !== undefined) w.u32(6, set.dataType);
  if (set.dataLen !== undefined) w.u32(7, set.dataLen);
  w.u32(10, set.id);
  w.open(9); // NFTA_SET_DESC
  w.u32(1, set.size); // NFTA_SET_DESC_SIZE
  w.close();
  w.attr(13, set.userdata);
  w.end();
  begin(NFT_MSG.NEWSETELEM, NLM_F.CREATE, op);
  w.str(2, set.name);
  w.u32(4, set.id);
  w.open(3);
  for (const [k, e] of set.elements.entries()) {
    w.open(k + 1); // nft numbers the list's entries
    if (e.intervalEnd) w.u32(3, 1); // NFTA_SET_ELEM_FLAGS: NFT_SET_ELEM_INTERVAL_END
    w.open(1);
    w.attr(1, e.key);
    w.close();
    if (e.verdict !== undefined) {
      w.open(2);
      writeVerdict(w, e.verdict);
      w.close();
    } else if (e.data !== undefined) {
      w.open(2);
      w.attr(1, e.data);
      w.close();
    }
    if (e.userdata !== undefined) w.attr(6, e.userdata);
    w.close();
  }
  w.close();
  w.end();
}

export { DATATYPE };
