/** Health, service-health and metrics servers over real HTTP on 127.0.0.1 with port 0. */
import assert from "node:assert/strict";
import type { Node } from "../../lib/kube/types.ts";
import { configureLogging } from "../../lib/log.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { ProxyHealthServer } from "../../lib/server/health.ts";
import { MetricsServer } from "../../lib/server/metrics_server.ts";
import { metricsText } from "../../lib/metrics.ts";
import { ServiceHealthServer } from "../../lib/server/service_health.ts";

configureLogging({ sink: () => {} });

async function get(port: number, path: string): Promise<{ status: number; headers: Headers; body: string }> {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: r.status, headers: r.headers, body: await r.text() };
}

Deno.test("ProxyHealthServer answers /healthz and /livez with upstream's codes, headers and bodies", async (t) => {
  const clock = new FakeClock(Date.parse("2026-01-01T00:00:00Z"));
  let node: Node | undefined = { metadata: { name: "host1" } };
  const hs = new ProxyHealthServer({
    bindAddress: "127.0.0.1:0",
    healthTimeoutMs: 60_000,
    getNode: () => node,
    clock,
  });
  hs.start();
  await hs.ready;
  const port = hs.port!;
  try {
    await t.step("healthy at start-up", async () => {
      const r = await get(port, "/healthz");
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("content-type"), "application/json");
      assert.equal(r.headers.get("x-content-type-options"), "nosniff");
      assert.deepEqual(JSON.parse(r.body), {
        lastUpdated: "2026-01-01T00:00:00Z",
        currentTime: "2026-01-01T00:00:00Z",
        nodeEligible: true,
        healthy: true,
      });
    });
    await t.step("a queued update within 2 x syncPeriod stays healthy", async () => {
      hs.updated("IPv4");
      await clock.advance(1000);
      hs.queuedUpdate("IPv4");
      await clock.advance(59_000);
      assert.equal((await get(port, "/healthz")).status, 200);
    });
    await t.step("a queued update older than the timeout is unhealthy on both paths", async () => {
      await clock.advance(1000);
      const r = await get(port, "/healthz");
      assert.equal(r.status, 503);
      assert.deepEqual(JSON.parse(r.body), {
        lastUpdated: "2026-01-01T00:00:00Z",
        currentTime: "2026-01-01T00:01:01Z",
        nodeEligible: true,
        healthy: false,
        status: { IPv4: { lastUpdated: "2026-01-01T00:00:00Z", healthy: false } },
      });
      const l = await get(port, "/livez");
      assert.equal(l.status, 503);
      assert.equal("nodeEligible" in JSON.parse(l.body), false);
    });
    await t.step("an update makes it healthy again, reporting lastUpdated as now", async () => {
      hs.updated("IPv4");
      await clock.advance(500);
      const r = await get(port, "/livez");
      assert.equal(r.status, 200);
      assert.equal(JSON.parse(r.body).lastUpdated, "2026-01-01T00:01:01.5Z");
    });
    await t.step(
      "/healthz fails but /livez passes when the node is tainted for deletion or deleted",
      async () => {
        node = { metadata: { name: "host1" }, spec: { taints: [{ key: "ToBeDeletedByClusterAutoscaler" }] } };
        assert.equal((await get(port, "/healthz")).status, 503);
        assert.equal((await get(port, "/livez")).status, 200);
        node = { metadata: { name: "host1", deletionTimestamp: "2026-01-01T00:00:00Z" } };
        const r = await get(port, "/healthz");
        assert.equal(r.status, 503);
        assert.equal(JSON.parse(r.body).nodeEligible, false);
        assert.equal(JSON.parse(r.body).healthy, true);
        node = undefined;
        assert.equal((await get(port, "/healthz")).status, 503, "unknown node is not eligible");
      },
    );
    await t.step("counts answers by code", async () => {
      const text = await metricsText();
      assert.match(text, /kubeproxy_proxy_healthz_total\{code="503"\} [1-9]/);
      assert.match(text, /kubeproxy_proxy_livez_total\{code="200"\} [1-9]/);
    });
  } finally {
    await hs.stop();
  }
});

