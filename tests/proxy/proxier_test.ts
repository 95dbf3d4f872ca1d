/** Proxier orchestration with a fake Dataplane that records snapshots, on a fake clock. */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { Proxier } from "../../lib/proxy/proxier.ts";
import { metricsText } from "../../lib/metrics.ts";
import type { Dataplane, IPFamily, ProxySnapshot, SyncResult } from "../../lib/proxy/types.ts";
import type { Node } from "../../lib/kube/types.ts";
import { keepEndpointSliceIdentity, keepServiceIdentity } from "../../lib/kube/informer.ts";
import { service, slice } from "./helpers.ts";

configureLogging({ sink: () => {} });

class FakeDataplane implements Dataplane {
  snapshots: ProxySnapshot[] = [];
  failNext = 0;
  flushed = false;
  /** What skipsPeriodicFullSync() answers (the iptables dataplane's large-cluster mode). */
  largeCluster = false;
  constructor(readonly family: IPFamily) {}
  skipsPeriodicFullSync(): boolean {
    return this.largeCluster;
  }
  sync(s: ProxySnapshot): Promise<SyncResult> {
    this.snapshots.push(s);
    if (this.failNext > 0) {
      this.failNext--;
      return Promise.reject(new Error("restore failed"));
    }
    return Promise.resolve({ full: s.changedServices === null, payloadBytes: 0, generateMs: 0, applyMs: 0 });
  }
  needsFullSync(): Promise<boolean> {
    const f = this.flushed;
    this.flushed = false;
    return Promise.resolve(f);
  }
  get last(): ProxySnapshot {
    return this.snapshots[this.snapshots.length - 1];
  }
}

function setup(families: IPFamily[] = ["IPv4"], isolateRefusedPorts = true) {
  const clock = new FakeClock(Date.parse("2026-01-01T00:00:00Z"));
  const dps = new Map(families.map((f) => [f, new FakeDataplane(f)]));
  const cleaned: ProxySnapshot[] = [];
  const removedUDP: string[][] = [];
  const health: string[] = [];
  const proxier = new Proxier({
    families: dps,
    nodeName: "host1",
    minSyncPeriodMs: 1000,
    syncPeriodMs: 30_000,
    clock,
    isolateRefusedPorts,
    conntrackCleaner: (s, removed) => {
      cleaned.push(s);
      removedUDP.push(removed.map((r) => `${r.clusterIP}:${r.port}/${r.protocol}`));
      return Promise.resolve();
    },
    healthServer: {
      queuedUpdate: (f) => health.push(`queued ${f}`),
      updated: (f) => health.push(`updated ${f}`),
      isHealthy: () => true,
    },
  });
  return { clock, dp: dps.get(families[0])!, dps, proxier, cleaned, removedUDP, health };
}

Deno.test("Proxier does not sync before both Services and EndpointSlices are synced", async () => {
  const { clock, dp, proxier } = setup();
  proxier.start();
  proxier.onServiceAdd(service("ns", "a"));
  proxier.onServicesSynced();
  await clock.advance(5000);
  assert.equal(dp.snapshots.length, 0);
  proxier.onEndpointSliceAdd(slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }]));
  await clock.advance(5000);
  assert.equal(dp.snapshots.length, 0);
  proxier.onEndpointSlicesSynced();
  await clock.advance(0);
  assert.equal(dp.snapshots.length, 1);
  const s = dp.last;
  assert.equal(s.changedServices, null, "first sync is full");
  assert.deepEqual(s.servicePorts.get("ns/a:p80")!.selection.clusterEndpoints!.map((e) => e.endpoint), [
    "10.0.0.1:80",
  ]);
  assert.equal(s.totalEndpoints, 1);
  await proxier.stop();
});

