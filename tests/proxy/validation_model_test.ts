/** Objects the API would refuse are skipped where they enter the model, with the field named; the rest is used. */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import { EndpointSliceCache, portKey } from "../../lib/proxy/endpoint_slice_cache.ts";
import { buildServicePorts, clusterIPForFamily } from "../../lib/proxy/service_port.ts";
import { topologyLabels } from "../../lib/proxy/node_manager.ts";
import type { EndpointSlice, Service } from "../../lib/kube/types.ts";
import { service, slice } from "./helpers.ts";

configureLogging({ sink: () => {} });

function collect() {
  const fields: string[] = [];
  const reasons: string[] = [];
  return {
    fields,
    reasons,
    cb: (_o: Service | EndpointSlice, reason: string, field?: string) => {
      reasons.push(reason);
      fields.push(field ?? "");
    },
  };
}

Deno.test("a Service with a hostile name or namespace is skipped and reported with the field", () => {
  for (
    const [ns, name, field] of [
      ["ns", 'a"b', "metadata.name"],
      ["ns", "a\nb", "metadata.name"],
      ["ns", "a".repeat(300), "metadata.name"],
      ["ns", "1abc", "metadata.name"], // DNS-1035: a Service name starts with a letter
      ["n;s", "svc", "metadata.namespace"],
      ["ns.x", "svc", "metadata.namespace"],
    ]
  ) {
    const c = collect();
    assert.equal(buildServicePorts(service(ns, name), "IPv4", c.cb), null, `${ns}/${name}`);
    assert.deepEqual(c.fields, [field]);
    assert.match(
      c.reasons[0],
      new RegExp(`^Skipping invalid Service: ${field.replace(".", "\\.")}: Invalid value: `),
    );
  }
  const c = collect();
  assert.equal(buildServicePorts(service("ns", "svc"), "IPv4", c.cb)?.size, 1);
  assert.deepEqual(c.fields, []);
});

Deno.test("a Service port with an invalid name is skipped; the Service's other ports stay", () => {
  const c = collect();
  const ports = buildServicePorts(
    service("ns", "svc", {
      ports: [
        { name: "good", port: 80, protocol: "TCP" },
        { name: "bad name", port: 81, protocol: "TCP" },
        { name: "x".repeat(64), port: 82, protocol: "TCP" },
        { name: "p", port: 83, protocol: "ICMP" as "TCP" },
      ],
    }),
    "IPv4",
    c.cb,
  )!;
  assert.deepEqual([...ports.keys()], ["ns/svc:good"]);
  assert.deepEqual(c.fields, ["spec.ports[1].name", "spec.ports[2].name", "spec.ports[3].protocol"]);
});

Deno.test("clusterIPForFamily() takes the family of the parsed address, not of a ':' in the text", () => {
  const svc = service("ns", "svc", {
    clusterIP: "::ffff:10.0.0.1",
    clusterIPs: ["::ffff:10.0.0.1", "fd00::1"],
  });
  assert.equal(clusterIPForFamily(svc, "IPv4"), "::ffff:10.0.0.1");
  assert.equal(clusterIPForFamily(svc, "IPv6"), "fd00::1");
  assert.equal(buildServicePorts(svc, "IPv4")!.get("ns/svc:p80")!.clusterIP, "10.0.0.1");
});

