/**
 * `nft list table` output read back into chains (their rules) and sets/maps (their elements), for comparing
 * one table with another: a node's kernel with what the agent would write (`explain --live`). Counters' values
 * are left out of rules (`counter packets 3 bytes 180` reads `counter`); elements are kept sorted.
 * @module
 */
import { parsePriority } from "./priority.ts";

/** One table as `nft list table` shows it. */
export interface NftListing {
  /** Chain name -> its rules, as listed (the `type ... hook ...` and `comment` lines are left out). */
  readonly chains: Map<string, string[]>;
  /** Set or map name -> its elements, as listed, sorted. */
  readonly sets: Map<string, string[]>;
  /** Base chain name -> its hook (`type nat hook prerouting priority dstnat;`), priority as a number. */
  readonly hooks: Map<string, { type: string; hook: string; priority: number }>;
}

/** Splits `a, b "x, y", c` at the commas outside quotes and braces. */
export function splitElements(text: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let quoted = false;
  let cur = "";
  for (const ch of text) {
    if (ch === '"') quoted = !quoted;
    else if (!quoted && ch === "{") depth++;
    else if (!quoted && ch === "}") depth--;
    if (ch === "," && !quoted && depth === 0) {
      out.push(cur.trim());
      cur = "";
    } else {
      cur += ch;
    }
  }
  if (cur.trim() !== "") out.push(cur.trim());
  return out;
}

/** Parses `nft list table <family> <name>` output. */
export function parseNftListing(text: string): NftListing {
  const chains = new Map<string, string[]>();
  const sets = new Map<string, string[]>();
  const hooks: NftListing["hooks"] = new Map();
  const lines = text.split("\n").map((l) => l.trim());
  let chain: string[] | null = null;
  let chainName = "";
  let set: string | null = null;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if ((m = line.match(/^chain (\S+) \{$/))) {
      chain = [];
      chainName = m[1];
      chains.set(m[1], chain);
      continue;
    }
    if ((m = line.match(/^(?:set|map) (\S+) \{$/))) {
      set = m[1];
      sets.set(set, []);
      continue;
    }
    if (line === "}") {
      chain = null;
      set = null;
      continue;
    }
    if (chain !== null) {
      const h = line.match(/^type (\S+) hook (\S+)(?: device \S+)? priority ([^;]+);/);
      if (h) hooks.set(chainName, { type: h[1], hook: h[2], priority: parsePriority("ip", h[3]) ?? 0 });
      if (line === "" || h || /^comment "/.test(line)) continue;
      chain.push(line.replace(/\bcounter packets \d+ bytes \d+/g, "counter"));
      continue;
    }
    if (set !== null && line.startsWith("elements = {")) {
      let body = line.slice("elements = {".length);
      while (!body.trimEnd().endsWith("}") && i + 1 < lines.length) body += " " + lines[++i];
      body = body.trimEnd().slice(0, -1);
      sets.set(set, splitElements(body).sort());
    }
  }
  return { chains, sets, hooks };
}
