/** Refused service ports are found by bisection above the dataplane seam, quarantined and retried. */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { isolateRefused } from "../../lib/proxy/isolation.ts";
import { Proxier } from "../../lib/proxy/proxier.ts";
import { metricsText } from "../../lib/metrics.ts";
import type {
  Dataplane,
  IPFamily,
  ProxySnapshot,
  ServicePortInfo,
  SyncResult,
} from "../../lib/proxy/types.ts";
import { service, slice } from "./helpers.ts";

configureLogging({ sink: () => {} });

/** A "tool" that refuses any set containing a refused item, counting its attempts. */
function refusing<T>(bad: (t: T) => boolean) {
  const calls: T[][] = [];
  return {
    calls,
    sync: (items: readonly T[]) => {
      calls.push([...items]);
      const hit = items.find(bad);
      return hit === undefined ? Promise.resolve(items.length) : Promise.reject(new Error(`refused ${hit}`));
    },
  };
}

Deno.test("isolateRefused() finds exactly the refused items and ends with a sync of all the others", async () => {
  const items = Array.from({ length: 40 }, (_, i) => i);
  const tool = refusing<number>((n) => n === 7 || n === 30 || n === 31);
  const r = (await isolateRefused([100, 101], items, new Error("first"), tool.sync))!;
  assert.deepEqual(r.refused.map((x) => x.item), [7, 30, 31]);
  assert.deepEqual(String((r.refused[0].error as Error).message), "refused 7");
  assert.deepEqual([...tool.calls.at(-1)!].sort((a, b) => a - b), [
    ...items.filter((n) => ![7, 30, 31].includes(n)),
    100,
    101,
  ]);
  assert.equal(r.result, 39, "the result of the last, successful sync");
  assert.equal(r.attempts, tool.calls.length);
  assert.ok(tool.calls[0].length === 2, "the trusted items are tried alone first");
  assert.ok(r.attempts <= 3 * 7 + 3, `bisection, not one sync per item: ${r.attempts}`);
});

Deno.test("isolateRefused() quarantines nothing after a transient failure, and gives up when trusted items fail", async () => {
  const ok = refusing<number>(() => false);
  const r = (await isolateRefused([1], [2], new Error("lock held"), ok.sync))!;
  assert.deepEqual(r.refused, []);
  assert.deepEqual(r.accepted, [1, 2]);
  const broken = refusing<number>(() => true);
  assert.equal(await isolateRefused([1], [2, 3], new Error("no tool"), broken.sync), null);
  assert.equal(broken.calls.length, 1);
  const capped = refusing<number>((n) => n % 2 === 0);
  assert.equal(
    await isolateRefused([], Array.from({ length: 64 }, (_, i) => i), new Error("x"), capped.sync, {
      maxAttempts: 20,
    }),
    null,
  );
  assert.equal(capped.calls.length, 20);
  assert.equal(await isolateRefused([1], [], new Error("x"), ok.sync), null);
});

/** A dataplane whose tool refuses every port whose Service name starts with "bad". */
class RefusingDataplane implements Dataplane {
  snapshots: ProxySnapshot[] = [];
  /** The ports programmed by the last successful sync. */
  programmed: string[] = [];
  constructor(readonly family: IPFamily) {}
  sync(s: ProxySnapshot): Promise<SyncResult> {
    this.snapshots.push(s);
    const bad = [...s.servicePorts.keys()].find((k) => k.split("/")[1].startsWith("bad"));
    if (bad) return Promise.reject(new Error(`iptables-restore: line 12 failed (${bad})`));
    if (s.changedServices === null) this.programmed = [...s.servicePorts.keys()].sort();
    else {
      const keep = this.programmed.filter((k) => !s.changedServices!.has(k.split(":")[0]));
      for (const [k, p] of s.servicePorts) if (s.changedServices.has(p.info.serviceKey)) keep.push(k);
      this.programmed = [...new Set(keep)].sort();
    }
    return Promise.resolve({ full: s.changedServices === null, payloadBytes: 0, generateMs: 0, applyMs: 0 });
  }
}

Deno.test("Proxier quarantines the refused ports with a report each, programs the rest, and retries them", async () => {
  const clock = new FakeClock(Date.parse("2026-01-01T00:00:00Z"));
  const dp = new RefusingDataplane("IPv4");
  const quarantined: string[] = [];
  const proxier = new Proxier({
    families: new Map([["IPv4", dp]]),
    nodeName: "host1",
    minSyncPeriodMs: 1000,
    syncPeriodMs: 30_000,
    fullSyncPeriodMs: 3_600_000,
    clock,
    onQuarantine: (p: ServicePortInfo, family, error) =>
      quarantined.push(`${p.nameString} ${family} ${error}`),
  });
  for (let i = 0; i < 20; i++) {
    proxier.onServiceAdd(
      service("ns", `good${i}`, { clusterIP: `172.30.0.${i + 1}`, clusterIPs: [`172.30.0.${i + 1}`] }),
    );
  }
  proxier.onServiceAdd(service("ns", "bad1", { clusterIP: "172.30.1.1", clusterIPs: ["172.30.1.1"] }));
  proxier.onServiceAdd(service("ns", "bad2", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] }));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  assert.equal(dp.programmed.length, 20);
  assert.ok(dp.programmed.every((k) => k.startsWith("ns/good")));
  assert.deepEqual(quarantined.sort(), [
    "ns/bad1:p80 IPv4 iptables-restore: line 12 failed (ns/bad1:p80)",
    "ns/bad2:p80 IPv4 iptables-restore: line 12 failed (ns/bad2:p80)",
  ]);
  assert.match(await metricsText(), /denokubeproxy_quarantined_service_ports\{ip_family="IPv4"\} 2/);
  assert.equal(proxier.failureCount, 1, "the sync as asked for failed once");

  // A Service added afterwards is programmed by a partial sync that leaves the quarantined ports out.
  const before = dp.snapshots.length;
  proxier.onServiceAdd(service("ns", "later", { clusterIP: "172.30.2.1", clusterIPs: ["172.30.2.1"] }));
  proxier.onEndpointSliceAdd(slice("ns", "later", "later-1", [{ addresses: ["10.0.0.9"] }]));
  await clock.advance(1000);
  assert.equal(dp.snapshots.length, before + 1, "one partial sync, no bisection");
  assert.deepEqual([...dp.snapshots.at(-1)!.changedServices!], ["ns/later"]);
  assert.ok(dp.programmed.includes("ns/later:p80"));

  // A change of a quarantined Service retries it at once; still refused, it goes back to quarantine.
  quarantined.length = 0;
  proxier.onServiceUpdate(
    null,
    service("ns", "bad1", { clusterIP: "172.30.1.9", clusterIPs: ["172.30.1.9"] }),
  );
  await clock.advance(1000);
  assert.deepEqual(quarantined.map((q) => q.split(" ")[0]), ["ns/bad1:p80"]);
  assert.equal(dp.programmed.length, 21);

  // The next full sync retries every quarantined port (the tool still refuses them here).
  quarantined.length = 0;
  await clock.advance(3_600_000);
  assert.deepEqual(quarantined.map((q) => q.split(" ")[0]).sort(), ["ns/bad1:p80", "ns/bad2:p80"]);
  assert.equal(dp.programmed.length, 21);

  // Deleting a quarantined Service releases it.
  proxier.onServiceDelete(service("ns", "bad2"));
  proxier.onServiceDelete(service("ns", "bad1"));
  await clock.advance(1000);
  assert.match(await metricsText(), /denokubeproxy_quarantined_service_ports\{ip_family="IPv4"\} 0/);
  await proxier.stop();
});
