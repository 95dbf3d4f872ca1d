/**
 * iptables payload generation and restore benchmarks.
 *
 * `deno bench --allow-all bench/iptables_bench.ts`: generation only (no kernel).
 * `deno run --allow-all bench/iptables_bench.ts [--restore]`: a table of generation figures at 1k/5k/10k
 * services × 10 endpoints (cold, cached full, partial after one endpoint change) and, with `--restore`, real
 * iptables-legacy-restore / iptables-nft-restore times inside a throwaway netns (nft at 10k full is skipped:
 * it takes many minutes, see docs/benchmarks.md).
 */
import { DenoCommandRunner, RecordingCommandRunner } from "../lib/exec.ts";
import { IptablesDataplane } from "../lib/iptables/dataplane.ts";
import type { IptablesBackend } from "../lib/iptables/backend.ts";
import { detectLocalByCIDR } from "../lib/iptables/local_detector.ts";
import { configureLogging } from "../lib/log.ts";
import type { ServicePortState } from "../lib/proxy/types.ts";
import { makeState, snapshot } from "../tests/iptables/fixtures.ts";
import { NetnsRunner } from "../tests/iptables/netns.ts";

configureLogging({ sink: () => {} });

function services(n: number, eps = 10): ServicePortState[] {
  const out: ServicePortState[] = [];
  for (let i = 0; i < n; i++) {
    const e = [];
    for (let j = 0; j < eps; j++) e.push({ ip: `10.${(i >> 8) & 255}.${i & 255}.${j + 1}` });
    out.push(
      makeState({
        ns: `ns${i % 100}`,
        name: `svc${i}`,
        clusterIP: `172.${16 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
      }, e),
    );
  }
  return out;
}

function changeOne(states: ServicePortState[]): ServicePortState[] {
  const next = states.slice();
  const s = next[0];
  next[0] = makeState({ ns: s.info.name.namespace, name: s.info.name.name, clusterIP: s.info.clusterIP }, [
    ...s.endpoints.slice(1).map((e) => ({ ip: e.ip })),
    { ip: "10.255.255.1" },
  ]);
  return next;
}

async function primed(states: ServicePortState[]) {
  const dp = new IptablesDataplane({
    family: "IPv4",
    runner: new RecordingCommandRunner(),
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    conntrackTCPBeLiberal: false,
  });
  await dp.sync(snapshot(states));
  return dp;
}

function ms(f: () => void, runs = 5): number {
  const t: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    f();
    t.push(performance.now() - t0);
  }
  t.sort((a, b) => a - b);
  return t[Math.floor(t.length / 2)];
}

for (const n of [1000, 10000]) {
  const states = services(n);
  const dp = await primed(states);
  const snap = snapshot(states);
  const part = snapshot(changeOne(states), { changed: ["ns0/svc0"] });
  Deno.bench(`full payload, cached blocks, ${n}x10`, () => {
    new TextEncoder().encode(dp.buildPayload(snap, true).text);
  });
  Deno.bench(`partial payload, one endpoint changed, ${n}x10`, () => {
    new TextEncoder().encode(dp.buildPayload(part, false).text);
  });
}

if (import.meta.main) {
  console.log(
    "| services x eps | payload | cold full (render+encode) | cached full | partial (1 ep changed) | partial bytes |",
  );
  console.log("|---|---|---|---|---|---|");
  for (const n of [1000, 5000, 10000]) {
    const states = services(n);
    const snap = snapshot(states);
    let bytes = 0;
    const dpCold = await primed([]); // initialised, empty cache
    const t0 = performance.now();
    bytes = new TextEncoder().encode(dpCold.buildPayload(snap, true).text).byteLength;
    const coldMs = performance.now() - t0;
    const cached = ms(() => new TextEncoder().encode(dpCold.buildPayload(snap, true).text));
    const part = snapshot(changeOne(states), { changed: ["ns0/svc0"] });
    let pbytes = 0;
    const partialOnly = ms(() => {
      pbytes = new TextEncoder().encode(dpCold.buildPayload(part, false).text).byteLength;
    });
    console.log(
      `| ${n}x10 | ${(bytes / 1048576).toFixed(1)} MiB | ${coldMs.toFixed(0)} ms | ${
        cached.toFixed(0)
      } ms | ${partialOnly.toFixed(1)} ms | ${(pbytes / 1024).toFixed(0)} KiB |`,
    );
  }

  if (Deno.args.includes("--restore")) {
    const host = new DenoCommandRunner();
    console.log(
      "\n| backend | services x eps | full restore (cold) | full restore (again) | partial restore |",
    );
    console.log("|---|---|---|---|---|");
    for (const backend of ["legacy", "nft"] as IptablesBackend[]) {
      for (const n of [1000, 10000]) {
        const ns = `dkp-ipt-bench-${crypto.randomUUID().slice(0, 6)}`;
        await host.run({ cmd: "ip", args: ["netns", "add", ns] });
        try {
          const runner = new NetnsRunner(ns);
          const states = services(n);
          const dp = new IptablesDataplane({
            family: "IPv4",
            runner,
            backend,
            localDetector: detectLocalByCIDR("10.0.0.0/8"),
          });
          if (backend === "nft" && n > 2000) {
            console.log(
              `| ${backend} | ${n}x10 | skipped (super-linear: >18 CPU-min, see perf-anchors §1.7) | | |`,
            );
            continue;
          }
          const r1 = await dp.sync(snapshot(states));
          const r2 = await dp.sync(snapshot(states));
          const r3 = await dp.sync(snapshot(changeOne(states), { changed: ["ns0/svc0"] }));
          console.log(
            `| ${backend} | ${n}x10 | ${(r1.applyMs / 1000).toFixed(2)} s | ${
              (r2.applyMs / 1000).toFixed(2)
            } s | ${r3.applyMs.toFixed(0)} ms (${(r3.payloadBytes / 1024).toFixed(0)} KiB) |`,
          );
        } finally {
          await host.tryRun({ cmd: "ip", args: ["netns", "del", ns] });
        }
      }
    }
  }
}