Deno.test("Proxier sends partial snapshots naming only the changed Services, cached selection for others", async () => {
  const { clock, dp, proxier } = setup();
  proxier.onServiceAdd(service("ns", "a"));
  proxier.onServiceAdd(service("ns", "b", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] }));
  proxier.onEndpointSliceAdd(slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }]));
  proxier.onEndpointSliceAdd(slice("ns", "b", "b1", [{ addresses: ["10.0.1.1"] }]));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  // The states, not the Map: the proxier updates the snapshot's port map in place for the next sync.
  const firstA = dp.last.servicePorts.get("ns/a:p80");
  const firstB = dp.last.servicePorts.get("ns/b:p80");
  proxier.onEndpointSliceUpdate(null, slice("ns", "a", "a1", [{ addresses: ["10.0.0.2"] }]));
  await clock.advance(1000);
  assert.equal(dp.snapshots.length, 2);
  assert.deepEqual([...dp.last.changedServices!], ["ns/a"]);
  assert.equal(dp.last.servicePorts.get("ns/b:p80"), firstB, "unchanged state reused");
  assert.notEqual(dp.last.servicePorts.get("ns/a:p80"), firstA);
  proxier.onServiceDelete(service("ns", "b"));
  await clock.advance(1000);
  assert.deepEqual([...dp.last.changedServices!], ["ns/b"]);
  assert.equal(dp.last.servicePorts.has("ns/b:p80"), false);
  await proxier.stop();
});

Deno.test("Proxier keeps the snapshot's port map and endpoint count up to date in place across syncs", async () => {
  const { clock, dp, proxier } = setup();
  const twoPorts = {
    ports: [{ name: "p80", port: 80, protocol: "TCP" as const }, {
      name: "p81",
      port: 81,
      protocol: "TCP" as const,
    }],
  };
  proxier.onServiceAdd(service("ns", "a"));
  proxier.onServiceAdd(service("ns", "b", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] }));
  proxier.onServiceAdd(service("ns", "c", { clusterIP: "172.30.1.3", clusterIPs: ["172.30.1.3"] }));
  proxier.onEndpointSliceAdd(
    slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }, { addresses: ["10.0.0.2"] }]),
  );
  proxier.onEndpointSliceAdd(slice("ns", "b", "b1", [{ addresses: ["10.0.1.1"] }]));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  const map = dp.last.servicePorts;
  assert.deepEqual([...map.keys()], ["ns/a:p80", "ns/b:p80", "ns/c:p80"]);
  assert.equal(dp.last.totalEndpoints, 3);
  const sumOfEndpoints = () => [...dp.last.servicePorts.values()].reduce((n, s) => n + s.endpoints.length, 0);

  // A port added to b stays with b's others at the end of the map; c is deleted; a loses an endpoint.
  proxier.onServiceUpdate(
    null,
    service("ns", "b", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"], ...twoPorts }),
  );
  proxier.onServiceDelete(service("ns", "c", { clusterIP: "172.30.1.3", clusterIPs: ["172.30.1.3"] }));
  proxier.onEndpointSliceUpdate(null, slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }]));
  await clock.advance(1000);
  assert.equal(dp.snapshots.length, 2);
  assert.equal(dp.last.servicePorts, map, "the same Map, updated in place");
  assert.deepEqual([...map.keys()], ["ns/a:p80", "ns/b:p80", "ns/b:p81"]);
  assert.equal(map.get("ns/a:p80")!.endpoints.length, 1);
  assert.equal(dp.last.totalEndpoints, 2);
  assert.equal(dp.last.totalEndpoints, sumOfEndpoints());

  // b loses the port again, c comes back (at the end, as a new Service).
  proxier.onServiceUpdate(null, service("ns", "b", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] }));
  proxier.onServiceAdd(service("ns", "c", { clusterIP: "172.30.1.3", clusterIPs: ["172.30.1.3"] }));
  await clock.advance(1000);
  assert.deepEqual([...dp.last.servicePorts.keys()], ["ns/a:p80", "ns/b:p80", "ns/c:p80"]);
  assert.equal(dp.last.totalEndpoints, sumOfEndpoints());
  assert.equal(dp.last.totalEndpoints, 2);
  await proxier.stop();
});

