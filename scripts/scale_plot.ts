/**
 * The cost curves of scale runs as a PNG: first full sync, peak RSS and endpoint change → in kernel (p50) by
 * number of Services, one line per agent, from the `--json` files of `scripts/scale.ts` (medians over a file's
 * runs; any number of files, sizes and modes). `label=file.json` adds the label to that file's agent names (e.g. two
 * commits of this agent).
 *
 * ```sh
 * deno run -A scripts/scale_plot.ts out.png 1k.json 10k.json "before=10k-old.json"
 * ```
 * @module
 */
import * as vega from "vega";
import { compile, type TopLevelSpec } from "vega-lite";
import { Resvg } from "@resvg/resvg-js";

/** One run of one agent as the harness writes it (the fields plotted). */
interface Run {
  agent: string;
  firstSyncS?: number;
  hwmMiB?: number;
  endpointInKernelMs?: number[];
}

/** One plotted point. */
export interface Point {
  agent: string;
  shape: string;
  services: number;
  metric: string;
  value: number;
}

function median(xs: number[]): number | undefined {
  if (xs.length === 0) return undefined;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** The points of one harness JSON document. */
export function pointsOf(doc: { options: Record<string, unknown>; runs: Run[] }, label = ""): Point[] {
  const o = doc.options;
  const shape = `${o.mode}${o.mode === "iptables" ? `-${o.backend}` : ""}, ×${o.endpoints}`;
  const services = Number(o.services);
  const out: Point[] = [];
  for (const agent of new Set(doc.runs.map((r) => r.agent))) {
    const runs = doc.runs.filter((r) => r.agent === agent);
    const metrics: [string, (number | undefined)[]][] = [
      ["first full sync (s)", runs.map((r) => r.firstSyncS)],
      ["RSS peak (MiB)", runs.map((r) => r.hwmMiB)],
      ["endpoint change → in kernel p50 (ms)", runs.map((r) => median(r.endpointInKernelMs ?? []))],
    ];
    for (const [metric, vs] of metrics) {
      const value = median(vs.filter((v): v is number => typeof v === "number"));
      if (value !== undefined) {
        out.push({ agent: label ? `${agent} (${label})` : agent, shape, services, metric, value });
      }
    }
  }
  return out;
}

/** Renders the points to PNG bytes. */
export async function renderCurves(points: Point[]): Promise<Uint8Array> {
  const spec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    background: "white",
    data: { values: points },
    facet: { column: { field: "metric", type: "nominal", title: null } },
    spec: {
      width: 260,
      height: 220,
      mark: { type: "line", point: true },
      encoding: {
        x: { field: "services", type: "quantitative", scale: { type: "log" }, title: "Services" },
        y: { field: "value", type: "quantitative", title: null },
        color: { field: "agent", type: "nominal" },
        strokeDash: { field: "shape", type: "nominal" },
      },
    },
    resolve: { scale: { y: "independent" } },
    config: { font: "DejaVu Sans" },
  } as TopLevelSpec;
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: "none" });
  const svg = await view.toSVG();
  view.finalize();
  return new Resvg(svg, {
    background: "white",
    font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" },
  }).render().asPng();
}

if (import.meta.main) {
  const [output, ...inputs] = Deno.args;
  if (!output || inputs.length === 0) {
    console.error("usage: scale_plot.ts <out.png> <scale.json> ...");
    Deno.exit(2);
  }
  const points: Point[] = [];
  for (const arg of inputs) {
    const eq = arg.indexOf("=");
    const [label, f] = eq > 0 ? [arg.slice(0, eq), arg.slice(eq + 1)] : ["", arg];
    points.push(...pointsOf(JSON.parse(await Deno.readTextFile(f)), label));
  }
  await Deno.writeFile(output, await renderCurves(points));
  console.log(`wrote ${output} (${points.length} points)`);
}
