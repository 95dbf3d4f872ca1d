/**
 * ipvs dataplane batch generation benchmarks (no kernel: a recording runner answers the reads of a full sync).
 *
 * `deno bench --allow-all bench/ipvs_bench.ts`: full sync (every batch rendered from scratch against an empty
 * kernel) and one-endpoint partial sync at 1k and 10k services × 10 endpoints (NodePort services, so each has
 * a ClusterIP and a NodePort virtual server).
 * `deno run --allow-all bench/ipvs_bench.ts`: the same as a table with the batch sizes.
 * The kernel-side times (ipvsadm -R, ipset restore, ip -batch) need a kernel with IPVS: see tests/packets.
 */
import { RecordingCommandRunner } from "../lib/exec.ts";
import { IpvsDataplane } from "../lib/dataplane/ipvs/dataplane.ts";
import { iptablesTools } from "../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../lib/dataplane/iptables_local_detector.ts";
import { configureLogging } from "../lib/log.ts";
import type { ServicePortState } from "../lib/proxy/types.ts";
import { makeState, snapshot } from "../testkit/fixtures.ts";

configureLogging({ sink: () => {} });

const ADDRS = JSON.stringify([{ ifname: "eth0", addr_info: [{ family: "inet", local: "192.168.0.2" }] }]);

function runner(): RecordingCommandRunner {
  const r = new RecordingCommandRunner((c) =>
    c.cmd === "ip" && c.args[0] === "-j" ? { stdout: ADDRS } : undefined
  );
  return r;
}

function services(n: number, eps = 10): ServicePortState[] {
  const out: ServicePortState[] = [];
  for (let i = 0; i < n; i++) {
    const e = [];
    for (let j = 0; j < eps; j++) e.push({ ip: `10.${(i >> 8) & 255}.${i & 255}.${j + 1}` });
    out.push(makeState({
      ns: `ns${i % 100}`,
      name: `svc${i}`,
      clusterIP: `172.${16 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`,
      nodePort: 30000 + (i % 2000),
    }, e));
  }
  return out;
}

function changeOne(states: ServicePortState[], k: number): ServicePortState[] {
  const next = states.slice();
  const s = next[0];
  next[0] = makeState({
    ns: s.info.name.namespace,
    name: s.info.name.name,
    clusterIP: s.info.clusterIP,
    nodePort: s.info.nodePort,
  }, [...s.endpoints.slice(1).map((e) => ({ ip: e.ip })), { ip: `10.255.${k >> 8 & 255}.${k & 255}` }]);
  return next;
}

function dataplane(r: RecordingCommandRunner) {
  return new IpvsDataplane({
    family: "IPv4",
    runner: r,
    iptables: iptablesTools("system", "IPv4"),
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
  });
}

const fixtures = new Map<number, ServicePortState[]>();
const get = (n: number) => fixtures.get(n) ?? fixtures.set(n, services(n)).get(n)!;

for (const n of [1000, 10000]) {
  Deno.bench({
    name: `ipvs full sync batches, ${n} services x 10 endpoints`,
    group: `full ${n}`,
    async fn(b) {
      const states = get(n);
      const dp = dataplane(runner());
      b.start();
      await dp.sync(snapshot(states));
      b.end();
    },
  });
  Deno.bench({
    name: `ipvs one-endpoint partial sync batches, ${n} services x 10 endpoints`,
    group: `partial ${n}`,
    async fn(b) {
      const states = get(n);
      const dp = dataplane(runner());
      await dp.sync(snapshot(states));
      const next = changeOne(states, 1);
      const snap = snapshot(next, { changed: [next[0].info.serviceKey] });
      b.start();
      await dp.sync(snap);
      b.end();
    },
  });
}

if (import.meta.main) {
  for (const n of [1000, 10000]) {
    const states = get(n);
    const r = runner();
    const dp = dataplane(r);
    const first = snapshot(states);
    let t = performance.now();
    await dp.sync(first);
    const full = performance.now() - t;
    const fullBytes = r.calls.reduce((s, c) => s + c.stdin.length, 0);
    const times: number[] = [];
    let cur = states, partialBytes = 0;
    for (let k = 0; k < 20; k++) {
      cur = changeOne(cur, k + 2);
      r.calls.length = 0;
      const snap = snapshot(cur, { changed: [cur[0].info.serviceKey] });
      t = performance.now();
      await dp.sync(snap);
      times.push(performance.now() - t);
      partialBytes = r.calls.reduce((s, c) => s + c.stdin.length, 0);
    }
    times.sort((a, b) => a - b);
    console.log(
      `${n} services x 10 eps: full ${full.toFixed(1)} ms (${
        (fullBytes / 1024).toFixed(0)
      } KiB of batches), ` +
        `partial median ${times[10].toFixed(2)} ms (${partialBytes} bytes: ${
          r.calls.map((c) => c.cmd).join(", ")
        })`,
    );
  }
}
