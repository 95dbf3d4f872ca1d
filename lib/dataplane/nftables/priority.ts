/**
 * Base-chain priorities: the standard names (`dstnat`, `filter`, ...; bridge has its own numbers) and
 * `name±offset` spellings, as numbers (objects are written with numeric priorities).
 * @module
 */
import type { ChainPriority, Family } from "./objects.ts";

const STD_PRIORITIES: Readonly<Record<string, number>> = {
  raw: -300,
  mangle: -150,
  dstnat: -100,
  filter: 0,
  security: 50,
  srcnat: 100,
};

const BRIDGE_PRIORITIES: Readonly<Record<string, number>> = {
  dstnat: -300,
  filter: -200,
  out: 100,
  srcnat: 300,
};

/**
 * Converts a base-chain priority into its number (`dstnat-10` → -110 in `ip`).
 * @returns the number, or undefined when the text is no number, no known name, or a bad offset
 */
export function parsePriority(family: Family, priority: ChainPriority): number | undefined {
  if (typeof priority === "number") return Number.isInteger(priority) ? priority : undefined;
  const text = priority.trim();
  if (/^[+-]?\d+$/.test(text)) return Number(text);
  const m = /^([a-z]+)\s*(?:([+-])\s*(\d+))?$/.exec(text);
  if (!m) return undefined;
  const table = family === "bridge" ? BRIDGE_PRIORITIES : STD_PRIORITIES;
  const base = table[m[1]];
  if (base === undefined) return undefined;
  if (m[2] === undefined) return base;
  return m[2] === "+" ? base + Number(m[3]) : base - Number(m[3]);
}
