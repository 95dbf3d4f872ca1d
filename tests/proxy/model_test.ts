/** Service ports, the EndpointSlice cache and the change trackers. */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import { EndpointsChangeTracker, ServiceChangeTracker } from "../../lib/proxy/change_tracker.ts";
import { EndpointSliceCache, portKey } from "../../lib/proxy/endpoint_slice_cache.ts";
import { parseCIDR, parseIP } from "../../lib/net/ip.ts";
import { buildServicePorts } from "../../lib/proxy/service_port.ts";
import type { Service } from "../../lib/kube/types.ts";
import { service, slice } from "./helpers.ts";

configureLogging({ sink: () => {} });

Deno.test("parseIP() and parseCIDR() accept Go's sloppy forms and print Go's canonical ones", () => {
  assert.deepEqual(parseIP("010.000.0.1"), { ip: "10.0.0.1", family: "IPv4" });
  assert.deepEqual(parseIP("FD00:0:0::0001"), { ip: "fd00::1", family: "IPv6" });
  assert.deepEqual(parseIP("::ffff:1.2.3.4"), { ip: "1.2.3.4", family: "IPv4" });
  assert.equal(parseIP("1.2.3"), null);
  assert.equal(parseIP("1.2.3.256"), null);
  assert.equal(parseIP("fd00::1::2"), null);
  assert.equal(parseCIDR("10.1.2.3/8")?.cidr, "10.0.0.0/8");
  assert.equal(parseCIDR("fd00:1:2::5/32")?.cidr, "fd00:1::/32");
  assert.equal(parseCIDR("10.0.0.0/33"), null);
});

Deno.test("buildServicePorts() splits a dual-stack Service by family", () => {
  const svc = service("ns1", "svc1", {
    type: "LoadBalancer",
    clusterIP: "172.30.0.1",
    clusterIPs: ["172.30.0.1", "fd00::1"],
    externalIPs: ["1.2.3.4", "2001:db8::4"],
    loadBalancerSourceRanges: [" 10.0.0.0/8 ", "2001:db8::/32"],
    externalTrafficPolicy: "Local",
    healthCheckNodePort: 31000,
    sessionAffinity: "ClientIP",
    ports: [{ name: "p80", port: 80, protocol: "TCP", nodePort: 30080 }, {
      name: "dns",
      port: 53,
      protocol: "UDP",
    }],
  }, {
    loadBalancer: {
      ingress: [{ ip: "5.6.7.8" }, { ip: "5.6.7.9", ipMode: "Proxy" }, { hostname: "lb.example" }, {
        ip: "2001:db8::8",
        ipMode: "VIP",
      }],
    },
  });
  const v4 = buildServicePorts(svc, "IPv4")!;
  const v6 = buildServicePorts(svc, "IPv6")!;
  const p = v4.get("ns1/svc1:p80")!;
  assert.equal(p.clusterIP, "172.30.0.1");
  assert.deepEqual(p.externalIPs, ["1.2.3.4"]);
  assert.deepEqual(p.loadBalancerVIPs, ["5.6.7.8"], "Proxy-mode and hostname ingress are ignored");
  assert.deepEqual(p.loadBalancerSourceRanges, ["10.0.0.0/8"], "ranges are trimmed and split by family");
  assert.equal(p.stickyMaxAgeSeconds, 10800, "ClientIP affinity defaults to 10800 s");
  assert.equal(p.externalPolicyLocal, true);
  assert.equal(p.healthCheckNodePort, 31000);
  assert.equal(p.nodePort, 30080);
  assert.equal(v4.get("ns1/svc1:dns")!.protocol, "UDP");
  const q = v6.get("ns1/svc1:p80")!;
  assert.equal(q.clusterIP, "fd00::1");
  assert.deepEqual(q.externalIPs, ["2001:db8::4"]);
  assert.deepEqual(q.loadBalancerVIPs, ["2001:db8::8"]);
  assert.deepEqual(q.loadBalancerSourceRanges, ["2001:db8::/32"]);
});