Deno.test("ProxyHealthServer retries a busy port and reports fatal only with bindAddressHardFail", async () => {
  const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (busy.addr as Deno.NetAddr).port;
  const clock = new FakeClock(0);
  const soft = new ProxyHealthServer({ bindAddress: `127.0.0.1:${port}`, healthTimeoutMs: 1, clock });
  soft.start();
  assert.equal(soft.port, null);
  assert.equal(clock.pendingTimers, 1, "a retry is scheduled");
  const fatal: Error[] = [];
  const hard = new ProxyHealthServer({
    bindAddress: `127.0.0.1:${port}`,
    healthTimeoutMs: 1,
    bindAddressHardFail: true,
    onFatal: (e) => fatal.push(e),
    clock,
  });
  hard.start();
  assert.equal(fatal.length, 1);
  busy.close();
  await clock.advance(5000);
  assert.equal(soft.port, port, "bound on the retry once the port is free");
  await soft.stop();
  await hard.stop();
});

Deno.test("ServiceHealthServer serves 200/503 with the endpoint weight and opens/closes listeners", async () => {
  let proxyHealthy = true;
  const errors: string[] = [];
  const shs = new ServiceHealthServer({
    addresses: ["127.0.0.1"],
    proxyHealthy: () => proxyHealthy,
    onListenError: (k) => errors.push(k),
  });
  try {
    shs.syncServices(new Map([["ns1/svc1", 0], ["ns1/svc2", 0]]));
    shs.syncEndpoints(new Map([["ns1/svc1", 2]]));
    const port1 = shs.listening().get("ns1/svc1")![0];
    const port2 = shs.listening().get("ns1/svc2")![0];
    let r = await get(port1, "/anything");
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("x-load-balancing-endpoint-weight"), "2");
    assert.equal(r.headers.get("content-type"), "application/json");
    assert.deepEqual(JSON.parse(r.body), {
      service: { namespace: "ns1", name: "svc1" },
      localEndpoints: 2,
      serviceProxyHealthy: true,
    });
    r = await get(port2, "/");
    assert.equal(r.status, 503, "no local endpoints");
    assert.equal(r.headers.get("x-load-balancing-endpoint-weight"), "0");
    proxyHealthy = false;
    r = await get(port1, "/");
    assert.equal(r.status, 503, "proxy unhealthy");
    assert.equal(JSON.parse(r.body).serviceProxyHealthy, false);
    shs.syncServices(new Map([["ns1/svc1", 0]]));
    assert.deepEqual([...shs.listening().keys()], ["ns1/svc1"]);
    const busy = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    shs.syncServices(new Map([["ns1/svc1", 0], ["ns1/svc3", (busy.addr as Deno.NetAddr).port]]));
    assert.deepEqual(errors, ["ns1/svc3"], "a port that cannot be opened is reported");
    busy.close();
  } finally {
    await shs.stop();
  }
});

