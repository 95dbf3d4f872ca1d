/**
 * Endpoint selection over 100k endpoints, and building a 10k-service snapshot through the Proxier.
 * Run: `deno bench --allow-all bench/selection_bench.ts`
 */
import type { EndpointSlice, Service } from "../lib/kube/types.ts";
import { configureLogging } from "../lib/log.ts";
import { FakeClock } from "../lib/proxy/clock.ts";
import { Proxier } from "../lib/proxy/proxier.ts";
import { ServiceHealthServer } from "../lib/server/service_health.ts";
import { categorizeEndpoints } from "../lib/proxy/topology.ts";
import type { Dataplane, EndpointInfo, ProxySnapshot, ServicePortInfo } from "../lib/proxy/types.ts";

configureLogging({ sink: () => {} });

const svc: ServicePortInfo = {
  name: { namespace: "ns", name: "big", port: "p80", protocol: "TCP" },
  nameString: "ns/big:p80",
  serviceKey: "ns/big",
  clusterIP: "172.30.0.1",
  port: 80,
  protocol: "TCP",
  nodePort: 30080,
  externalIPs: [],
  loadBalancerVIPs: [],
  loadBalancerSourceRanges: [],
  stickyMaxAgeSeconds: 0,
  externalPolicyLocal: true,
  internalPolicyLocal: false,
  healthCheckNodePort: 0,
};
const zones = ["zone-a", "zone-b", "zone-c"];
const endpoints: EndpointInfo[] = [];
for (let i = 0; i < 100_000; i++) {
  const ip = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
  const zone = zones[i % 3];
  endpoints.push({
    ip,
    port: 80,
    endpoint: `${ip}:80`,
    isLocal: i % 100 === 0,
    ready: i % 10 !== 0,
    serving: true,
    terminating: i % 10 === 0,
    zoneHints: new Set([zone]),
    nodeHints: null,
    nodeName: `node-${i % 100}`,
    zone,
  });
}
endpoints.sort((a, b) => (a.endpoint < b.endpoint ? -1 : 1));
const labels = { "topology.kubernetes.io/zone": "zone-a" };

Deno.bench("categorizeEndpoints: 100k endpoints, eTP=Local + zone hints", { group: "selection" }, () => {
  categorizeEndpoints(endpoints, svc, "node-0", labels, { preferSameTrafficDistribution: true });
});

Deno.bench("categorizeEndpoints: 100k endpoints, plain ClusterIP", { group: "selection" }, () => {
  categorizeEndpoints(endpoints, { ...svc, nodePort: 0, externalPolicyLocal: false }, "node-0", {}, {
    preferSameTrafficDistribution: true,
  });
});

class NullDataplane implements Dataplane {
  readonly family = "IPv4" as const;
  last: ProxySnapshot | null = null;
  #waiter: (() => void) | null = null;
  /** Resolves at the next sync() call. */
  nextSync(): Promise<void> {
    return new Promise((r) => this.#waiter = r);
  }
  /** Resolve nextSync() once the proxier's whole sync is done (its bookkeeping after the dataplane too). */
  afterSync = false;
  sync(s: ProxySnapshot) {
    this.last = s;
    const wake = () => {
      this.#waiter?.();
      this.#waiter = null;
    };
    // A timer runs once the microtasks that finish the proxier's sync have run.
    if (this.afterSync) setTimeout(wake, 0);
    else wake();
    return Promise.resolve({ full: s.changedServices === null, payloadBytes: 0, generateMs: 0, applyMs: 0 });
  }
}

function fixtures(n: number, epsPer: number): { services: Service[]; slices: EndpointSlice[] } {
  const services: Service[] = [];
  const slices: EndpointSlice[] = [];
  for (let i = 0; i < n; i++) {
    const ip = `172.30.${(i >> 8) & 255}.${i & 255}`;
    services.push({
      metadata: { namespace: "ns", name: `svc-${i}`, resourceVersion: "1" },
      spec: {
        type: "ClusterIP",
        clusterIP: ip,
        clusterIPs: [ip],
        ports: [{ name: "http", port: 80, protocol: "TCP" }],
      },
    });
    slices.push({
      metadata: {
        namespace: "ns",
        name: `svc-${i}-abc`,
        labels: { "kubernetes.io/service-name": `svc-${i}` },
      },
      addressType: "IPv4",
      ports: [{ name: "http", port: 8080, protocol: "TCP" }],
      endpoints: Array.from({ length: epsPer }, (_, j) => ({
        addresses: [`10.${(i >> 8) & 255}.${i & 255}.${j + 1}`],
        conditions: { ready: true },
        nodeName: `node-${j}`,
      })),
    });
  }
  return { services, slices };
}

const { services, slices } = fixtures(10_000, 5);

async function initialSync(
  opts: { services?: Service[]; slices?: EndpointSlice[]; health?: ServiceHealthServer } = {},
): Promise<{ proxier: Proxier; dp: NullDataplane }> {
  const clock = new FakeClock(0);
  const dp = new NullDataplane();
  dp.afterSync = opts.health !== undefined;
  const proxier = new Proxier({
    serviceHealthServer: opts.health,
    families: new Map([["IPv4", dp]]),
    nodeName: "node-0",
    minSyncPeriodMs: 0,
    syncPeriodMs: 30_000,
    clock,
  });
  for (const s of opts.services ?? services) proxier.onServiceAdd(s);
  for (const s of opts.slices ?? slices) proxier.onEndpointSliceAdd(s);
  proxier.start();
  const synced = dp.nextSync();
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  await synced;
  return { proxier, dp };
}

Deno.bench(
  "Proxier: 10k services x 5 endpoints, events + first full snapshot",
  { group: "snapshot" },
  async () => {
    const { proxier, dp } = await initialSync();
    if (dp.last?.servicePorts.size !== 10_000) throw new Error("bad snapshot");
    await proxier.stop();
  },
);

/** Replaces the first endpoint of slice number `k` (mod the count) with a new address; resolves at the sync. */
function changeOneSlice(warm: { proxier: Proxier; dp: NullDataplane }, all: EndpointSlice[], k: number) {
  const i = k % all.length;
  const s = all[i];
  const synced = warm.dp.nextSync();
  warm.proxier.onEndpointSliceUpdate(null, {
    ...s,
    endpoints: [...s.endpoints!.slice(1), {
      addresses: [`10.200.${i & 255}.${(k + 1) & 255}`],
      conditions: { ready: true },
    }],
  });
  return synced;
}

const warm = await initialSync();
let k = 0;
Deno.bench("Proxier: 10k services, one slice changed, partial snapshot", { group: "snapshot" }, async () => {
  await changeOneSlice(warm, slices, k++);
  if (warm.dp.last?.changedServices?.size !== 1) throw new Error("expected a partial snapshot");
});

// The whole sync of one change at 10k x 10, the bookkeeping after the dataplane included (the health server's
// ports and local endpoint counts, the no-local-endpoints gauges): what the agent spends of a change beyond
// minSyncPeriod besides rendering (docs/benchmarks.md, issue 21).
const big = fixtures(10_000, 10);
const health = new ServiceHealthServer({ addresses: ["127.0.0.1"] });
const warm10 = await initialSync({ ...big, health });
let k10 = 0;
Deno.bench(
  "Proxier: 10k services x 10 endpoints, one slice changed, whole sync with health bookkeeping",
  { group: "sync" },
  () => changeOneSlice(warm10, big.slices, k10++),
);