Deno.test("buildServicePorts() skips headless, ExternalName and wrong-family Services", () => {
  assert.equal(
    buildServicePorts(service("ns", "a", { clusterIP: "None", clusterIPs: ["None"] }), "IPv4"),
    null,
  );
  assert.equal(buildServicePorts(service("ns", "b", { clusterIP: "", clusterIPs: [] }), "IPv4"), null);
  assert.equal(
    buildServicePorts(service("ns", "c", { type: "ExternalName", externalName: "x.example" }), "IPv4"),
    null,
  );
  assert.equal(buildServicePorts(service("ns", "d"), "IPv6"), null);
});

Deno.test("buildServicePorts() reports each unusable field with its path", () => {
  const reports: string[] = [];
  const cb = (_svc: Service, reason: string, field?: string) => reports.push(`${field}: ${reason}`);
  assert.equal(
    buildServicePorts(
      service("ns", "a", { clusterIP: "10.0.0.999", clusterIPs: ["10.0.0.999"] }),
      "IPv4",
      cb,
    ),
    null,
  );
  assert.equal(
    buildServicePorts(service("ns", "b", { clusterIP: "10.0.0.999", clusterIPs: [] }), "IPv4", cb),
    null,
  );
  const ports = buildServicePorts(
    service("ns", "c", {
      type: "LoadBalancer",
      externalIPs: ["1.2.3.4", "1.2.3"],
      loadBalancerSourceRanges: ["10.0.0.0/8", "10.0.0.0/99"],
      ports: [
        { name: "a", port: 80, protocol: "TCP", nodePort: 70000 },
        { name: "b", port: 0, protocol: "TCP" },
        { name: "c", port: 81, protocol: "ICMP" },
      ],
    }, { loadBalancer: { ingress: [{ ip: "5.6.7" }] } }),
    "IPv4",
    cb,
  )!;
  assert.deepEqual([...ports.keys()], ["ns/c:a"]);
  assert.deepEqual(reports, [
    "spec.clusterIPs[0]: Service has an invalid cluster IP; skipping it",
    "spec.clusterIP: Service has an invalid cluster IP; skipping it",
    "spec.externalIPs[1]: Skipping invalid IP",
    "spec.loadBalancerSourceRanges[1]: Skipping invalid CIDR",
    "status.loadBalancer.ingress[0].ip: Skipping invalid IP",
    "spec.ports[0].nodePort: Service port has an invalid nodePort; ignoring it",
    "spec.ports[1].port: Service port has an invalid port number; skipping the port",
    "spec.ports[2].protocol: Service port has an unknown protocol; skipping the port",
  ]);
});

Deno.test("buildServicePorts() applies external policy Local only to externally reachable types", () => {
  const cases: [string, Service["spec"], boolean][] = [
    ["ClusterIP", { type: "ClusterIP", externalTrafficPolicy: "Local" }, false],
    ["ClusterIP with externalIPs", {
      type: "ClusterIP",
      externalTrafficPolicy: "Local",
      externalIPs: ["1.2.3.4"],
    }, true],
    ["NodePort", { type: "NodePort", externalTrafficPolicy: "Local" }, true],
    [
      "LoadBalancer",
      { type: "LoadBalancer", externalTrafficPolicy: "Local", healthCheckNodePort: 30000 },
      true,
    ],
    ["LoadBalancer Cluster", { type: "LoadBalancer", externalTrafficPolicy: "Cluster" }, false],
  ];
  for (const [name, spec, want] of cases) {
    const p = [...buildServicePorts(service("ns", "s", spec), "IPv4")!.values()][0];
    assert.equal(p.externalPolicyLocal, want, name);
  }
});

