/**
 * nftables sync costs with the real `nft` in a throwaway network namespace: for N services × 10 endpoints,
 * the full sync (transaction generation, bytes, `nft -f` time), then a partial sync for one changed endpoint
 * and one for one added Service, each generated and applied by NftablesDataplane as the agent does.
 *
 * `deno run --allow-all bench/nftables_bench.ts [N ...]` (default 1000 5000 10000; root). Prints a markdown
 * table; each figure is the median of `--runs` runs (default 3), every run in a fresh namespace.
 */
import { NftablesDataplane } from "../lib/dataplane/nftables/dataplane.ts";
import { configureLogging } from "../lib/log.ts";
import type { ServicePortState, SyncResult } from "../lib/proxy/types.ts";
import { makeState, snapshot } from "../testkit/fixtures.ts";
import { withNetns } from "../testkit/netns.ts";

configureLogging({ sink: () => {} });

/** N ClusterIP+NodePort services with 10 endpoints each (half of them NodePorts, as in a real cluster). */
function services(n: number, eps = 10): ServicePortState[] {
  const out: ServicePortState[] = [];
  for (let i = 0; i < n; i++) out.push(service(i, eps));
  return out;
}

function service(i: number, eps: number, endpointBase = 1): ServicePortState {
  const e = [];
  for (let j = 0; j < eps; j++) e.push({ ip: `10.${(i >> 8) & 255}.${i & 255}.${j + endpointBase}` });
  return makeState({
    ns: `ns${i % 100}`,
    name: `svc${i}`,
    clusterIP: `172.${16 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
    nodePort: i % 2 === 0 ? 30000 + (i % 2700) * 1 : 0,
  }, e);
}

interface Run {
  full: SyncResult;
  endpoint: SyncResult;
  added: SyncResult;
}

async function run(n: number): Promise<Run> {
  return await withNetns(async (runner) => {
    const dp = new NftablesDataplane({
      family: "IPv4",
      runner,
      localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
      nodePortAddresses: [],
    });
    const states = services(n);
    const full = await dp.sync(snapshot(states, { serviceCIDRs: ["172.16.0.0/12"] }));
    // One endpoint of svc0 replaced.
    const changed = states.slice();
    changed[0] = service(0, 10, 2);
    const endpoint = await dp.sync(
      snapshot(changed, { changed: ["ns0/svc0"], serviceCIDRs: ["172.16.0.0/12"] }),
    );
    // One Service added.
    const more = [...changed, service(n, 10)];
    const added = await dp.sync(
      snapshot(more, { changed: [`ns${n % 100}/svc${n}`], serviceCIDRs: ["172.16.0.0/12"] }),
    );
    return { full, endpoint, added };
  });
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

if (import.meta.main) {
  const args = Deno.args.filter((a) => !a.startsWith("--"));
  const runsArg = Deno.args.find((a) => a.startsWith("--runs="));
  const runs = runsArg ? Number(runsArg.split("=")[1]) : 3;
  const sizes = args.length > 0 ? args.map(Number) : [1000, 5000, 10000];
  console.log(
    `nftables sync, ${runs} runs per size (median), nft ${
      new TextDecoder().decode(new Deno.Command("nft", { args: ["--version"] }).outputSync().stdout).trim()
    }`,
  );
  console.log("");
  console.log(
    "| services × 10 | full: generate | full: bytes | full: nft -f | endpoint: generate | endpoint: bytes | endpoint: nft -f | added svc: generate | added svc: bytes | added svc: nft -f |",
  );
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const n of sizes) {
    const rs: Run[] = [];
    for (let i = 0; i < runs; i++) rs.push(await run(n));
    const f = (pick: (r: Run) => SyncResult, what: "generateMs" | "applyMs") =>
      `${median(rs.map((r) => pick(r)[what])).toFixed(what === "generateMs" ? 1 : 0)} ms`;
    const b = (pick: (r: Run) => SyncResult) => {
      const bytes = median(rs.map((r) => pick(r).payloadBytes));
      return bytes > 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`;
    };
    console.log(
      `| ${n} | ${f((r) => r.full, "generateMs")} | ${b((r) => r.full)} | ${f((r) => r.full, "applyMs")} | ` +
        `${f((r) => r.endpoint, "generateMs")} | ${b((r) => r.endpoint)} | ${
          f((r) => r.endpoint, "applyMs")
        } | ` +
        `${f((r) => r.added, "generateMs")} | ${b((r) => r.added)} | ${f((r) => r.added, "applyMs")} |`,
    );
  }
}
