/**
 * `explain --live` in the nftables mode: the node's `kube-proxy` table (`nft list table`) compared with what the
 * agent would write now, on the objects the packet's path names (its chains, and its entries in the sets and
 * maps). What the agent would write is put in nft's own listed form by the kernel itself: the rendered
 * transaction is loaded into a scratch network namespace, listed, and the namespace deleted, so that both
 * sides are compared as nft prints them; and the packet traced through both listings.
 * @module
 */
import type { CommandRunner } from "../exec.ts";
import { type NftListing, parseNftListing } from "../dataplane/nftables/listing.ts";
import type { TracePacket } from "../dataplane/iptables/trace.ts";
import type { IPFamily } from "../net/ip.ts";
import { diffLines, type DriftLine, formatDrift } from "./explain_drift.ts";
import {
  formatNftTrace,
  type NftTrace,
  sameNftOutcome,
  tableFromListing,
  traceNftables,
} from "./explain_trace_nftables.ts";

const TABLE = "kube-proxy";

/** The comparison `explain --live` prints. */
export interface NftLiveComparison {
  /** Whether the node has the table at all. */
  readonly tableExists: boolean;
  /** The objects compared (those the packet's path names). */
  readonly objects: readonly string[];
  readonly drift: readonly DriftLine[];
  /** The packet traced through the node's table (null without one), and through the agent's. */
  readonly live: NftTrace | null;
  readonly rendered: NftTrace;
}

/** `nft list table` of `fam` on this node, or inside network namespace `ns`; null when there is no table. */
async function listTable(runner: CommandRunner, fam: string, ns?: string): Promise<NftListing | null> {
  const list = ["nft", "list", "table", fam, TABLE];
  const spec = ns === undefined
    ? { cmd: "nft", args: list.slice(1) }
    : { cmd: "ip", args: ["netns", "exec", ns, ...list] };
  const r = await runner.tryRun({ ...spec, timeoutMs: 60_000 });
  if (r.code !== 0) {
    if (/No such file or directory/.test(r.stderr)) return null;
    throw new Error(`nft list table ${fam} ${TABLE} failed: ${r.stderr.trim()}`);
  }
  return parseNftListing(r.stdout);
}

/** The rendered transaction as nft lists it, through a scratch network namespace. */
async function listRendered(runner: CommandRunner, fam: string, transaction: string): Promise<NftListing> {
  const ns = `dkp-explain-${crypto.randomUUID().slice(0, 8)}`;
  await runner.run({ cmd: "ip", args: ["netns", "add", ns] });
  try {
    await runner.run({
      cmd: "ip",
      args: ["netns", "exec", ns, "nft", "-f", "-"],
      stdin: transaction,
      timeoutMs: 60_000,
    });
    return (await listTable(runner, fam, ns)) ?? { chains: new Map(), sets: new Map(), hooks: new Map() };
  } finally {
    await runner.tryRun({ cmd: "ip", args: ["netns", "del", ns] });
  }
}

/** The packet's own entries of a set or map: keys naming its destination and port (or protocol and port). */
function relevantElement(element: string, dst: string, port: number, proto: string): boolean {
  const key = element.split(/ : | comment /)[0].split(" . ").map((s) => s.trim());
  return key.includes(String(port)) && (key.includes(dst) || (key.includes(proto) && key.length === 2)) ||
    (key.length === 1 && key[0] === dst);
}

/**
 * Compares the node's table of `family` with the rendered `transaction` on `names` (the chains, sets and maps
 * explain's path cites) for the packet to `dst`:`port`/`proto`.
 * @throws {Error} When nft fails for another reason than a missing table.
 */
export async function compareLiveNftables(
  runner: CommandRunner,
  family: IPFamily,
  transaction: string,
  names: readonly string[],
  packet: { dst: string; port: number; proto: string },
  traced: TracePacket,
): Promise<NftLiveComparison> {
  const fam = family === "IPv6" ? "ip6" : "ip";
  const live = await listTable(runner, fam);
  const rendered = await listRendered(runner, fam, transaction);
  const have = live ?? { chains: new Map(), sets: new Map(), hooks: new Map() };
  const objects = [...new Set(names)].filter((n) => rendered.chains.has(n) || rendered.sets.has(n)).sort();
  const drift: DriftLine[] = [];
  for (const n of objects) {
    if (rendered.chains.has(n)) {
      if (!have.chains.has(n)) {
        drift.push({ object: `chain ${n}`, kind: "missing", line: "(the whole chain)" });
      } else diffLines(`chain ${n}`, rendered.chains.get(n)!, have.chains.get(n)!, drift, String);
    } else {
      const mine = (xs: readonly string[]) =>
        xs.filter((e) => relevantElement(e, packet.dst, packet.port, packet.proto));
      if (!have.sets.has(n)) drift.push({ object: `set/map ${n}`, kind: "missing", line: "(the whole set)" });
      else diffLines(`set/map ${n}`, mine(rendered.sets.get(n)!), mine(have.sets.get(n)!), drift, String);
    }
  }
  return {
    tableExists: live !== null,
    objects,
    drift,
    live: live === null ? null : traceNftables(tableFromListing(live), traced),
    rendered: traceNftables(tableFromListing(rendered), traced),
  };
}

/** The comparison as text for a terminal. */
export function formatLiveNftables(c: NftLiveComparison, family: IPFamily): string {
  const fam = family === "IPv6" ? "ip6" : "ip";
  const lines = [
    `Live:       the kernel's table ${fam} ${TABLE} (nft list table), compared with what the agent would write`,
    `            now on the objects of this packet's path:`,
    ...c.objects.map((o) => `              ${o}`),
  ];
  if (!c.tableExists) {
    lines.push(`Drift:      the kernel has no table ${fam} ${TABLE}: the agent has not synced here`);
  } else {
    lines.push(...formatDrift(c.drift));
  }
  if (c.live !== null) {
    lines.push(`Traced:     the kernel's table ${fam} ${TABLE} takes this packet to:`);
    lines.push(...formatNftTrace(c.live));
    if (sameNftOutcome(c.live, c.rendered)) lines.push("  as the agent's table would.");
    else {
      lines.push("  the agent's table would take it to:");
      lines.push(...formatNftTrace(c.rendered, "    "));
    }
  }
  return lines.join("\n") + "\n";
}
