/**
 * A real Prometheus (Debian's `prometheus` package, installed by scripts/install.sh) for tests: started inside a
 * network namespace with a file-based target list (rewritable while it runs), scraping every second, and queried
 * over its HTTP API from inside that namespace (curl through `ip netns exec`: the test process cannot reach a
 * namespace's loopback). Also `promtool check metrics` on an exposition.
 * @module
 */
import type { Sandbox, SandboxProcess } from "./sandbox.ts";

/** One file_sd target group: addresses and the labels their series get. */
export interface TargetGroup {
  targets: string[];
  labels: Record<string, string>;
}

/** One series of an instant query's answer. */
export interface Sample {
  metric: Record<string, string>;
  /** The value as Prometheus prints it ("1", "NaN", "+Inf", ...). */
  value: string;
}

/** Why Prometheus cannot run here (a missing binary), or undefined. */
export function prometheusUnavailableReason(): string | undefined {
  for (const bin of ["prometheus", "promtool", "curl"]) {
    const found = (Deno.env.get("PATH") ?? "").split(":").concat(["/usr/bin", "/usr/sbin"]).some((d) => {
      try {
        return Deno.statSync(`${d}/${bin}`).isFile;
      } catch {
        return false;
      }
    });
    if (!found) return `${bin} is not installed (scripts/install.sh installs Debian's prometheus package)`;
  }
  return undefined;
}

/** The port Prometheus listens on inside its namespace (loopback only). */
const PORT = 9090;

/** A Prometheus server running in a namespace of a sandbox. */
export class PrometheusServer {
  private constructor(
    private readonly sb: Sandbox,
    /** The namespace it runs in. */
    readonly ns: string,
    /** Its working directory: config, targets file, TSDB. */
    readonly dir: string,
    private readonly proc: SandboxProcess,
  ) {}

