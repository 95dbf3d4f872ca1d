import assert from "node:assert/strict";
import { pointsOf } from "../../scripts/scale_plot.ts";

Deno.test("scale_plot: one point per agent and metric, the median over the file's runs, labelled on request", () => {
  const doc = {
    options: { services: 1000, endpoints: 10, mode: "nftables", backend: "legacy" },
    runs: [
      { agent: "ours", firstSyncS: 4, hwmMiB: 80, endpointInKernelMs: [1, 2, 300] },
      { agent: "ours", firstSyncS: 2, hwmMiB: 90, endpointInKernelMs: [5, 6, 7] },
      { agent: "ours", firstSyncS: 3, hwmMiB: 70, endpointInKernelMs: [9] },
      { agent: "upstream", firstSyncS: 6, hwmMiB: 100, endpointInKernelMs: [] },
    ],
  };
  const pts = pointsOf(doc, "x");
  const get = (agent: string, metric: string) =>
    pts.filter((p) => p.agent === agent && p.metric.startsWith(metric)).map((p) => p.value);
  assert.deepEqual(get("ours (x)", "first full sync"), [3]);
  assert.deepEqual(get("ours (x)", "RSS peak"), [80]);
  assert.deepEqual(get("ours (x)", "endpoint change"), [6], "median of the runs' p50s (2, 6, 9)");
  assert.deepEqual(get("upstream (x)", "endpoint change"), [], "no endpoint events: no point");
  assert.ok(pts.every((p) => p.services === 1000 && p.shape === "nftables, ×10"));
});
