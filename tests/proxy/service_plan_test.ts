/** planServicePort(): the decisions every dataplane shares; and test fixtures agree with the proxier. */
import assert from "node:assert/strict";
import { configureLogging } from "../../lib/log.ts";
import type { EndpointSlice, Service } from "../../lib/kube/types.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { Proxier } from "../../lib/proxy/proxier.ts";
import { planServicePort, type ServicePortPlan } from "../../lib/proxy/service_plan.ts";
import type {
  Dataplane,
  EndpointInfo,
  EndpointSelection,
  ProxySnapshot,
  SyncResult,
} from "../../lib/proxy/types.ts";
import { type EpSpec, makeState, overallFixture, type SvcSpec, TEST_NODE } from "../../testkit/fixtures.ts";

configureLogging({ sink: () => {} });

const plan = (s: SvcSpec, eps: EpSpec[]) => makeState(s, eps).plan;
const base: SvcSpec = { ns: "ns", name: "svc", clusterIP: "172.30.0.1" };

Deno.test("planServicePort() decides chains and verdicts as upstream's proxiers do", async (t) => {
  const cases: { name: string; svc: SvcSpec; eps: EpSpec[]; want: Partial<ServicePortPlan> }[] = [
    {
      name: "ClusterIP with a ready endpoint: cluster chain only",
      svc: base,
      eps: [{ ip: "10.0.0.1" }],
      want: {
        hasEndpoints: true,
        usesClusterPolicyChain: true,
        usesLocalPolicyChain: false,
        usesExternalChain: false,
        internalVerdict: null,
        externalVerdict: null,
      },
    },
    {
      name: "no endpoints at all: reject both ways, no chains",
      svc: { ...base, nodePort: 30001 },
      eps: [],
      want: {
        hasEndpoints: false,
        usesClusterPolicyChain: false,
        usesExternalChain: false,
        internalVerdict: "reject",
        externalVerdict: "reject",
      },
    },
    {
      name:
        "eTP=Local NodePort with endpoints only elsewhere: external drop, internal served, EXT chain kept",
      svc: { ...base, nodePort: 30001, eTPLocal: true },
      eps: [{ ip: "10.0.0.1" }],
      want: {
        externalPolicyLocal: true,
        hasExternalEndpoints: false,
        hasInternalEndpoints: true,
        usesExternalChain: true,
        externalUsesLocalChain: true,
        internalVerdict: null,
        externalVerdict: "drop",
      },
    },
    {
      name: "eTP=Local on a port that is not externally accessible does not apply",
      svc: { ...base, eTPLocal: true },
      eps: [{ ip: "10.0.0.1" }],
      want: { externalPolicyLocal: false, externalUsesLocalChain: false, externalVerdict: null },
    },
    {
      name: "iTP=Local without local endpoints: internal drop, local chain to nowhere",
      svc: { ...base, iTPLocal: true },
      eps: [{ ip: "10.0.0.1" }],
      want: {
        internalUsesLocalChain: true,
        usesLocalPolicyChain: false,
        hasInternalEndpoints: false,
        internalVerdict: "drop",
      },
    },
    {
      name: "iTP=Local with a local endpoint: the local chain serves ClusterIP traffic",
      svc: { ...base, iTPLocal: true },
      eps: [{ ip: "10.0.0.1", local: true }],
      want: { usesLocalPolicyChain: true, hasInternalEndpoints: true, internalVerdict: null },
    },
    {
      name: "LoadBalancer with source ranges and endpoints: firewall chain",
      svc: { ...base, nodePort: 30001, lbVIPs: ["1.2.3.4"], sourceRanges: ["203.0.113.0/25"] },
      eps: [{ ip: "10.0.0.1" }],
      want: { usesFirewallChain: true, usesExternalChain: true },
    },
    {
      name: "source ranges without endpoints: no firewall chain (rejected before)",
      svc: { ...base, nodePort: 30001, lbVIPs: ["1.2.3.4"], sourceRanges: ["203.0.113.0/25"] },
      eps: [],
      want: { usesFirewallChain: false, externalVerdict: "reject" },
    },
    {
      name: "only terminating serving endpoints still count (terminating fallback)",
      svc: base,
      eps: [{ ip: "10.0.0.1", ready: false, serving: true, terminating: true }],
      want: { hasEndpoints: true, usesClusterPolicyChain: true, internalVerdict: null },
    },
  ];
  for (const c of cases) {
    await t.step(c.name, () => {
      const got = plan(c.svc, c.eps);
      for (const [k, v] of Object.entries(c.want)) {
        assert.equal(got[k as keyof ServicePortPlan], v, k);
      }
    });
  }
});

Deno.test("planServicePort() is a pure function of info and selection", () => {
  const st = makeState({ ...base, nodePort: 30001 }, [{ ip: "10.0.0.1" }]);
  assert.deepEqual(planServicePort(st.info, st.selection), st.plan);
});

// ---- fixtures vs the proxier ----