const UPSTREAM_METRICS: [string, string][] = [
  ["kubeproxy_sync_proxy_rules_duration_seconds", "histogram"],
  ["kubeproxy_sync_full_proxy_rules_duration_seconds", "histogram"],
  ["kubeproxy_sync_partial_proxy_rules_duration_seconds", "histogram"],
  ["kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge"],
  ["kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "gauge"],
  ["kubeproxy_network_programming_duration_seconds", "histogram"],
  ["kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge"],
  ["kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter"],
  ["kubeproxy_sync_proxy_rules_service_changes_pending", "gauge"],
  ["kubeproxy_sync_proxy_rules_service_changes_total", "counter"],
  ["kubeproxy_sync_proxy_rules_no_local_endpoints_total", "gauge"],
  ["kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "counter"],
  ["kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "counter"],
  ["kubeproxy_sync_proxy_rules_iptables_total", "gauge"],
  ["kubeproxy_sync_proxy_rules_iptables_last", "gauge"],
  ["kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "counter"],
  ["kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", "counter"],
  ["kubeproxy_conntrack_reconciler_sync_duration_seconds", "histogram"],
  ["kubeproxy_conntrack_reconciler_deleted_entries_total", "counter"],
  ["kubeproxy_proxy_healthz_total", "counter"],
  ["kubeproxy_proxy_livez_total", "counter"],
];

/** Upstream's RegisterMetrics: the metrics each mode serves besides the core ones. */
const MODE_ONLY: Record<string, string[]> = {
  iptables: [
    "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_total",
    "kubeproxy_sync_proxy_rules_iptables_last",
    "kubeproxy_conntrack_reconciler_sync_duration_seconds",
    "kubeproxy_conntrack_reconciler_deleted_entries_total",
  ],
  nftables: [
    "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
    "kubeproxy_conntrack_reconciler_sync_duration_seconds",
    "kubeproxy_conntrack_reconciler_deleted_entries_total",
  ],
};

Deno.test("every upstream metric has upstream's name and type", async () => {
  const types = new Map<string, string>();
  for (const line of (await metricsText()).split("\n")) {
    const m = line.match(/^# TYPE (\S+) (\S+)$/);
    if (m) types.set(m[1], m[2]);
  }
  for (const [name, type] of UPSTREAM_METRICS) assert.equal(types.get(name), type, name);
});

Deno.test("MetricsServer serves the core and its mode's metrics (as upstream registers them), /healthz, /proxyMode", async () => {
  const ms = new MetricsServer({ bindAddress: "127.0.0.1:0", mode: "nftables" });
  ms.start();
  await ms.ready;
  try {
    const r = await get(ms.port!, "/metrics");
    assert.equal(r.status, 200);
    assert.match(r.headers.get("content-type") ?? "", /^text\/plain/);
    const types = new Map<string, string>();
    for (const line of r.body.split("\n")) {
      const m = line.match(/^# TYPE (\S+) (\S+)$/);
      if (m) types.set(m[1], m[2]);
    }
    const iptablesOnly = MODE_ONLY.iptables.filter((n) => !MODE_ONLY.nftables.includes(n));
    for (const [name, type] of UPSTREAM_METRICS) {
      if (iptablesOnly.includes(name)) {
        assert.equal(types.has(name), false, `${name} is not an nftables metric`);
      } else assert.equal(types.get(name), type, name);
    }
    assert.deepEqual(await get(ms.port!, "/healthz").then((x) => [x.status, x.body]), [200, "ok"]);
    assert.deepEqual(await get(ms.port!, "/proxyMode").then((x) => [x.status, x.body]), [200, "nftables"]);
    assert.equal((await get(ms.port!, "/nope")).status, 404);
  } finally {
    await ms.stop();
  }
});

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

Deno.test("ServiceHealthServer body is upstream's tab-indented text, byte for byte", async () => {
  const shs = new ServiceHealthServer({ addresses: ["127.0.0.1"] });
  try {
    shs.syncServices(new Map([["ns1/svc1", 0]]));
    shs.syncEndpoints(new Map([["ns1/svc1", 1]]));
    const r = await get(shs.listening().get("ns1/svc1")![0], "/");
    assert.equal(
      r.body,
      '{\n\t"service": {\n\t\t"namespace": "ns1",\n\t\t"name": "svc1"\n\t},\n\t"localEndpoints": 1,\n' +
        '\t"serviceProxyHealthy": true\n}',
    );
  } finally {
    await shs.stop();
  }
});

Deno.test("ServiceHealthServer hands a port from a removed Service to a new one in the same sync", async () => {
  const errors: string[] = [];
  const shs = new ServiceHealthServer({ addresses: ["127.0.0.1"], onListenError: (k) => errors.push(k) });
  const port = freePort();
  try {
    shs.syncServices(new Map([["ns1/old", port]]));
    assert.deepEqual(shs.listening().get("ns1/old"), [port]);
    shs.syncServices(new Map([["ns1/new", port]]));
    await shs.settled();
    assert.deepEqual(errors, [], "no AddrInUse reported");
    assert.deepEqual([...shs.listening()], [["ns1/new", [port]]]);
    shs.syncEndpoints(new Map([["ns1/new", 3]]));
    const r = await get(port, "/");
    assert.equal(r.status, 200);
    assert.match(r.body, /"name": "new"/);
  } finally {
    await shs.stop();
  }
});

Deno.test("a wildcard 0.0.0.0 health-check listener also answers over IPv6, as Go's dual-stack listen", async () => {
  const shs = new ServiceHealthServer({ addresses: ["0.0.0.0"] });
  const port = freePort();
  try {
    shs.syncServices(new Map([["ns1/svc1", port]]));
    shs.syncEndpoints(new Map([["ns1/svc1", 1]]));
    for (const host of ["127.0.0.1", "[::1]"]) {
      const r = await fetch(`http://${host}:${port}/`);
      assert.equal(r.status, 200, host);
      await r.body?.cancel();
    }
  } finally {
    await shs.stop();
  }
});
