/**
 * scripts/monitoring_picture.ts: the saved panel data becomes a 2 x 2 grid of charts, one line per agent, in a
 * PNG (the data here is made up for the renderer; docs/monitoring.png comes from a real Prometheus run).
 */
import assert from "node:assert/strict";
import { type MonitoringData, pictureSpec, renderPicture } from "../scripts/monitoring_picture.ts";

const data: MonitoringData = {
  start: 1000,
  end: 1060,
  panels: ["a", "b", "c", "d"].map((title, i) => ({
    title,
    unit: "s",
    series: ["upstream", "ours"].map((agent, j) => ({
      agent,
      points: Array.from({ length: 60 }, (_, k) => [1000 + k, i + j + Math.sin(k / 5)] as [number, number])
        .concat([[1061, NaN]]),
    })),
  })),
};

Deno.test("monitoring picture: four panels in two rows, one line per agent, NaN points dropped", () => {
  // deno-lint-ignore no-explicit-any
  const spec = pictureSpec(data) as any;
  assert.equal(spec.vconcat.length, 2);
  assert.equal(spec.vconcat[0].hconcat.length, 2);
  const values = spec.vconcat[0].hconcat[0].data.values;
  assert.equal(values.length, 120);
  assert.deepEqual(new Set(values.map((v: { agent: string }) => v.agent)), new Set(["upstream", "ours"]));
  assert.equal(values[0].t, 0);
});

Deno.test("monitoring picture: renders a PNG of the whole grid", async () => {
  const png = await renderPicture(data);
  assert.deepEqual([...png.slice(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  const view = new DataView(png.buffer, png.byteOffset);
  // IHDR width and height: two 420-px charts side by side, two 180-px rows, with axes, titles and legends.
  assert.ok(
    view.getUint32(16) > 840 && view.getUint32(20) > 360,
    `${view.getUint32(16)}x${view.getUint32(20)}`,
  );
});