Deno.test("buildServicePorts() drops bad fields and ports, reports each, and never throws", () => {
  const reported: string[] = [];
  const svc = service("ns1", "bad", {
    externalIPs: ["1.2.3.4", "not-an-ip"],
    loadBalancerSourceRanges: ["10.0.0.0/8", "10.0.0.0/99"],
    ports: [
      { name: "ok", port: 80, protocol: "TCP" },
      { name: "zero", port: 0, protocol: "TCP" },
      { name: "icmp", port: 1, protocol: "ICMP" },
    ],
  });
  const ports = buildServicePorts(svc, "IPv4", (_s, reason) => reported.push(reason))!;
  assert.deepEqual([...ports.keys()], ["ns1/bad:ok"]);
  assert.deepEqual(ports.get("ns1/bad:ok")!.externalIPs, ["1.2.3.4"]);
  assert.deepEqual(ports.get("ns1/bad:ok")!.loadBalancerSourceRanges, ["10.0.0.0/8"]);
  assert.equal(reported.length, 4, reported.join("; "));
  const badIP = service("ns1", "badip", { clusterIP: "300.1.1.1", clusterIPs: ["300.1.1.1"] });
  assert.equal(buildServicePorts(badIP, "IPv4", (_s, r) => reported.push(r)), null);
  assert.equal(reported.length, 5);
});

Deno.test("ServiceChangeTracker drops no-op updates and reports changed Services", () => {
  const t = new ServiceChangeTracker("IPv4");
  const a = service("ns", "a");
  assert.equal(t.update(null, a), true);
  assert.equal(t.update(a, null), false, "add then delete before a sync is a no-op");
  assert.equal(t.update(null, a), true);
  assert.deepEqual([...t.apply()], ["ns/a"]);
  const a2 = { ...a, metadata: { ...a.metadata, resourceVersion: "2", labels: { x: "y" } } };
  assert.equal(t.update(a, a2), false, "a change that does not affect ports is dropped");
  assert.deepEqual([...t.apply()], []);
  const a3 = service("ns", "a", { ports: [{ name: "p80", port: 81, protocol: "TCP" }] });
  assert.equal(t.update(a2, a3), true);
  assert.deepEqual([...t.apply()], ["ns/a"]);
  assert.equal(t.get("ns/a")!.get("ns/a:p80")!.port, 81);
});

Deno.test("a malformed Service is skipped without affecting others", () => {
  const reported: string[] = [];
  const t = new ServiceChangeTracker("IPv4", (s) => reported.push(s.metadata!.name!));
  const good = service("ns", "good");
  const bad = {
    metadata: { namespace: "ns", name: "bad" },
    spec: { clusterIP: "x.y", clusterIPs: ["x.y"], ports: null },
  };
  t.update(null, bad as unknown as Service);
  t.update(null, good);
  t.update(null, { metadata: { namespace: "ns", name: "nospec" } });
  t.apply();
  assert.ok(t.get("ns/good"));
  assert.equal(t.get("ns/bad"), undefined);
  assert.deepEqual(reported, ["bad"]);
});

Deno.test("EndpointSliceCache merges slices: addresses[0] only, other family ignored, sorted by ip:port", () => {
  const c = new EndpointSliceCache("host1", "IPv4");
  c.update(
    slice("ns", "svc", "s1", [
      { addresses: ["10.0.0.10", "10.0.0.99"], nodeName: "host1" },
      { addresses: ["10.0.0.2"], conditions: { ready: false, serving: true, terminating: true } },
      { addresses: ["fd00::1"] },
      { addresses: [] },
    ]),
    false,
  );
  c.update(slice("ns", "svc", "s2", [{ addresses: ["10.0.0.3"], conditions: { ready: null } }]), false);
  assert.equal(
    c.update(slice("ns", "svc", "s3", [{ addresses: ["fd00::2"] }], { addressType: "IPv6" }), false),
    null,
  );
  assert.equal(
    c.update(slice("ns", "svc", "s4", [{ addresses: ["a.example"] }], { addressType: "FQDN" }), false),
    null,
  );
  const eps = c.endpointsFor("ns/svc").get(portKey("p80", "TCP"))!;
  assert.deepEqual(eps.map((e) => e.endpoint), ["10.0.0.10:80", "10.0.0.2:80", "10.0.0.3:80"]);
  assert.equal(eps[0].isLocal, true);
  assert.deepEqual([eps[1].ready, eps[1].serving, eps[1].terminating], [false, true, true]);
  assert.deepEqual(
    [eps[2].ready, eps[2].serving, eps[2].terminating],
    [true, true, false],
    "unset conditions",
  );
});