/** The Service object a fixture spec describes. */
function serviceOf(s: SvcSpec): Service {
  const type = s.lbVIPs ? "LoadBalancer" : s.nodePort ? "NodePort" : "ClusterIP";
  return {
    metadata: { namespace: s.ns, name: s.name, resourceVersion: "1" },
    spec: {
      type,
      clusterIP: s.clusterIP,
      clusterIPs: [s.clusterIP],
      ports: [{
        name: s.port ?? "p80",
        port: s.portNum ?? 80,
        protocol: s.protocol ?? "TCP",
        nodePort: s.nodePort,
      }],
      externalIPs: s.externalIPs,
      loadBalancerSourceRanges: s.sourceRanges,
      sessionAffinity: s.affinity ? "ClientIP" : "None",
      sessionAffinityConfig: s.affinity ? { clientIP: { timeoutSeconds: s.affinity } } : undefined,
      externalTrafficPolicy: s.eTPLocal ? "Local" : "Cluster",
      internalTrafficPolicy: s.iTPLocal ? "Local" : "Cluster",
      healthCheckNodePort: s.hcnp,
    },
    status: s.lbVIPs ? { loadBalancer: { ingress: s.lbVIPs.map((ip) => ({ ip })) } } : undefined,
  };
}

/** The EndpointSlice a fixture's endpoints describe. */
function sliceOf(s: SvcSpec, eps: EpSpec[]): EndpointSlice {
  return {
    metadata: { namespace: s.ns, name: `${s.name}-1`, labels: { "kubernetes.io/service-name": s.name } },
    addressType: "IPv4",
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      conditions: {
        ready: e.ready ?? true,
        serving: e.serving ?? e.ready ?? true,
        terminating: e.terminating,
      },
      nodeName: e.local ? TEST_NODE : undefined,
    })),
    ports: [{ name: s.port ?? "p80", port: eps[0]?.port ?? 80, protocol: s.protocol ?? "TCP" }],
  };
}

/** Every field of the EndpointInfo contract, as a plain object. */
function plainEndpoint(e: EndpointInfo): Record<string, unknown> {
  return {
    ip: e.ip,
    port: e.port,
    endpoint: e.endpoint,
    isLocal: e.isLocal,
    ready: e.ready,
    serving: e.serving,
    terminating: e.terminating,
    zoneHints: e.zoneHints,
    nodeHints: e.nodeHints,
    nodeName: e.nodeName,
    zone: e.zone,
  };
}

function plainList(l: readonly EndpointInfo[] | null): Record<string, unknown>[] | null {
  return l === null ? null : l.map(plainEndpoint);
}

function plainSelection(s: EndpointSelection): Record<string, unknown> {
  return {
    clusterEndpoints: plainList(s.clusterEndpoints),
    localEndpoints: plainList(s.localEndpoints),
    allReachableEndpoints: plainList(s.allReachableEndpoints),
    hasAnyEndpoints: s.hasAnyEndpoints,
  };
}

Deno.test("a fixture state equals the state the proxier computes for the same objects", async () => {
  const specs: [SvcSpec, EpSpec[]][] = [
    [{ ns: "ns1", name: "svc1", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1" }]],
    [
      {
        ns: "ns2",
        name: "svc2",
        clusterIP: "172.30.0.42",
        nodePort: 3001,
        lbVIPs: ["1.2.3.4"],
        externalIPs: ["192.168.99.22"],
        eTPLocal: true,
        hcnp: 30000,
      },
      [{ ip: "10.180.0.2" }, { ip: "10.180.0.7", local: true }],
    ],
    [{ ns: "ns3", name: "svc3", clusterIP: "172.30.0.43", iTPLocal: true }, [{ ip: "10.180.0.3" }]],
    [
      {
        ns: "ns5",
        name: "svc5",
        clusterIP: "172.30.0.45",
        nodePort: 3002,
        lbVIPs: ["5.6.7.8"],
        affinity: 10800,
      },
      [{ ip: "10.180.0.3" }, { ip: "10.180.0.4", ready: false, serving: true, terminating: true }],
    ],
    [{ ns: "ns6", name: "svc6", clusterIP: "172.30.0.46" }, []],
  ];
  let last: ProxySnapshot | null = null;
  const dataplane: Dataplane = {
    family: "IPv4",
    sync(s): Promise<SyncResult> {
      last = s;
      return Promise.resolve({ full: true, payloadBytes: 0, generateMs: 0, applyMs: 0 });
    },
  };
  const clock = new FakeClock(0);
  const proxier = new Proxier({
    families: new Map([["IPv4", dataplane]]),
    nodeName: TEST_NODE,
    minSyncPeriodMs: 0,
    syncPeriodMs: 30_000,
    clock,
  });
  for (const [s, eps] of specs) {
    proxier.onServiceAdd(serviceOf(s));
    if (eps.length > 0) proxier.onEndpointSliceAdd(sliceOf(s, eps));
  }
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.advance(0);
  await proxier.stop();
  const snap = last as ProxySnapshot | null;
  assert.ok(snap, "the proxier synced");
  for (const [s, eps] of specs) {
    const want = makeState(s, eps);
    const got = snap.servicePorts.get(want.info.nameString);
    assert.ok(got, want.info.nameString);
    assert.deepEqual(got.info, want.info, `${want.info.nameString} info`);
    // Field by field: the proxier's endpoints are compact objects (getters), the fixture's plain ones.
    assert.deepEqual(
      plainList(got.endpoints),
      plainList(want.endpoints),
      `${want.info.nameString} endpoints`,
    );
    assert.deepEqual(
      plainSelection(got.selection),
      plainSelection(want.selection),
      `${want.info.nameString} selection`,
    );
    assert.deepEqual(got.plan, want.plan, `${want.info.nameString} plan`);
  }
  assert.equal(overallFixture().length, 6, "the shared corpus is built with the same code");
});
