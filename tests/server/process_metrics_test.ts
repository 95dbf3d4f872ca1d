/**
 * The `process_*`, runtime (`denokubeproxy_v8_*`, event loop) and component (`kubernetes_build_info`,
 * `kubernetes_feature_enabled`) families: read from this very process's /proc, absent when unreadable,
 * and labelled as upstream labels them.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import {
  parseLimits,
  parseNetstat,
  parseStat,
  type ProcPaths,
  readProcess,
  registerProcessMetrics,
} from "../../lib/server/process_metrics.ts";
import {
  eventLoopDelay,
  startEventLoopMonitor,
  v8External,
  v8HeapTotal,
  v8HeapUsed,
} from "../../lib/server/runtime_metrics.ts";
import { buildInfo, featureEnabled, recordFeatureGates } from "../../lib/server/component_metrics.ts";
import { KNOWN_FEATURES } from "../../lib/config/feature_gates.ts";
import { GIT_VERSION } from "../../lib/config/version.ts";

Deno.test("process metrics: /proc/<pid>/stat fields are read after the command name, which may hold spaces and parentheses", () => {
  const fields = Array.from({ length: 50 }, (_, i) => String(i + 3));
  fields[14 - 3] = "250"; // utime
  fields[15 - 3] = "50"; // stime
  fields[22 - 3] = "12345"; // starttime
  fields[23 - 3] = "999424"; // vsize
  const s = parseStat(`42 (we (ird) name) ${fields.join(" ")}\n`);
  assert.deepEqual(s, { cpuSeconds: 3, startTicks: 12345, virtualBytes: 999424 });
  assert.deepEqual(
    parseLimits(
      "Limit                     Soft Limit           Hard Limit           Units     \n" +
        "Max address space         unlimited            unlimited            bytes     \n" +
        "Max open files            1024                 524288               files     \n",
    ),
    { maxFds: 1024, virtualMaxBytes: 18446744073709552000 },
  );
  assert.deepEqual(
    parseNetstat("TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 77 88\n"),
    {
      receive: 77,
      transmit: 88,
    },
  );
});

Deno.test("process metrics: this process's figures match what the kernel reports in /proc", async () => {
  const s = await readProcess();
  const stat = parseStat(await Deno.readTextFile("/proc/self/stat"));
  const status = await Deno.readTextFile("/proc/self/status");
  const rssKb = Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)![1]);
  // getrusage and /proc/self/stat are the same kernel accounting; /proc counts in 10 ms ticks and CPU time
  // moves between the two reads: within 0.1 s.
  assert.ok(Math.abs(s.cpuSeconds! - stat.cpuSeconds) < 0.1, `${s.cpuSeconds} vs ${stat.cpuSeconds}`);
  assert.ok(s.cpuSeconds! > 0);
  // Resident memory moves between two reads: within 10%.
  assert.ok(
    Math.abs(s.residentBytes! - rssKb * 1024) < rssKb * 1024 * 0.1,
    `${s.residentBytes} vs ${rssKb} kB`,
  );
  assert.ok(s.virtualBytes! > s.residentBytes!);
  // The runtime's time origin: before now, and this process has run for less than an hour.
  assert.equal(s.startTimeSeconds, performance.timeOrigin / 1000);
  assert.ok(s.startTimeSeconds! < Date.now() / 1000 && s.startTimeSeconds! > Date.now() / 1000 - 3600);
  // One more open file is one more descriptor.
  const f = await Deno.open("/proc/self/status");
  try {
    assert.equal((await readProcess()).openFds, s.openFds! + 1);
  } finally {
    f.close();
  }
  const softFiles = /^Max open files\s+(\d+)/m.exec(await Deno.readTextFile("/proc/self/limits"))![1];
  assert.equal(s.maxFds, Number(softFiles));
  assert.ok(s.networkReceiveBytes! >= 0 && s.networkTransmitBytes! >= 0);
});

Deno.test("process metrics: without /proc (the start task's permissions) only the runtime's figures are registered", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const missing = `${dir}/missing`;
    const paths: ProcPaths = { stat: missing, fdDir: missing, limits: missing, netstat: missing };
    const reg = new client.Registry();
    const names = await registerProcessMetrics(paths, [reg]);
    assert.deepEqual(names.sort(), [
      "process_cpu_seconds_total",
      "process_resident_memory_bytes",
      "process_start_time_seconds",
    ]);
    const text = await reg.metrics();
    assert.doesNotMatch(text, /process_max_fds|process_network|process_open_fds|process_virtual/);
    assert.match(text, /^# TYPE process_cpu_seconds_total counter$/m);
    assert.match(text, /^# HELP process_resident_memory_bytes Resident memory size in bytes\.$/m);
    // Each scrape reads /proc again: CPU time only grows.
    const cpu = async () => Number(/^process_cpu_seconds_total (\S+)$/m.exec(await reg.metrics())![1]);
    const first = await cpu();
    const end = performance.now() + 300;
    while (performance.now() < end) { /* burn CPU for 0.3 s */ }
    await new Promise((r) => setTimeout(r, 150));
    assert.ok((await cpu()) > first);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("runtime metrics: V8 heap gauges read Deno.memoryUsage at scrape time", async () => {
  const used = (await v8HeapUsed.get()).values[0].value;
  const total = (await v8HeapTotal.get()).values[0].value;
  assert.ok(used > 0 && total >= used, `${used} of ${total}`);
  const keep = new Uint8Array(8 * 1024 * 1024);
  assert.ok((await v8External.get()).values[0].value >= keep.byteLength);
});