Deno.test("Proxier retries a failed sync after syncPeriod and makes the next sync full", async () => {
  // Without isolation (isolation_test.ts covers it): the failed sync as such is retried.
  const { clock, dp, proxier, health } = setup(["IPv4"], false);
  proxier.onServiceAdd(service("ns", "a"));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  dp.failNext = 1;
  proxier.onEndpointSliceAdd(slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }]));
  await clock.advance(1000);
  assert.equal(dp.snapshots.length, 2);
  assert.deepEqual([...dp.last.changedServices!], ["ns/a"], "the failing sync was partial");
  assert.equal(proxier.failureCount, 1);
  assert.equal(health.at(-1), "queued IPv4", "health not updated after the failure");
  await clock.advance(29_999);
  assert.equal(dp.snapshots.length, 2);
  await clock.advance(1);
  assert.equal(dp.snapshots.length, 3, "retried after syncPeriod");
  assert.equal(dp.last.changedServices, null, "the retry is a full sync");
  assert.equal(dp.last.servicePorts.get("ns/a:p80")!.endpoints.length, 1);
  assert.equal(health.at(-1), "updated IPv4");
  await proxier.stop();
});

Deno.test("Proxier forces a full sync on a node topology change and re-selects endpoints", async () => {
  const { clock, dp, proxier } = setup();
  const node = (zone: string): Node => ({
    metadata: { name: "host1", labels: { "topology.kubernetes.io/zone": zone } },
    status: { addresses: [{ type: "InternalIP", address: "192.168.0.1" }] },
  });
  proxier.onNodeAdd(node("zone-a"));
  proxier.onServiceAdd(service("ns", "a"));
  proxier.onEndpointSliceAdd(slice("ns", "a", "a1", [
    { addresses: ["10.0.0.1"], hints: { forZones: [{ name: "zone-a" }] } },
    { addresses: ["10.0.0.2"], hints: { forZones: [{ name: "zone-b" }] } },
  ]));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  const eps = () => dp.last.servicePorts.get("ns/a:p80")!.selection.clusterEndpoints!.map((e) => e.ip);
  assert.deepEqual(eps(), ["10.0.0.1"]);
  assert.deepEqual(dp.last.node.ips, ["192.168.0.1"]);
  proxier.onNodeUpdate(null, {
    ...node("zone-a"),
    metadata: { name: "host1", labels: { "topology.kubernetes.io/zone": "zone-a", other: "x" } },
  });
  await clock.advance(5000);
  assert.equal(dp.snapshots.length, 1, "a non-topology label change does not resync");
  proxier.onNodeUpdate(null, node("zone-b"));
  await clock.advance(1000);
  assert.equal(dp.snapshots.length, 2);
  assert.equal(dp.last.changedServices, null);
  assert.deepEqual(eps(), ["10.0.0.2"]);
  await proxier.stop();
});

Deno.test("Proxier cleans conntrack only when UDP endpoints changed, and polls needsFullSync", async () => {
  const { clock, dp, proxier, cleaned } = setup();
  const udp = service("ns", "dns", { ports: [{ name: "dns", port: 53, protocol: "UDP" }] });
  proxier.onServiceAdd(udp);
  proxier.onServiceAdd(service("ns", "web", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] }));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  proxier.onEndpointSliceAdd(slice("ns", "web", "w1", [{ addresses: ["10.0.0.1"] }]));
  await clock.advance(1000);
  assert.equal(cleaned.length, 0);
  proxier.onEndpointSliceAdd(
    slice("ns", "dns", "d1", [{ addresses: ["10.0.0.5"] }], {
      ports: [{ name: "dns", port: 53, protocol: "UDP" }],
    }),
  );
  await clock.advance(1000);
  assert.equal(cleaned.length, 1);
  assert.equal(cleaned[0], dp.last);
  const n = dp.snapshots.length;
  dp.flushed = true;
  await clock.advance(30_000);
  assert.equal(dp.snapshots.length, n + 1);
  assert.equal(dp.last.changedServices, null, "an external flush forces a full sync");
  await proxier.stop();
});

