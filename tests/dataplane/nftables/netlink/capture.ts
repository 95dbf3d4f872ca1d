/**
 * What the nft binary sends: runs `nft -f` under strace in a network namespace and returns the bytes of its
 * transaction's batch (the sendmsg that starts with a batch-begin message), and prints a batch as an attribute
 * tree for comparing the agent's netlink encoder with nft's own (sequence numbers left out).
 * @module
 */
import { NFNL, parseAttrs, parseMessages } from "../../../../lib/dataplane/nftables/netlink/wire.ts";

/** The batch nft sent for `input`, run in namespace `ns` (nft applies it: use a throwaway namespace). */
export async function captureNftBatch(ns: string, input: string): Promise<Uint8Array> {
  const dir = await Deno.makeTempDir();
  try {
    await Deno.writeTextFile(`${dir}/in.nft`, input);
    const out = await new Deno.Command("ip", {
      args: [
        "netns",
        "exec",
        ns,
        "strace",
        "-f",
        "-e",
        "trace=sendmsg",
        "-e",
        "write=all",
        "-o",
        `${dir}/st`,
        "nft",
        "-f",
        `${dir}/in.nft`,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) throw new Error(`nft failed: ${new TextDecoder().decode(out.stderr)}`);
    const text = await Deno.readTextFile(`${dir}/st`);
    // Hex dumps follow each sendmsg: " | 00000  14 00 ... |" lines; a new " * N bytes in buffer" starts one.
    const dumps: number[][] = [];
    for (const line of text.split("\n")) {
      if (/^\s*\* \d+ bytes in buffer/.test(line)) dumps.push([]);
      const m = line.match(/^\s*\| [0-9a-f]{5} {2}((?:[0-9a-f]{2} {1,2}){1,16})/);
      if (m && dumps.length > 0) {
        for (const h of m[1].trim().split(/\s+/)) dumps[dumps.length - 1].push(parseInt(h, 16));
      }
    }
    const batches = dumps.map((d) => new Uint8Array(d)).filter((b) =>
      b.length >= 20 && new DataView(b.buffer).getUint16(4, true) === NFNL.BATCH_BEGIN
    );
    if (batches.length !== 1) throw new Error(`expected one batch from nft, found ${batches.length}`);
    return batches[0];
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const hex = (b: Uint8Array) => [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
const decoder = new TextDecoder();

/** Where a set ID sits: NEWSETELEM's NFTA_SET_ELEM_LIST_SET_ID, lookup's NFTA_LOOKUP_SET_ID, dynset's. */
function isSetIdRef(msgType: number, path: string): boolean {
  return (msgType === 0xa0c && path === "4") || path.endsWith("/lookup/4") || path.endsWith("/dynset/2");
}

function tree(
  buf: Uint8Array,
  indent: string,
  out: string[],
  ctx: { msgType: number; path: string; ids: Map<string, number> },
): void {
  let exprName = "";
  for (const a of parseAttrs(buf)) {
    const path = ctx.path === "" ? String(a.type) : `${ctx.path}/${exprName || a.type}`;
    if (a.nested) {
      out.push(`${indent}${a.type} {`);
      tree(a.data, indent + "  ", out, { ...ctx, path: exprName !== "" ? `${ctx.path}/${exprName}` : path });
      out.push(`${indent}}`);
      continue;
    }
    const text = decoder.decode(a.data);
    if (ctx.msgType === 0xa06 && ctx.path === "4/1" && a.type === 1) exprName = text.replace(/\0$/, "");
    const value = /^[\x20-\x7e]+\0$/.test(text) ? JSON.stringify(text) : hex(a.data);
    if (ctx.msgType === 0xa09 && ctx.path === "" && a.type === 10) {
      // A set created by the batch: its ID by order of creation.
      ctx.ids.set(hex(a.data), ctx.ids.size + 1);
      out.push(`${indent}${a.type} id#${ctx.ids.size}`);
    } else if (isSetIdRef(ctx.msgType, ctx.path === "" ? String(a.type) : `${ctx.path}/${a.type}`)) {
      // A reference by ID: kept for sets the batch creates, left out for existing ones (nft sends its cache's).
      const id = ctx.ids.get(hex(a.data));
      if (id !== undefined) out.push(`${indent}${a.type} id#${id}`);
    } else out.push(`${indent}${a.type} ${value}`);
  }
}

/**
 * A batch as text: per message its type, flags, nfgenmsg and attribute tree. Sequence numbers are left out,
 * set IDs numbered by creation, and references by ID to sets the batch does not create left out.
 */
export function batchTree(batch: Uint8Array): string {
  const out: string[] = [];
  const ids = new Map<string, number>();
  for (const m of parseMessages(batch)) {
    out.push(
      `msg type=0x${m.type.toString(16)} flags=0x${m.flags.toString(16)} gen=${
        hex(m.payload.subarray(0, 4))
      }`,
    );
    tree(m.payload.subarray(4), "  ", out, { msgType: m.type, path: "", ids });
  }
  return out.join("\n");
}