Deno.test("EndpointSlice endpoints are parsed as the slice's family; a bad one is skipped, the others kept", () => {
  const c = collect();
  const cache = new EndpointSliceCache("host1", "IPv4", c.cb);
  const key = cache.update(
    slice("ns", "svc", "svc-1", [
      { addresses: ["10.0.0.1"] },
      { addresses: ["10.0.0.2 -j ACCEPT"] },
      { addresses: ["fd00::3"] },
      { addresses: ["::ffff:10.0.0.4"] },
      { addresses: ["010.000.000.005"] },
      { addresses: ["127.0.0.1"] },
      { addresses: ["10.0.0.7"], nodeName: "Node_7" },
      { addresses: ["10.0.0.8"], zone: "zone a" },
      { addresses: ["10.0.0.9"], hostname: "h.9" },
      { addresses: ["10.0.0.10"], hints: { forZones: [{ name: "z;1" }] } },
      { addresses: ["10.0.0.11", "10.0.0.x"] },
    ]),
    false,
  );
  assert.equal(key, "ns/svc");
  const eps = cache.endpointsFor("ns/svc").get(portKey("p80", "TCP"))!;
  // An IPv4-mapped IPv6 address and leading zeros are legacy IPv4 forms the API accepts: used canonical.
  assert.deepEqual(eps.map((e) => e.endpoint), ["10.0.0.1:80", "10.0.0.4:80", "10.0.0.5:80"]);
  assert.deepEqual(c.fields, [
    "endpoints[1].addresses[0]",
    "endpoints[2].addresses[0]",
    "endpoints[5].addresses[0]",
    "endpoints[6].nodeName",
    "endpoints[7].zone",
    "endpoints[8].hostname",
    "endpoints[9].hints.forZones[0].name",
    "endpoints[10].addresses[1]",
  ]);
  assert.match(c.reasons[1], /must be an IPv4 address/);
});

Deno.test("EndpointSlice ports with an invalid name or protocol are skipped; a slice with a bad identity is not cached", () => {
  const c = collect();
  const cache = new EndpointSliceCache("host1", "IPv4", c.cb);
  cache.update(
    slice("ns", "svc", "svc-1", [{ addresses: ["10.0.0.1"] }], {
      ports: [
        { name: "p80", port: 80, protocol: "TCP" },
        { name: "p\n81", port: 81, protocol: "TCP" },
        { name: "p82", port: 82, protocol: "TCP; drop" },
      ],
    }),
    false,
  );
  assert.deepEqual([...cache.endpointsFor("ns/svc").keys()], ["p80/TCP"]);
  assert.deepEqual(c.fields, ["ports[1].name", "ports[2].protocol"]);
  for (
    const [s, field] of [
      [slice("n s", "svc", "svc-1", []), "metadata.namespace"],
      [slice("ns", "svc", "Svc_1", []), "metadata.name"],
      [slice("ns", 'svc"', "svc-1", []), "metadata.labels[kubernetes.io/service-name]"],
    ] as const
  ) {
    const d = collect();
    const cache2 = new EndpointSliceCache("host1", "IPv4", d.cb);
    assert.equal(cache2.update(s, false), null);
    assert.equal(cache2.serviceCount, 0);
    assert.deepEqual(d.fields, [field]);
  }
});

Deno.test("a Node zone label the API would refuse is ignored", () => {
  const zone = "topology.kubernetes.io/zone";
  assert.deepEqual(topologyLabels({ metadata: { labels: { [zone]: "a b" } } }), {});
  assert.deepEqual(topologyLabels({ metadata: { labels: { [zone]: "zone-a" } } }), { [zone]: "zone-a" });
});

Deno.test("a ClientIP affinity timeout outside the API's (0, 86400] skips the Service (it reaches rule text)", () => {
  for (const t of [0, -1, 1.5, 86401, 1e12]) {
    const c = collect();
    const svc = service("ns", "svc", {
      sessionAffinity: "ClientIP",
      sessionAffinityConfig: { clientIP: { timeoutSeconds: t } },
    });
    assert.equal(buildServicePorts(svc, "IPv4", c.cb), null, String(t));
    assert.deepEqual(c.fields, ["spec.sessionAffinityConfig.clientIP.timeoutSeconds"]);
  }
  const ok = service("ns", "svc", {
    sessionAffinity: "ClientIP",
    sessionAffinityConfig: { clientIP: { timeoutSeconds: 86400 } },
  });
  assert.equal(buildServicePorts(ok, "IPv4")!.get("ns/svc:p80")!.stickyMaxAgeSeconds, 86400);
});