Deno.test("Proxier cleans conntrack for a deleted UDP Service, naming its frontends (v1.38 #141371)", async () => {
  const { clock, proxier, cleaned, removedUDP } = setup();
  const udp = service("ns", "dns", { ports: [{ name: "dns", port: 53, protocol: "UDP" }] });
  const tcp = service("ns", "web", { clusterIP: "172.30.1.2", clusterIPs: ["172.30.1.2"] });
  proxier.onServiceAdd(udp);
  proxier.onServiceAdd(tcp);
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  assert.equal(cleaned.length, 0);
  proxier.onServiceDelete(tcp);
  await clock.advance(1000);
  assert.equal(cleaned.length, 0, "a deleted TCP Service needs no cleanup");
  proxier.onServiceDelete(udp);
  await clock.advance(1000);
  assert.equal(cleaned.length, 1);
  assert.deepEqual(removedUDP[0], [`${udp.spec!.clusterIP}:53/UDP`]);
  await proxier.stop();
});

Deno.test("Proxier: the hourly full resync happens, unless the dataplane is in large-cluster mode (v1.37 #138571)", async () => {
  for (const large of [false, true]) {
    const { clock, dp, proxier } = setup();
    dp.largeCluster = large;
    proxier.onServiceAdd(service("ns", "web"));
    proxier.onServicesSynced();
    proxier.onEndpointSlicesSynced();
    proxier.start();
    await clock.advance(0);
    assert.equal(dp.snapshots.length, 1);
    assert.equal(dp.last.changedServices, null, "the first sync is full");
    // Past the hour, with syncPeriod (30 s) ticks all along and no change.
    await clock.advance(60 * 60 * 1000 + 30_000);
    const fulls = dp.snapshots.filter((s) => s.changedServices === null).length;
    assert.equal(fulls, large ? 1 : 2, `large-cluster mode ${large}`);
    // A change is still synced (partially) in large-cluster mode.
    proxier.onServiceAdd(service("ns", "api", { clusterIP: "172.30.1.9", clusterIPs: ["172.30.1.9"] }));
    await clock.advance(1000);
    assert.deepEqual([...dp.last.changedServices ?? []], ["ns/api"]);
    await proxier.stop();
  }
});

Deno.test("Proxier builds one snapshot per family from dual-stack Services and slices", async () => {
  const { clock, dps, proxier } = setup(["IPv4", "IPv6"]);
  proxier.onServiceAdd(service("ns", "ds", { clusterIPs: ["172.30.1.1", "fd00::1"] }));
  proxier.onEndpointSliceAdd(slice("ns", "ds", "v4", [{ addresses: ["10.0.0.1"] }]));
  proxier.onEndpointSliceAdd(
    slice("ns", "ds", "v6", [{ addresses: ["fd00:10::1"] }], { addressType: "IPv6" }),
  );
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  const v4 = dps.get("IPv4")!.last.servicePorts.get("ns/ds:p80")!;
  const v6 = dps.get("IPv6")!.last.servicePorts.get("ns/ds:p80")!;
  assert.equal(v4.info.clusterIP, "172.30.1.1");
  assert.deepEqual(v4.endpoints.map((e) => e.endpoint), ["10.0.0.1:80"]);
  assert.equal(v6.info.clusterIP, "fd00::1");
  assert.deepEqual(v6.endpoints.map((e) => e.endpoint), ["[fd00:10::1]:80"]);
  await proxier.stop();
});