Deno.test("runtime metrics: the event loop monitor observes how long the loop was blocked", async () => {
  const seen: number[] = [];
  const stop = startEventLoopMonitor((s) => seen.push(s));
  try {
    await new Promise((r) => setTimeout(r, 150));
    const end = performance.now() + 400;
    while (performance.now() < end) { /* block the event loop for 0.4 s */ }
    while (seen.length < 3) await new Promise((r) => setTimeout(r, 50));
    // The timer due during the block ran at least 0.3 s late (0.4 s block minus at most one 100 ms period).
    assert.ok(Math.max(...seen) >= 0.3, `delays ${seen}`);
  } finally {
    stop();
  }
  const before = (await eventLoopDelay.get()).values.find((v) => v.metricName?.endsWith("_count"))?.value ??
    0;
  const stop2 = startEventLoopMonitor();
  await new Promise((r) => setTimeout(r, 350));
  stop2();
  const after = (await eventLoopDelay.get()).values.find((v) => v.metricName?.endsWith("_count"))!.value;
  assert.ok(after >= before + 2, `${before} -> ${after}`);
});

Deno.test("component metrics: kubernetes_feature_enabled has every known gate with its stage and effective value", async () => {
  recordFeatureGates({ AllAlpha: true, PreferSameTrafficDistribution: false });
  const values = (await featureEnabled.get()).values;
  assert.equal(values.length, Object.keys(KNOWN_FEATURES).length);
  for (const [name, spec] of Object.entries(KNOWN_FEATURES)) {
    const v = values.find((x) => x.labels.name === name);
    assert.ok(v, name);
    assert.equal(v.labels.stage, spec.preRelease === "GA" ? "" : spec.preRelease);
    const want = name === "PreferSameTrafficDistribution"
      ? 0
      : spec.preRelease === "ALPHA"
      ? 1
      : spec.default
      ? 1
      : 0;
    assert.equal(v.value, want, name);
  }
  recordFeatureGates({});
  const ctx = (await featureEnabled.get()).values.find((x) =>
    x.labels.name === "PreferSameTrafficDistribution"
  );
  assert.equal(ctx?.value, KNOWN_FEATURES.PreferSameTrafficDistribution.default ? 1 : 0);
});

Deno.test("component metrics: kubernetes_build_info carries the reported version and leaves unknown build facts empty", async () => {
  const [v] = (await buildInfo.get()).values;
  assert.equal(v.value, 1);
  assert.equal(v.labels.git_version, GIT_VERSION);
  assert.match(String(v.labels.major), /^\d+$/);
  assert.equal(`v${v.labels.major}.${v.labels.minor}`, /^v\d+\.\d+/.exec(GIT_VERSION)![0]);
  assert.equal(v.labels.platform, "linux/amd64");
  assert.equal(v.labels.git_commit, "");
  assert.equal(v.labels.go_version, "");
});

Deno.test("process metrics: under the start task's permissions the agent reads no /proc file, and still reports CPU, memory and start", async () => {
  // A child with the start task's read and sys permissions (no --allow-all): what the agent can see.
  const dir = await Deno.makeTempDir();
  try {
    const script = `${dir}/probe.ts`;
    const module = new URL("../../lib/server/process_metrics.ts", import.meta.url).href;
    await Deno.writeTextFile(
      script,
      `import { readProcess } from "${module}";\nconsole.log(JSON.stringify(await readProcess()));\n`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-read",
        "--allow-sys=hostname,osRelease",
        `--config=${new URL("../../deno.json", import.meta.url).pathname}`,
        script,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    const s = JSON.parse(new TextDecoder().decode(out.stdout));
    assert.deepEqual(Object.keys(s).sort(), ["cpuSeconds", "residentBytes", "startTimeSeconds"]);
    assert.ok(s.cpuSeconds > 0 && s.residentBytes > 1 << 20 && s.startTimeSeconds > 1.7e9);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
