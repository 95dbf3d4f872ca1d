/**
 * The ipvs harness's RSS composition (`--memory-detail`): mappings classified by kind, and the kinds adding up to
 * the process's own resident set.
 */
import assert from "node:assert/strict";
import { rssComposition } from "../../bench/ipvs_agents_bench.ts";

const SAMPLE = `55d0c0000000-55d0c2000000 r-xp 00000000 08:01 1234   /usr/bin/deno
Rss:               30720 kB
55d0c4000000-55d0c4800000 rw-p 00000000 00:00 0      [heap]
Rss:                8192 kB
7f0000000000-7f0000040000 rw-p 00000000 00:00 0 
Rss:                 256 kB
7f0000100000-7f0004000000 rw-p 00000000 00:00 0 
Rss:                4096 kB
7f0010000000-7f0010010000 r--p 00000000 00:00 0      [vvar]
Rss:                   0 kB
`;

Deno.test("rssComposition: file pages, the brk heap, small and large anonymous mappings", () => {
  const c = rssComposition(SAMPLE);
  assert.deepEqual(c, { file: 30, brk: 8, anonSmall: 0.25, anonLarge: 4, total: 42.25 });
});

Deno.test("rssComposition: the kinds of this process add up to its Rss in smaps_rollup", () => {
  const c = rssComposition(Deno.readTextFileSync("/proc/self/smaps"));
  const rollup = Deno.readTextFileSync("/proc/self/smaps_rollup");
  const rss = Number(/^Rss:\s+(\d+) kB/m.exec(rollup)![1]) / 1024;
  // Two reads of a running process: allow what it maps or touches in between (a few MiB).
  assert.ok(Math.abs(c.total - rss) < 4, `${c.total} vs ${rss}`);
  assert.ok(c.file > 10, "the deno binary's pages are file-backed");
  assert.ok(c.anonSmall > 1, "V8's heap pages are small anonymous mappings");
});
