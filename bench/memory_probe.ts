/**
 * In-process heap composition at N Services × M endpoints (no kernel, no API server): raw objects as the
 * informer caches hold them, the Proxier's model and trackers, the iptables (or nftables) dataplane's caches and
 * payload, then partial syncs of one-endpoint changes. The runner discards what it is given (a streamed payload
 * is drained chunk by chunk, so that it is generated) and answers nft's listings with an empty table.
 * Run: `deno run -A --v8-flags=--expose-gc bench/memory_probe.ts [services] [endpoints] [changed per sync]`;
 * `MODE=nftables` for the nftables dataplane, `MODE=ipvs` for the ipvs one (the runner then answers the reads of a
 * full sync with an empty kernel: a kube-ipvs0 dummy interface without addresses, no virtual servers, no sets,
 * empty iptables tables).
 */
import type { CommandResult, CommandRunner, CommandSpec } from "../lib/exec.ts";
import { getHeapStatistics as v8h } from "node:v8";
import { IptablesDataplane } from "../lib/dataplane/iptables/dataplane.ts";
import { NftablesDataplane } from "../lib/dataplane/nftables/dataplane.ts";
import { IpvsDataplane } from "../lib/dataplane/ipvs/dataplane.ts";
import { iptablesTools } from "../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../lib/dataplane/iptables_local_detector.ts";
import { FakeClock } from "../lib/proxy/clock.ts";
import {
  type Informer,
  keepEndpointSliceIdentity,
  keepServiceIdentity,
  newEndpointSliceInformer,
  newServiceInformer,
} from "../lib/kube/informer.ts";
import type { EndpointSlice, KubeObject, Service } from "../lib/kube/types.ts";
import { configureLogging } from "../lib/log.ts";
import { Proxier } from "../lib/proxy/proxier.ts";
import type { Dataplane, ProxySnapshot, SyncResult } from "../lib/proxy/types.ts";
import { IpPool, makeNode, makeService, makeSlice } from "../scripts/scale_objects.ts";
import type { KubeClient } from "../lib/kube/client.ts";

configureLogging({ sink: () => {} });
const N = Number(Deno.args[0] ?? 10_000);
const M = Number(Deno.args[1] ?? 10);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error("run with --v8-flags=--expose-gc");

function heap(): number {
  for (let i = 0; i < 3; i++) gc!();
  return Deno.memoryUsage().heapUsed;
}
const mib = (n: number) => (n / 1048576).toFixed(1).padStart(7);
let last = heap();
const base = last;
/** RSS of the malloc heap ([heap] in /proc/self/smaps), where ArrayBuffers and runtime allocations live. */
function mallocHeap(): number {
  const smaps = Deno.readTextFileSync("/proc/self/smaps");
  const at = smaps.indexOf("[heap]");
  if (at < 0) return 0;
  const m = smaps.slice(at).match(/\nRss:\s+(\d+) kB/);
  return m ? Number(m[1]) * 1024 : 0;
}

function step(label: string): void {
  const h = heap();
  const m = Deno.memoryUsage();
  console.log(
    `${label.padEnd(52)} heap ${mib(h)} MiB (+${mib(h - last)})  external ${mib(m.external)}  malloc heap ${
      mib(mallocHeap())
    }  rss ${mib(m.rss)}  v8 malloced ${mib(v8h().malloced_memory)} peak ${mib(v8h().peak_malloced_memory)}`,
  );
  last = h;
}

const EMPTY_NFT_LIST = '{"nftables": [{"metainfo": {"json_schema_version": 1}}]}';
/** `ip -j addr show` of a node with an empty kube-ipvs0. */
const IP_ADDR_JSON = JSON.stringify([
  { ifname: "lo", addr_info: [{ family: "inet", local: "127.0.0.1" }] },
  { ifname: "eth0", addr_info: [{ family: "inet", local: "10.250.0.2" }] },
  { ifname: "kube-ipvs0", addr_info: [] },
]);
const EMPTY_TABLE = (t: string) => `*${t}\nCOMMIT\n`;