Deno.test("Proxier skips the dataplane of a family with no changes, and keeps it healthy", async () => {
  const { clock, dps, proxier, health } = setup(["IPv4", "IPv6"]);
  proxier.onServiceAdd(service("ns", "ds", { clusterIPs: ["172.30.1.1", "fd00::1"] }));
  proxier.onEndpointSliceAdd(slice("ns", "ds", "v4", [{ addresses: ["10.0.0.1"] }]));
  proxier.onEndpointSliceAdd(
    slice("ns", "ds", "v6", [{ addresses: ["fd00:10::1"] }], { addressType: "IPv6" }),
  );
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  const v4 = dps.get("IPv4")!, v6 = dps.get("IPv6")!;
  assert.equal(v4.snapshots.length, 1);
  assert.equal(v6.snapshots.length, 1);
  health.length = 0;

  // An IPv4-only endpoint change: only the IPv4 dataplane syncs.
  proxier.onEndpointSliceUpdate(null, slice("ns", "ds", "v4", [{ addresses: ["10.0.0.2"] }]));
  await clock.advance(1000);
  assert.equal(v4.snapshots.length, 2);
  assert.deepEqual([...v4.last.changedServices!], ["ns/ds"]);
  assert.equal(v6.snapshots.length, 1, "IPv6 had nothing to write");
  assert.ok(health.includes("updated IPv6"), "the skipped family still reports a fresh sync");

  // A change of the IPv6 slice reaches the IPv6 dataplane.
  proxier.onEndpointSliceUpdate(
    null,
    slice("ns", "ds", "v6", [{ addresses: ["fd00:10::2"] }], { addressType: "IPv6" }),
  );
  await clock.advance(1000);
  assert.equal(v6.snapshots.length, 2);
  assert.deepEqual(v6.last.servicePorts.get("ns/ds:p80")!.endpoints.map((e) => e.endpoint), [
    "[fd00:10::2]:80",
  ]);
  await proxier.stop();
});

Deno.test("no_local_endpoints gauge counts Local-policy services that have endpoints, none of them local", async () => {
  const { clock, proxier } = setup();
  // remote-only: endpoints exist on another node only -> counted (its traffic is dropped here).
  proxier.onServiceAdd(
    service("ns", "remote-only", { clusterIPs: ["172.30.1.1"], internalTrafficPolicy: "Local" }),
  );
  proxier.onEndpointSliceAdd(
    slice("ns", "remote-only", "a", [{ addresses: ["10.0.0.1"], nodeName: "host2" }]),
  );
  // no endpoints at all -> REJECTed, not counted, as upstream.
  proxier.onServiceAdd(
    service("ns", "empty", { clusterIPs: ["172.30.1.2"], internalTrafficPolicy: "Local" }),
  );
  // a local endpoint -> not counted.
  proxier.onServiceAdd(
    service("ns", "local", { clusterIPs: ["172.30.1.3"], internalTrafficPolicy: "Local" }),
  );
  proxier.onEndpointSliceAdd(slice("ns", "local", "b", [{ addresses: ["10.0.0.2"], nodeName: "host1" }]));
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  const text = await metricsText();
  assert.match(
    text,
    /^kubeproxy_sync_proxy_rules_no_local_endpoints_total\{ip_family="IPv4",traffic_policy="internal"\} 1$/m,
  );
  assert.match(
    text,
    /^kubeproxy_sync_proxy_rules_no_local_endpoints_total\{ip_family="IPv4",traffic_policy="external"\} 0$/m,
  );
  await proxier.stop();
});

Deno.test("service health counts a dual-stack pod once (upstream's per-family count)", async () => {
  const clock = new FakeClock(Date.parse("2026-01-01T00:00:00Z"));
  const dps = new Map<IPFamily, FakeDataplane>([["IPv4", new FakeDataplane("IPv4")], [
    "IPv6",
    new FakeDataplane("IPv6"),
  ]]);
  const pushed: Map<string, number>[] = [];
  const proxier = new Proxier({
    families: dps,
    nodeName: "host1",
    minSyncPeriodMs: 0,
    syncPeriodMs: 30_000,
    clock,
    serviceHealthServer: { syncServices: () => {}, syncEndpoints: (c) => void pushed.push(new Map(c)) },
  });
  proxier.onServiceAdd(service("ns", "lb", {
    type: "LoadBalancer",
    clusterIPs: ["172.30.1.1", "fd00::1"],
    externalTrafficPolicy: "Local",
    healthCheckNodePort: 32000,
    ports: [{ name: "p80", port: 80, protocol: "TCP", nodePort: 30080 }],
  }));
  // One local pod with both an IPv4 and an IPv6 address, and a second local pod with IPv4 only.
  proxier.onEndpointSliceAdd(slice("ns", "lb", "v4", [
    { addresses: ["10.0.0.1"], nodeName: "host1" },
    { addresses: ["10.0.0.2"], nodeName: "host1" },
  ]));
  proxier.onEndpointSliceAdd(
    slice("ns", "lb", "v6", [{ addresses: ["fd00:10::1"], nodeName: "host1" }], { addressType: "IPv6" }),
  );
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  assert.equal(pushed.at(-1)!.get("ns/lb"), 2, "2 local pods, not 3 addresses");
  await proxier.stop();
});

