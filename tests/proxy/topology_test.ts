/**
 * Endpoint selection, cases modelled on upstream `pkg/proxy/topology_test.go` (TestCategorizeEndpoints).
 * As upstream notes: `null` means "this kind of endpoint is not used", `[]` means "used, but none exist".
 */
import assert from "node:assert/strict";
import { categorizeEndpoints } from "../../lib/proxy/topology.ts";
import type { EndpointInfo, ServicePortInfo } from "../../lib/proxy/types.ts";
import { ep, names, svcInfo } from "./helpers.ts";

interface Case {
  name: string;
  svc: ServicePortInfo;
  zone?: string;
  gate?: boolean;
  endpoints: EndpointInfo[];
  cluster: string[] | null;
  local: string[] | null;
  all?: string[];
  anyEndpoints: boolean;
}

const nodePort = { nodePort: 30080 };
const sorted = (l: EndpointInfo[]) => [...l].sort((a, b) => (a.endpoint < b.endpoint ? -1 : 1));

const cases: Case[] = [
  {
    name: "hints: keeps only endpoints hinted for the node's zone",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"] }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.5", { zoneHints: ["zone-c"] }),
      ep("10.1.2.6", { zoneHints: ["zone-a"] }),
    ],
    cluster: ["10.1.2.3:80", "10.1.2.6:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "hints: empty node labels means no filtering",
    svc: svcInfo(),
    endpoints: [ep("10.1.2.3", { zoneHints: ["zone-a"] }), ep("10.1.2.4", { zoneHints: ["zone-b"] })],
    cluster: ["10.1.2.3:80", "10.1.2.4:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "hints: node in a zone no endpoint is hinted for means no filtering",
    svc: svcInfo(),
    zone: "zone-z",
    endpoints: [ep("10.1.2.3", { zoneHints: ["zone-a"] }), ep("10.1.2.4", { zoneHints: ["zone-b"] })],
    cluster: ["10.1.2.3:80", "10.1.2.4:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameZone: one ready endpoint lacking hints disables filtering",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"] }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.5"),
    ],
    cluster: ["10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameZone: an unready endpoint lacking hints does not disable filtering",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"] }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.5", { ready: false }),
    ],
    cluster: ["10.1.2.3:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "hints: unready endpoints in the zone are skipped",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"] }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.6", { zoneHints: ["zone-a"], ready: false }),
    ],
    cluster: ["10.1.2.3:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "hints: only unready endpoints in the zone means no filtering",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"], ready: false }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.5", { zoneHints: ["zone-c"] }),
    ],
    cluster: ["10.1.2.4:80", "10.1.2.5:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "hints: an endpoint hinted for several zones is kept when one matches",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a", "zone-b"] }),
      ep("10.1.2.4", { zoneHints: ["zone-b"] }),
      ep("10.1.2.5", { zoneHints: ["zone-b", "zone-c"] }),
    ],
    cluster: ["10.1.2.3:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameNode: keeps endpoints hinted for this node",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"], nodeHints: ["host1"] }),
      ep("10.1.2.4", { zoneHints: ["zone-a"], nodeHints: ["host2"] }),
      ep("10.1.2.5", { zoneHints: ["zone-b"], nodeHints: ["host3"] }),
    ],
    cluster: ["10.1.2.3:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameNode: falls back to same zone when the feature gate is off",
    svc: svcInfo(),
    zone: "zone-a",
    gate: false,
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"], nodeHints: ["host1"] }),
      ep("10.1.2.4", { zoneHints: ["zone-a"], nodeHints: ["host2"] }),
      ep("10.1.2.5", { zoneHints: ["zone-b"], nodeHints: ["host3"] }),
    ],
    cluster: ["10.1.2.3:80", "10.1.2.4:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameNode: falls back to same zone when no endpoint is hinted for this node",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"], nodeHints: ["host4"] }),
      ep("10.1.2.4", { zoneHints: ["zone-a"], nodeHints: ["host2"] }),
      ep("10.1.2.5", { zoneHints: ["zone-b"], nodeHints: ["host3"] }),
    ],
    cluster: ["10.1.2.3:80", "10.1.2.4:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "PreferSameNode: falls back to same zone when one ready endpoint lacks node hints",
    svc: svcInfo(),
    zone: "zone-a",
    endpoints: [
      ep("10.1.2.3", { zoneHints: ["zone-a"], nodeHints: ["host1"] }),
      ep("10.1.2.4", { zoneHints: ["zone-a"] }),
      ep("10.1.2.5", { zoneHints: ["zone-b"], nodeHints: ["host3"] }),
    ],
    cluster: ["10.1.2.3:80", "10.1.2.4:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "iTP Local: with no local endpoints, local is empty and nothing is reachable, but endpoints exist",
    svc: svcInfo({ internalPolicyLocal: true }),
    endpoints: [ep("10.0.0.0"), ep("10.0.0.1")],
    cluster: null,
    local: [],
    all: [],
    anyEndpoints: true,
  },
  {
    name: "iTP Local: only local endpoints are used, topology ignored",
    svc: svcInfo({ internalPolicyLocal: true }),
    zone: "zone-a",
    endpoints: [
      ep("10.0.0.0", { zoneHints: ["zone-a"] }),
      ep("10.0.0.1", { local: true, zoneHints: ["zone-b"] }),
    ],
    cluster: null,
    local: ["10.0.0.1:80"],
    anyEndpoints: true,
  },
  {
    name: "eTP Local: with no local endpoints, cluster endpoints still serve short-circuited traffic",
    svc: svcInfo({ externalPolicyLocal: true, ...nodePort }),
    endpoints: [ep("10.0.0.0"), ep("10.0.0.1")],
    cluster: ["10.0.0.0:80", "10.0.0.1:80"],
    local: [],
    all: ["10.0.0.0:80", "10.0.0.1:80"],
    anyEndpoints: true,
  },
  {
    name: "eTP Local: external policy is ignored for a port that is not externally accessible",
    svc: svcInfo({ externalPolicyLocal: true }),
    endpoints: [ep("10.0.0.0"), ep("10.0.0.1", { local: true })],
    cluster: ["10.0.0.0:80", "10.0.0.1:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "eTP Local: only terminating local endpoints are used for Local, merged into all reachable",
    svc: svcInfo({ externalPolicyLocal: true, ...nodePort }),
    endpoints: [
      ep("10.0.0.0"),
      ep("10.0.0.1", { local: true, ready: false, serving: true, terminating: true }),
      ep("10.0.0.2", { local: true, ready: false, serving: true, terminating: true }),
      ep("10.0.0.3", { local: true, ready: false, serving: false, terminating: true }),
    ],
    cluster: ["10.0.0.0:80"],
    local: ["10.0.0.1:80", "10.0.0.2:80"],
    all: ["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"],
    anyEndpoints: true,
  },
  {
    name: "eTP Local: ready local endpoints win over terminating local ones",
    svc: svcInfo({ externalPolicyLocal: true, ...nodePort }),
    endpoints: [
      ep("10.0.0.0", { local: true, ready: false, serving: true, terminating: true }),
      ep("10.0.0.1", { local: true }),
      ep("10.0.0.2"),
    ],
    cluster: ["10.0.0.1:80", "10.0.0.2:80"],
    local: ["10.0.0.1:80"],
    all: ["10.0.0.1:80", "10.0.0.2:80"],
    anyEndpoints: true,
  },
  {
    name: "iTP Local and eTP Local: all endpoints remote and terminating",
    svc: svcInfo({ internalPolicyLocal: true, externalPolicyLocal: true, ...nodePort }),
    endpoints: [
      ep("10.0.0.0", { ready: false, serving: true, terminating: true }),
      ep("10.0.0.1", { ready: false, serving: true, terminating: true }),
    ],
    cluster: ["10.0.0.0:80", "10.0.0.1:80"],
    local: [],
    all: ["10.0.0.0:80", "10.0.0.1:80"],
    anyEndpoints: true,
  },
  {
    name: "Cluster: falls back to serving-terminating endpoints when none is ready",
    svc: svcInfo(),
    endpoints: [
      ep("10.0.0.0", { ready: false, serving: true, terminating: true }),
      ep("10.0.0.1", { ready: false, serving: false, terminating: true }),
      ep("10.0.0.2", { ready: false, serving: false, terminating: false }),
    ],
    cluster: ["10.0.0.0:80"],
    local: null,
    anyEndpoints: true,
  },
  {
    name: "Cluster: no usable endpoint at all (not ready, not serving) means nothing and no endpoints",
    svc: svcInfo(),
    endpoints: [
      ep("10.0.0.0", { ready: false, serving: false, terminating: true }),
      ep("10.0.0.1", { ready: false }),
    ],
    cluster: [],
    local: null,
    anyEndpoints: false,
  },
  {
    name: "no endpoints: everything null and no endpoints",
    svc: svcInfo({ internalPolicyLocal: true }),
    endpoints: [],
    cluster: null,
    local: null,
    all: [],
    anyEndpoints: false,
  },
  {
    name: "conflicting topology and localness require merging all reachable endpoints",
    svc: svcInfo({ externalPolicyLocal: true, ...nodePort }),
    zone: "zone-a",
    endpoints: [
      ep("10.0.0.0", { zoneHints: ["zone-a"] }),
      ep("10.0.0.1", { local: true, zoneHints: ["zone-b"] }),
      ep("10.0.0.2", { zoneHints: ["zone-a"] }),
    ],
    cluster: ["10.0.0.0:80", "10.0.0.2:80"],
    local: ["10.0.0.1:80"],
    all: ["10.0.0.0:80", "10.0.0.1:80", "10.0.0.2:80"],
    anyEndpoints: true,
  },
  {
    name: "dual-stack: IPv6 endpoints are sorted and selected like IPv4 ones",
    svc: svcInfo({ clusterIP: "fd00:172:30::1", externalPolicyLocal: true, ...nodePort }),
    endpoints: [ep("fd00:10::2", { local: true }), ep("fd00:10::1")],
    cluster: ["[fd00:10::1]:80", "[fd00:10::2]:80"],
    local: ["[fd00:10::2]:80"],
    all: ["[fd00:10::1]:80", "[fd00:10::2]:80"],
    anyEndpoints: true,
  },
];

Deno.test("categorizeEndpoints() follows upstream's selection rules", async (t) => {
  for (const [i, c] of cases.entries()) {
    await t.step(c.name, () => {
      const labels: Record<string, string> = c.zone ? { "topology.kubernetes.io/zone": c.zone } : {};
      const sel = categorizeEndpoints(sorted(c.endpoints), c.svc, "host1", labels, {
        preferSameTrafficDistribution: c.gate ?? true,
      });
      const where = `case #${i} "${c.name}"`;
      assert.deepEqual(names(sel.clusterEndpoints), c.cluster, `${where}: cluster endpoints`);
      assert.deepEqual(names(sel.localEndpoints), c.local, `${where}: local endpoints`);
      const all = c.all ?? [...new Set([...(c.cluster ?? []), ...(c.local ?? [])])].sort();
      assert.deepEqual(names(sel.allReachableEndpoints), all, `${where}: all reachable endpoints`);
      assert.equal(sel.hasAnyEndpoints, c.anyEndpoints, `${where}: hasAnyEndpoints`);
    });
  }
});
