/**
 * iptables payload generation and restore benchmarks.
 *
 * `deno bench --allow-all bench/iptables_bench.ts`: generation only (no kernel).
 * `deno run --allow-all --v8-flags=--expose-gc bench/iptables_bench.ts [--restore]`: a table of generation
 * figures at 1k/5k/10k services × 10 endpoints (cold, cached full, partial after one endpoint change) and, with
 * `--restore`, real iptables-legacy-restore / iptables-nft-restore times inside a throwaway netns with a
 * private xtables lock file (nft at 10k full is skipped: it takes many minutes, see docs/benchmarks.md).
 * `deno run --allow-all --v8-flags=--expose-gc bench/iptables_bench.ts --mem 10000`: memory of one size in a
 * fresh process (RSS/heap/external before and after caching the blocks, peak RSS over 5 full builds).
 */
import { DenoCommandRunner, RecordingCommandRunner } from "../lib/exec.ts";
import { IptablesDataplane } from "../lib/dataplane/iptables/dataplane.ts";
import type { IptablesBackend } from "../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../lib/dataplane/iptables/local_detector.ts";
import { configureLogging } from "../lib/log.ts";
import type { ServicePortState } from "../lib/proxy/types.ts";
import { makeState, snapshot } from "../testkit/fixtures.ts";
import { NetnsRunner } from "../testkit/netns.ts";

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

// `deno bench` only (priming here would distort the memory figures of `deno run`).
for (const n of import.meta.main ? [] : [1000, 10000]) {
  const states = services(n);
  const dp = await primed(states);
  const snap = snapshot(states);
  const part = snapshot(changeOne(states), { changed: ["ns0/svc0"] });
  Deno.bench(`full payload, cached blocks, ${n}x10`, () => {
    dp.buildPayload(snap, true);
  });
  Deno.bench(`partial payload, one endpoint changed, ${n}x10`, () => {
    dp.buildPayload(part, false);
  });
}

function gc(): void {
  (globalThis as { gc?: () => void }).gc?.();
}

const MiB = 1048576;

/** One size in this (fresh) process: RSS/heap/external before and after caching, peak over full builds. */
async function memory(n: number): Promise<void> {
  const states = services(n);
  const snap = snapshot(states);
  gc();
  const m0 = Deno.memoryUsage();
  const dp = await primed([]);
  let payload = dp.buildPayload(snap, true).bytes.byteLength;
  gc();
  const m1 = Deno.memoryUsage();
  let peak = m1.rss;
  for (let i = 0; i < 5; i++) {
    payload = dp.buildPayload(snap, true).bytes.byteLength;
    peak = Math.max(peak, Deno.memoryUsage().rss);
  }
  gc();
  const m2 = Deno.memoryUsage();
  const f = (x: number) => (x / MiB).toFixed(0);
  console.log(
    "| services x eps | payload | RSS states only | RSS after caching | heap after caching | external | RSS after 5 full builds | peak RSS |",
  );
  console.log("|---|---|---|---|---|---|---|---|");
  console.log(
    `| ${n}x10 | ${(payload / MiB).toFixed(1)} MiB | ${f(m0.rss)} MiB | ${f(m1.rss)} MiB (+${
      f(m1.rss - m0.rss)
    }) | ${f(m1.heapUsed)} MiB (+${f(m1.heapUsed - m0.heapUsed)}) | ${f(m1.external)} MiB | ${
      f(m2.rss)
    } MiB | ${f(peak)} MiB |`,
  );
}

if (import.meta.main && Deno.args.includes("--mem")) {
  await memory(Number(Deno.args[Deno.args.indexOf("--mem") + 1] ?? 10000));
  Deno.exit(0);
}

if (import.meta.main) {
  // Payloads are bytes ready for iptables-restore's stdin (IptablesDataplane.sync hands them over as is).
  console.log(
    "| services x eps | payload | cold full (render+encode) | cached full | partial (1 ep changed) | partial bytes |",
  );
  console.log("|---|---|---|---|---|---|");
  for (const n of [1000, 5000, 10000]) {
    const states = services(n);
    const snap = snapshot(states);
    const dpCold = await primed([]); // initialised, empty cache
    const t0 = performance.now();
    const bytes = dpCold.buildPayload(snap, true).bytes.byteLength;
    const coldMs = performance.now() - t0;
    const cached = ms(() => dpCold.buildPayload(snap, true), 7);
    const part = snapshot(changeOne(states), { changed: ["ns0/svc0"] });
    let pbytes = 0;
    const partialOnly = ms(() => {
      pbytes = dpCold.buildPayload(part, false).bytes.byteLength;
    }, 21);
    console.log(
      `| ${n}x10 | ${(bytes / MiB).toFixed(1)} MiB | ${coldMs.toFixed(0)} ms | ${cached.toFixed(0)} ms | ${
        partialOnly.toFixed(1)
      } ms | ${(pbytes / 1024).toFixed(0)} KiB |`,
    );
  }

  if (Deno.args.includes("--restore")) {
    // The netns is private, so its xtables lock can be too: /run/xtables.lock is host-wide, and other
    // iptables users on the host would otherwise make `-w 5` time out (and add their waits to applyMs).
    let lockFile: string | null = null;
    if (!Deno.env.get("XTABLES_LOCKFILE")) {
      lockFile = await Deno.makeTempFile({ prefix: "dkp-ipt-bench-", suffix: ".lock" });
      Deno.env.set("XTABLES_LOCKFILE", lockFile);
    }
    addEventListener("unload", () => {
      if (lockFile) Deno.removeSync(lockFile);
    });
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
