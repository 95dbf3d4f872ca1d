/**
 * Draws the main monitoring panels (rules sync latency, network programming latency, API request rate, memory)
 * of upstream kube-proxy and this agent side by side, from the data tests/packets/prometheus_test.ts saves from
 * its real Prometheus over a run with churn, into a PNG (docs/monitoring.png): Vega-Lite lays the charts out,
 * Vega renders them to SVG, resvg rasterizes it.
 *
 *   DKP_MONITORING_DATA=/tmp/monitoring.json DKP_REQUIRE_PRIVILEGED_TESTS=1 \
 *     deno test --allow-all tests/packets/prometheus_test.ts
 *   deno run --allow-read --allow-write --allow-env --allow-ffi --allow-sys scripts/monitoring_picture.ts \
 *     /tmp/monitoring.json docs/monitoring.png
 * @module
 */
import * as vega from "vega";
import { compile, type TopLevelSpec } from "vega-lite";
import { Resvg } from "@resvg/resvg-js";

/** The saved data: per panel, one series of [unix seconds, value] points per agent. */
export interface MonitoringData {
  start: number;
  end: number;
  panels: { title: string; unit: string; series: { agent: string; points: [number, number][] }[] }[];
}

/** The Vega-Lite spec of the 2 x 2 panels (x: seconds since the run started). */
export function pictureSpec(data: MonitoringData): TopLevelSpec {
  const charts = data.panels.map((p) => ({
    title: p.title,
    width: 420,
    height: 180,
    data: {
      values: p.series.flatMap((s) =>
        s.points.filter(([, v]) => Number.isFinite(v)).map(([t, v]) => ({
          t: t - data.start,
          v,
          agent: s.agent,
        }))
      ),
    },
    mark: { type: "line" as const, interpolate: "step-after" as const },
    encoding: {
      x: { field: "t", type: "quantitative" as const, title: "seconds into the run" },
      y: { field: "v", type: "quantitative" as const, title: p.unit },
      color: {
        field: "agent",
        type: "nominal" as const,
        title: null,
        legend: { orient: "bottom" as const, labelLimit: 400 },
      },
    },
  }));
  const rows = [];
  for (let i = 0; i < charts.length; i += 2) rows.push({ hconcat: charts.slice(i, i + 2) });
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: {
      text:
        "upstream kube-proxy v1.37.2 and deno-kube-proxy, scraped by Prometheus while Services and endpoints change",
      fontSize: 14,
    },
    background: "white",
    vconcat: rows,
    config: { font: "DejaVu Sans" },
  } as TopLevelSpec;
}

/** Renders the panels to PNG bytes. */
export async function renderPicture(data: MonitoringData): Promise<Uint8Array> {
  const view = new vega.View(vega.parse(compile(pictureSpec(data)).spec), { renderer: "none" });
  const svg = await view.toSVG();
  view.finalize();
  return new Resvg(svg, {
    background: "white",
    font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" },
  })
    .render().asPng();
}

if (import.meta.main) {
  const [input, output] = Deno.args;
  if (!input || !output) {
    console.error("usage: monitoring_picture.ts <data.json from the Prometheus test> <out.png>");
    Deno.exit(2);
  }
  const data = JSON.parse(await Deno.readTextFile(input)) as MonitoringData;
  await Deno.writeFile(output, await renderPicture(data));
  console.log(`wrote ${output} (${data.panels.length} panels, ${Math.round(data.end - data.start)} s)`);
}
