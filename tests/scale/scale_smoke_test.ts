/**
 * Smoke test of the scale harness (scripts/scale.ts): 50 Services × 3 endpoints, 3 s of churn at 20/s,
 * with the real agent and real iptables-legacy in a throwaway namespace. Skipped (explicitly) when not root.
 * @module
 */
import assert from "node:assert/strict";
import { markdownRow, runScale } from "../../scripts/scale.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = Deno.uid() !== 0 ? "the scale harness needs root" : undefined;

privilegedTest(unavailable, {
  name: "scale harness: 50 services, 3 s churn — every service programmed, latencies measured",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const r = await runScale({
      services: 50,
      endpoints: 3,
      backend: "legacy",
      churn: 20,
      duration: 3,
      minSync: 1,
      timeout: 40,
      keep: false,
      verbose: false,
    });
    console.log(markdownRow(r));
    assert(r.firstSyncS !== null && r.firstSyncS > 0, "first sync measured");
    assert.deepEqual(r.programmedServices, 50, "every Service has its KUBE-SERVICES rule in the kernel");
    assert.deepEqual(r.events, 60);
    assert.deepEqual(r.resolved, r.events, "every EndpointSlice update reached a restore payload");
    assert.deepEqual(r.handedMs.length, r.events);
    assert(r.handedMs.every((ms) => ms >= 0 && ms < 20_000), `latencies plausible: ${r.handedMs}`);
    assert(r.metricCount > 0, "the agent's network programming histogram has observations");
    assert(r.partialSyncs.length > 0, "churn was applied by partial syncs");
    assert(r.fullSyncs.length > 0 && r.fullSyncs[0].bytes > 0, "payload bytes logged");
    assert.deepEqual(
      r.callsDuringPartial.map((c) => c.name),
      [],
      "no iptables call besides the restore in a partial sync",
    );
    assert(r.rssChurnMiB !== null && r.hwmMiB !== null && r.cpuPerS >= 0);
  },
});