/** What the runner answers to a read (empty kernel); "" for everything else. */
function answer(spec: CommandSpec): string {
  const a = spec.args.join(" ");
  if (spec.cmd === "nft" && spec.args.includes("--json")) return EMPTY_NFT_LIST;
  if (spec.cmd === "ip" && a === "-j addr show") return IP_ADDR_JSON;
  if (spec.cmd.endsWith("-save") && spec.args[0] === "-t") return EMPTY_TABLE(spec.args[1]);
  return ""; // ipvsadm -S -n, ipset save, ipvsadm -L -n: nothing
}

class NullRunner implements CommandRunner {
  /** Bytes of stdin drained by the last call. */
  lastStdin = 0;
  tryRun(spec: CommandSpec): Promise<CommandResult> {
    const s = spec.stdin;
    if (s !== undefined && typeof s !== "string" && !(s instanceof Uint8Array)) {
      let n = 0;
      for (const chunk of s) n += chunk.length;
      this.lastStdin = n;
    } else if (s !== undefined) this.lastStdin = s.length;
    return Promise.resolve({ code: 0, stdout: answer(spec), stderr: "" });
  }
  run(spec: CommandSpec): Promise<CommandResult> {
    return this.tryRun(spec);
  }
}

/** Times the dataplane's sync and resolves waiters after each. */
class Timed implements Dataplane {
  readonly family = "IPv4" as const;
  waiter: ((r: SyncResult) => void) | null = null;
  constructor(readonly inner: IptablesDataplane | NftablesDataplane | IpvsDataplane) {}
  async sync(s: ProxySnapshot): Promise<SyncResult> {
    const r = Deno.env.get("NULL_DATAPLANE")
      ? { full: s.changedServices === null, payloadBytes: 0, generateMs: 0, applyMs: 0 }
      : await this.inner.sync(s);
    this.waiter?.(r);
    this.waiter = null;
    return r;
  }
  next(): Promise<SyncResult> {
    return new Promise((r) => this.waiter = r);
  }
}

// Objects as the simulator serves them (uid, resourceVersion, creationTimestamp), parsed from JSON.
let rv = 1;
const withMeta = (o: KubeObject): KubeObject => {
  const m = o.metadata as Record<string, unknown>;
  m.uid = `00000000-0000-4000-8000-${String(rv).padStart(12, "0")}`;
  m.resourceVersion = String(rv++);
  m.creationTimestamp = "2026-12-02T10:00:00Z";
  return o;
};
const pool = new IpPool();
const ips: string[][] = [];
const svcJson: string[] = [];
const sliceJson: string[] = [];
for (let i = 0; i < N; i++) {
  ips.push(Array.from({ length: M }, () => pool.take()));
  svcJson.push(JSON.stringify(withMeta(makeService(i))));
  sliceJson.push(JSON.stringify(withMeta(makeSlice(i, ips[i], null))));
}
step("baseline (+ JSON text of the objects)");

const client = {} as KubeClient;
// Informers as the agent makes them (FULL_INFORMER_CACHE=1: whole objects, as before issue #13). The caches are
// measured alone first, with informers that are then dropped, because handlers must be in place before a sync.
const fullCache = Deno.env.get("FULL_INFORMER_CACHE") === "1";
const informers = () => ({
  svcInf: newServiceInformer(client, fullCache ? {} : { cacheTransform: keepServiceIdentity }) as Informer<
    Service
  >,
  epInf: newEndpointSliceInformer(
    client,
    fullCache ? {} : { cacheTransform: keepEndpointSliceIdentity },
  ) as Informer<
    EndpointSlice
  >,
});
/** Lists every object into the informers (in a function: temporaries must not outlive it in a register). */
function listInto(inf: ReturnType<typeof informers>): void {
  inf.svcInf.replace(svcJson.map((s) => JSON.parse(s)), "1");
  inf.epInf.replace(sliceJson.map((s) => JSON.parse(s)), "1");
}
(() => {
  const alone = informers();
  listInto(alone);
  step(`informer caches alone (${fullCache ? "whole objects" : "identities"})`);
})();
step("(caches dropped)");
const { svcInf, epInf } = informers();
const MODE = Deno.env.get("MODE") ?? "iptables";
const dp = new Timed(
  MODE === "nftables"
    ? new NftablesDataplane({ family: "IPv4", runner: new NullRunner(), nodeAddresses: [] })
    : MODE === "ipvs"
    ? new IpvsDataplane({
      family: "IPv4",
      runner: new NullRunner(),
      iptables: iptablesTools("system", "IPv4"),
      localDetector: detectLocalByCIDR("10.128.0.0/9"),
      // No drain check on a timer inside the probe (the null kernel has no connections anyway).
      clock: new FakeClock(0),
    })
    : new IptablesDataplane({
      family: "IPv4",
      runner: new NullRunner(),
      backend: "legacy",
      nodeAddresses: [],
    }),
);
console.log(`${MODE} dataplane`);
const proxier = new Proxier({
  families: new Map([["IPv4", dp]]),
  nodeName: "node1",
  minSyncPeriodMs: 0,
  syncPeriodMs: 30_000,
});
proxier.onNodeAdd(makeNode("node1", "10.250.0.2") as never);

