/**
 * Printing of the fake's tables exactly as `nft list table` prints them (nft 1.0.6): counters, sets and maps
 * in creation order, then chains; elements in the order nft lists them.
 * @module
 */
import type { FakeChain, FakeElement, FakeSet, FakeTable } from "./fake_objects.ts";
import { elementsPerLine, formatDuration, formatElementList, formatPriority } from "./nft_format.ts";
import { canonicalRule } from "./rule_text.ts";

/** Elements in the order nft lists them: interval sets sorted by address, others in insertion order. */
export function orderedElements(s: FakeSet): FakeElement[] {
  const list = [...s.elements.values()];
  if (s.interval) {
    list.sort((a, b) => {
      if (!a.interval || !b.interval) return 0;
      return a.interval.start < b.interval.start ? -1 : a.interval.start > b.interval.start ? 1 : 0;
    });
  }
  return list;
}

function printElement(s: FakeSet, e: FakeElement): string {
  let out = e.key.join(" . ");
  if (e.timeout !== undefined && e.timeout !== s.timeout) {
    out += ` timeout ${formatDuration(e.timeout * 1000)}`;
  }
  if (e.comment !== undefined) out += ` comment "${e.comment}"`;
  if (e.value) out += ` : ${e.value.join(" . ")}`;
  return out;
}

function dumpSet(s: FakeSet): string {
  let out = `\t${s.kind} ${s.name} {\n\t\t${s.isTypeof ? "typeof" : "type"} ${s.spec}\n`;
  if (!s.flags.includes("constant")) {
    if (s.policy === "memory") out += "\t\tpolicy memory\n";
    if (s.size) out += `\t\tsize ${s.size}\n`;
  }
  const shown = s.timeout ? s.flags.filter((f) => f !== "timeout") : s.flags;
  if (shown.length) out += `\t\tflags ${s.flags.join(",")}\n`;
  if (s.autoMerge) out += "\t\tauto-merge\n";
  if (s.timeout) out += `\t\ttimeout ${formatDuration(s.timeout * 1000)}\n`;
  if (s.gcInterval) out += `\t\tgc-interval ${formatDuration(s.gcInterval * 1000)}\n`;
  if (s.comment !== undefined) out += `\t\tcomment "${s.comment}"\n`;
  if (s.elements.size) {
    const items = orderedElements(s).map((e) => printElement(s, e));
    out += `\t\telements = ${formatElementList(items, elementsPerLine(s.datatypes.key))}\n`;
  }
  return out + "\t}\n";
}

function dumpChain(t: FakeTable, c: FakeChain): string {
  let out = `\tchain ${c.name} {\n`;
  if (c.comment !== undefined) out += `\t\tcomment "${c.comment}"\n`;
  if (c.base) {
    out += `\t\ttype ${c.base.type} hook ${c.base.hook}`;
    if (c.base.device !== undefined) out += ` device "${c.base.device}"`;
    out += ` priority ${formatPriority(t.family, c.base.hook, c.base.priority)}; policy ${c.base.policy};\n`;
  }
  for (const r of c.rules) {
    out += `\t\t${canonicalRule(r.rule)}`;
    if (r.comment !== undefined) out += ` comment "${r.comment}"`;
    out += "\n";
  }
  return out + "\t}\n";
}

/** The table as `nft list table <family> <name>` prints it. */
export function dumpTable(t: FakeTable): string {
  const parts: string[] = [`table ${t.family} ${t.name} {\n`];
  let delim = "";
  if (t.flags.length) {
    parts.push(`\tflags ${t.flags.join(",")}\n`);
    delim = "\n";
  }
  if (t.comment !== undefined) parts.push(`\tcomment "${t.comment}"\n`);
  for (const c of [...t.counters.values()].sort((a, b) => a.seq - b.seq)) {
    let block = `\tcounter ${c.name} {\n`;
    if (c.comment !== undefined) block += `\t\tcomment "${c.comment}"\n`;
    block += `\t\tpackets ${c.packets} bytes ${c.bytes}\n\t}\n`;
    parts.push(delim, block);
    delim = "\n";
  }
  for (const s of [...t.sets.values(), ...t.maps.values()].sort((a, b) => a.seq - b.seq)) {
    parts.push(delim, dumpSet(s));
    delim = "\n";
  }
  for (const c of t.chains.values()) {
    parts.push(delim, dumpChain(t, c));
    delim = "\n";
  }
  parts.push("}\n");
  return parts.join("");
}