Deno.test("EndpointSliceCache: a duplicate endpoint in two slices keeps the non-terminating copy", () => {
  for (const order of [["a", "b"], ["b", "a"]]) {
    const c = new EndpointSliceCache("host1", "IPv4");
    const term = { addresses: ["10.0.0.1"], conditions: { ready: false, serving: true, terminating: true } };
    const live = { addresses: ["10.0.0.1"], conditions: { ready: true } };
    c.update(slice("ns", "svc", order[0], [term]), false);
    c.update(slice("ns", "svc", order[1], [live]), false);
    const eps = c.endpointsFor("ns/svc").get(portKey("p80", "TCP"))!;
    assert.equal(eps.length, 1);
    assert.equal(eps[0].terminating, false, `terminating copy in slice ${order[0]}`);
  }
});

Deno.test("EndpointsChangeTracker: a change to one slice marks only its Service as changed", () => {
  const t = new EndpointsChangeTracker("host1", "IPv4", 0);
  t.update(slice("ns", "a", "a-1", [{ addresses: ["10.0.0.1"] }]), false);
  t.update(slice("ns", "b", "b-1", [{ addresses: ["10.0.1.1"] }]), false);
  assert.deepEqual([...t.checkout().changedServices].sort(), ["ns/a", "ns/b"]);
  assert.equal(
    t.update(slice("ns", "b", "b-1", [{ addresses: ["10.0.1.1"] }]), false),
    false,
    "no-op update",
  );
  t.update(slice("ns", "a", "a-1", [{ addresses: ["10.0.0.2"] }]), false);
  const r = t.checkout();
  assert.deepEqual([...r.changedServices], ["ns/a"]);
  assert.equal(r.conntrackCleanupRequired, false, "TCP only");
  assert.deepEqual(t.get("ns/a")!.get("p80/TCP")!.map((e) => e.endpoint), ["10.0.0.2:80"]);
});

Deno.test("EndpointsChangeTracker requires conntrack cleanup when UDP endpoints change", () => {
  const t = new EndpointsChangeTracker("host1", "IPv4", 0);
  const ports = [{ name: "dns", port: 53, protocol: "UDP" }];
  t.update(slice("ns", "dns", "d1", [{ addresses: ["10.0.0.1"] }], { ports }), false);
  assert.equal(t.checkout().conntrackCleanupRequired, true);
  t.update(slice("ns", "dns", "d1", [{ addresses: ["10.0.0.1"] }], { ports }), true);
  const r = t.checkout();
  assert.equal(r.conntrackCleanupRequired, true);
  assert.equal(t.get("ns/dns"), undefined);
});

Deno.test("EndpointsChangeTracker keeps trigger times later than its start only", () => {
  const start = Date.parse("2026-01-01T00:00:00Z");
  const t = new EndpointsChangeTracker("host1", "IPv4", start);
  const ann = (v: string) => ({ annotations: { "endpoints.kubernetes.io/last-change-trigger-time": v } });
  t.update(slice("ns", "a", "a1", [{ addresses: ["10.0.0.1"] }], ann("2025-12-31T23:59:59Z")), false);
  t.update(
    slice("ns", "b", "b1", [{ addresses: ["10.0.0.2"] }], ann("2026-01-01T00:00:01.500000000Z")),
    false,
  );
  const r = t.checkout();
  assert.equal(r.lastChangeTriggerTimes.has("ns/a"), false);
  assert.deepEqual(r.lastChangeTriggerTimes.get("ns/b"), [start + 1500]);
  assert.equal(t.checkout().lastChangeTriggerTimes.size, 0);
});