svcInf.addEventHandler({
  onAdd: (o) => proxier.onServiceAdd(o),
  onUpdate: (a, b) => proxier.onServiceUpdate(a, b),
  onDelete: (o) => proxier.onServiceDelete(o),
});
epInf.addEventHandler({
  onAdd: (o) => proxier.onEndpointSliceAdd(o),
  onUpdate: (a, b) => proxier.onEndpointSliceUpdate(a, b),
  onDelete: (o) => proxier.onEndpointSliceDelete(o),
});
listInto({ svcInf, epInf });
step("informer caches + proxier trackers (pending changes, slice cache)");

/** Resident set size and its high-water mark (VmRSS, VmHWM) in bytes. */
function rssAndPeak(): { rss: number; hwm: number } {
  const st = Deno.readTextFileSync("/proc/self/status");
  const kb = (k: string) => Number(st.match(new RegExp(`${k}:\\s+(\\d+) kB`))?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
}
heap();
// The high-water mark from here: what the first full sync adds at its peak (the batches it builds, the garbage
// around them) over the RSS it started with.
Deno.writeTextFileSync("/proc/self/clear_refs", "5");
const beforeFull = rssAndPeak();
proxier.start();
let synced = dp.next();
proxier.onServicesSynced();
proxier.onEndpointSlicesSynced();
let r = await synced;
const peakFull = rssAndPeak().hwm;
step(`first full sync (${mib(r.payloadBytes)} MiB payload, gen ${r.generateMs.toFixed(0)} ms)`);
console.log(
  `first full sync: rss before ${mib(beforeFull.rss)}, peak ${mib(peakFull)} MiB (+${
    mib(peakFull - beforeFull.rss)
  } at its peak)`,
);

// Partial syncs: K changed Services each, one endpoint replaced.
const K = Number(Deno.args[2] ?? 80);
const gens: number[] = [];
const totals: number[] = [];
let t = Date.now();
for (let round = 0; round < 15; round++) {
  for (let k = 0; k < K; k++) {
    const i = Math.floor(Math.random() * N);
    ips[i][Math.floor(Math.random() * M)] = pool.take();
    const obj = withMeta(makeSlice(i, ips[i], t++));
    (obj.metadata as Record<string, unknown>).uid = epInf.get(`scale/svc-${i}-abcde`)!.metadata!.uid;
    epInf.upsert(JSON.parse(JSON.stringify(obj)));
  }
  synced = dp.next();
  const t0 = performance.now();
  proxier.sync();
  r = await synced;
  totals.push(performance.now() - t0);
  gens.push(r.generateMs);
}
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
step(`after 15 partial syncs (${K} svc each)`);
console.log(
  `partial: ${mib(r.payloadBytes)} MiB; sync() → dataplane done median ${med(totals).toFixed(1)} ms, ` +
    `dataplane generate median ${med(gens).toFixed(1)} ms`,
);
console.log(`total above baseline: ${mib(last - base)} MiB`);
await proxier.stop();