  /**
   * Starts Prometheus in `ns` (spawned through `sb`), scraping job `job` every second from `targets`, with
   * `ruleFiles` loaded (evaluated every second); resolves once it is ready.
   */
  static async start(
    sb: Sandbox,
    ns: string,
    opts: { job: string; targets: TargetGroup[]; ruleFiles?: string[] },
  ): Promise<PrometheusServer> {
    const dir = await Deno.makeTempDir({ prefix: "dkp-prometheus-" });
    await Deno.writeTextFile(`${dir}/targets.json`, JSON.stringify(opts.targets));
    // YAML is a superset of JSON: the config is written as JSON.
    await Deno.writeTextFile(
      `${dir}/prometheus.yml`,
      JSON.stringify({
        global: { scrape_interval: "1s", scrape_timeout: "900ms", evaluation_interval: "1s" },
        rule_files: opts.ruleFiles ?? [],
        scrape_configs: [{
          job_name: opts.job,
          file_sd_configs: [{ files: [`${dir}/targets.json`], refresh_interval: "1s" }],
        }],
      }),
    );
    const proc = sb.spawn(ns, "prometheus", [
      `--config.file=${dir}/prometheus.yml`,
      `--storage.tsdb.path=${dir}/data`,
      `--web.listen-address=127.0.0.1:${PORT}`,
      "--log.level=warn",
    ]);
    const p = new PrometheusServer(sb, ns, dir, proc);
    const deadline = Date.now() + 30_000;
    while (!(await p.get("/-/ready").then(() => true, () => false))) {
      if (Date.now() > deadline) throw new Error(`Prometheus did not become ready:\n${proc.tail()}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    return p;
  }

  /** Replaces the target list (Prometheus re-reads it within about a second). */
  async setTargets(targets: TargetGroup[]): Promise<void> {
    const tmp = `${this.dir}/targets.json.tmp`;
    await Deno.writeTextFile(tmp, JSON.stringify(targets));
    await Deno.rename(tmp, `${this.dir}/targets.json`);
  }

  /** GETs a path of the HTTP API from inside the namespace; returns the body. */
  async get(path: string, params: Record<string, string> = {}): Promise<string> {
    const args = ["-sS", "--fail-with-body", "--max-time", "10", "--get"];
    for (const [k, v] of Object.entries(params)) args.push("--data-urlencode", `${k}=${v}`);
    args.push(`http://127.0.0.1:${PORT}${path}`);
    return (await this.sb.exec(this.ns, "curl", args)).stdout;
  }

  /** Runs an instant query; resolves with its series (a scalar or string answer is one unlabelled series). */
  async query(expr: string): Promise<Sample[]> {
    const body = JSON.parse(await this.get("/api/v1/query", { query: expr }));
    if (body.status !== "success") throw new Error(`query ${expr}: ${JSON.stringify(body)}`);
    const r = body.data;
    if (r.resultType === "vector") {
      return r.result.map((s: { metric: Record<string, string>; value: [number, string] }) => ({
        metric: s.metric,
        value: s.value[1],
      }));
    }
    if (r.resultType === "scalar" || r.resultType === "string") return [{ metric: {}, value: r.result[1] }];
    throw new Error(`query ${expr}: unexpected result type ${r.resultType}`);
  }

  /** Runs a range query (`step` in seconds); resolves with each series' points as [unix seconds, value]. */
  async queryRange(
    expr: string,
    start: number,
    end: number,
    step: number,
  ): Promise<{ metric: Record<string, string>; points: [number, number][] }[]> {
    const body = JSON.parse(
      await this.get("/api/v1/query_range", {
        query: expr,
        start: String(start),
        end: String(end),
        step: String(step),
      }),
    );
    if (body.status !== "success") throw new Error(`query_range ${expr}: ${JSON.stringify(body)}`);
    return body.data.result.map((s: { metric: Record<string, string>; values: [number, string][] }) => ({
      metric: s.metric,
      points: s.values.map(([t, v]) => [t, Number(v)] as [number, number]),
    }));
  }

  /** The last lines of its log. */
  tail(): string {
    return this.proc.tail();
  }

  /** Stops it and removes its directory. */
  async stop(): Promise<void> {
    await this.proc.stop(5000).catch(() => {});
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }
}

/** Fetches `url` from inside `ns` (curl); resolves with the body. */
export async function fetchInNamespace(sb: Sandbox, ns: string, url: string): Promise<string> {
  return (await sb.exec(ns, "curl", ["-sS", "--fail", "--max-time", "10", url])).stdout;
}

/**
 * `promtool check metrics` on an exposition: resolves with its complaints, one per line (none when clean); throws
 * when promtool fails otherwise (exit codes other than 0 and 3, its "lint problems" code).
 */
export async function promtoolCheckMetrics(exposition: string): Promise<string[]> {
  const p = new Deno.Command("promtool", {
    args: ["check", "metrics"],
    stdin: "piped",
    stdout: "piped",
    stderr: "piped",
  })
    .spawn();
  const w = p.stdin.getWriter();
  await w.write(new TextEncoder().encode(exposition));
  await w.close();
  const out = await p.output();
  const text = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
  if (out.code !== 0 && out.code !== 3) {
    throw new Error(`promtool check metrics exited with ${out.code}: ${text}`);
  }
  return text.split("\n").map((l) => l.trim()).filter(Boolean);
}

/** One family of an exposition: its type and help. */
export interface Family {
  type: string;
  help: string;
}

/** The families of a text exposition by name (from its `# HELP` and `# TYPE` lines). */
export function families(exposition: string): Map<string, Family> {
  const out = new Map<string, Family>();
  for (const line of exposition.split("\n")) {
    const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
    if (!m) continue;
    const f = out.get(m[2]) ?? { type: "untyped", help: "" };
    if (m[1] === "TYPE") f.type = m[3];
    else f.help = m[3];
    out.set(m[2], f);
  }
  return out;
}

/** The names of the families that have at least one sample in an exposition. */
export function familiesWithSamples(exposition: string, known: Iterable<string>): Set<string> {
  const names = [...known];
  const out = new Set<string>();
  for (const line of exposition.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const name = /^[^{ ]+/.exec(line)![0];
    for (const n of names) {
      if (name === n || (name.startsWith(n + "_") && /_(bucket|sum|count|total|created)$/.test(name))) {
        out.add(n);
      }
    }
  }
  return out;
}