Deno.test("Proxier hands each family its ServiceCIDRs and syncs when they change", async () => {
  const { clock, dps, proxier } = setup(["IPv4", "IPv6"]);
  proxier.onServiceCIDRsChanged(["fd00:10:96::/112", "10.96.0.0/16"]);
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  assert.deepEqual(dps.get("IPv4")!.last.serviceCIDRs, ["10.96.0.0/16"]);
  assert.deepEqual(dps.get("IPv6")!.last.serviceCIDRs, ["fd00:10:96::/112"]);
  const n4 = dps.get("IPv4")!.snapshots.length, n6 = dps.get("IPv6")!.snapshots.length;
  proxier.onServiceCIDRsChanged(["10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/112"]);
  await clock.advance(1000);
  assert.equal(dps.get("IPv4")!.snapshots.length, n4 + 1, "IPv4 syncs the new CIDR");
  assert.deepEqual(dps.get("IPv4")!.last.serviceCIDRs, ["10.96.0.0/16", "10.97.0.0/16"]);
  assert.equal(dps.get("IPv6")!.snapshots.length, n6, "IPv6 saw no change");
  proxier.onServiceCIDRsChanged(["10.97.0.0/16", "10.96.0.0/16", "fd00:10:96::/112"]);
  await clock.advance(1000);
  assert.equal(dps.get("IPv4")!.snapshots.length, n4 + 1, "same set in another order: nothing to do");
  await proxier.stop();
});

Deno.test("Proxier: a resync of identity-only cached objects is a counted no-op (nothing re-parsed, no sync)", async () => {
  const { clock, dp, proxier } = setup();
  proxier.start();
  const s = service("ns", "a");
  const sl = slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }]);
  proxier.onServiceAdd(s);
  proxier.onEndpointSliceAdd(sl);
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  await clock.advance(0);
  assert.equal(dp.snapshots.length, 1);
  const count = async (name: string) =>
    Number((await metricsText()).match(new RegExp(`^${name} (\\S+)$`, "m"))?.[1] ?? 0);
  const svcChanges = await count("kubeproxy_sync_proxy_rules_service_changes_total");
  const epChanges = await count("kubeproxy_sync_proxy_rules_endpoint_changes_total");
  // What an informer with keepServiceIdentity / keepEndpointSliceIdentity re-delivers on resync.
  const keptSvc = keepServiceIdentity(s);
  const keptSlice = keepEndpointSliceIdentity(sl);
  proxier.onServiceUpdate(keptSvc, keptSvc);
  proxier.onEndpointSliceUpdate(keptSlice, keptSlice);
  await clock.advance(5000);
  assert.equal(dp.snapshots.length, 1, "no sync");
  assert.equal(await count("kubeproxy_sync_proxy_rules_service_changes_total"), svcChanges + 1);
  assert.equal(await count("kubeproxy_sync_proxy_rules_endpoint_changes_total"), epChanges + 1);
  // The model still has the Service and its endpoint: a later real change syncs it with both.
  proxier.onEndpointSliceUpdate(keptSlice, slice("ns", "a", "a1", [{ addresses: ["10.0.0.2"] }]));
  await clock.advance(5000);
  assert.deepEqual(dp.last.servicePorts.get("ns/a:p80")!.endpoints.map((e) => e.endpoint), ["10.0.0.2:80"]);
  await proxier.stop();
});
