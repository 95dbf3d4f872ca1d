/**
 * Property test: for generated Services (every type, both traffic policies, affinity, externalIPs,
 * LoadBalancer source ranges, TCP and UDP) with generated endpoints (this node or another, ready, terminating
 * or dead; none at all), every packet explain is asked about in every mode (ClusterIP from a pod, from
 * the pod that is an endpoint, from the node and from outside; NodePort from outside and from the node; the
 * LoadBalancer IP from an allowed and a refused client; the external IP) ends where the Service's semantics
 * say (`service_oracle.ts`, from the model's endpoint selection, with the modes' known differences):
 * explain's verdict, endpoints, shares and masquerading are the packet tracer's walk through the rules
 * (nftables: the table; ipvs: with the ipsets and virtual servers) render prints, so this holds the rules of
 * every mode to the semantics.
 *
 * CI runs a fixed seed (DKP_PROPERTY_RUNS, default 25 runs; DKP_PROPERTY_SEED).
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { explainPacket, type Explanation, formatExplanation, parsePacket } from "../../lib/cli/explain.ts";
import { configureLogging } from "../../lib/log.ts";
import type { EndpointLite, ServiceSpecLite } from "../packets/helpers.ts";
import {
  ALLOWED_CLIENT,
  CLIENT,
  corpusSetup,
  corpusYaml,
  NODE,
  NODE_IP,
  OTHER,
  type Shape,
} from "./helpers.ts";
import { type Access, type Expected, expectedOutcome } from "./service_oracle.ts";

configureLogging({ sink: () => {} });

const SEED = Number(Deno.env.get("DKP_PROPERTY_SEED") ?? "20261205");
const RUNS = Number(Deno.env.get("DKP_PROPERTY_RUNS") ?? "25");

const LOCAL_PODS = ["10.244.0.2", "10.244.0.3", "10.244.0.4", "10.244.0.5"];
const REMOTE_PODS = ["10.244.1.2", "10.244.1.3", "10.244.1.4"];

const endpointArb: fc.Arbitrary<EndpointLite[]> = fc.uniqueArray(
  fc.record({
    ip: fc.constantFrom(...LOCAL_PODS, ...REMOTE_PODS),
    state: fc.constantFrom("ready", "ready", "terminating", "dead"),
  }),
  { selector: (e) => e.ip, maxLength: 5 },
).map((es) =>
  es.map((e) => ({
    ip: e.ip,
    node: LOCAL_PODS.includes(e.ip) ? NODE : OTHER,
    ready: e.state === "ready",
    terminating: e.state === "terminating",
  }))
);

function shapeArb(i: number): fc.Arbitrary<Shape> {
  return fc.record({
    type: fc.constantFrom("ClusterIP", "NodePort", "LoadBalancer") as fc.Arbitrary<ServiceSpecLite["type"]>,
    udp: fc.boolean(),
    affinity: fc.boolean(),
    externalIP: fc.boolean(),
    sourceRange: fc.boolean(),
    eTPLocal: fc.boolean(),
    iTPLocal: fc.boolean(),
    eps: endpointArb,
  }).map((g) => {
    const name = `s${i}`;
    const external = g.type !== "ClusterIP";
    return {
      name,
      svc: {
        name,
        clusterIP: `10.96.2.${i + 1}`,
        type: g.type,
        ports: [{ port: 80, protocol: g.udp ? "UDP" : "TCP", ...(external ? { nodePort: 30100 + i } : {}) }],
        ...(g.type === "LoadBalancer" ? { lbIPs: [`172.30.3.${i + 1}`] } : {}),
        ...(g.type === "LoadBalancer" && g.sourceRange ? { sourceRanges: ["203.0.113.0/24"] } : {}),
        ...(g.externalIP ? { externalIPs: [`172.30.4.${i + 1}`] } : {}),
        ...(g.affinity ? { affinitySeconds: 300 } : {}),
        ...(external && g.eTPLocal ? { eTPLocal: true } : {}),
        ...(g.iTPLocal ? { iTPLocal: true } : {}),
      },
      eps: g.eps,
    } as Shape;
  });
}

const casesArb = fc.integer({ min: 1, max: 4 }).chain((n) =>
  fc.tuple(...Array.from({ length: n }, (_, i) => shapeArb(i)))
);

/** A packet explain is asked about. */
interface Packet {
  readonly src: string;
  readonly dst: string;
  readonly from: "pod" | "node" | "outside";
  readonly protocol: string;
  readonly access: Access;
}

/** Every packet explain is asked about for one shape. */
function packets(s: Shape): Packet[] {
  const protocol = s.svc.ports![0].protocol === "UDP" ? "udp" : "tcp";
  const cip = `${s.svc.clusterIP}:80`;
  const out: Packet[] = [
    { src: "10.244.0.50", dst: cip, from: "pod", protocol, access: "clusterIP" },
    { src: NODE_IP, dst: cip, from: "node", protocol, access: "clusterIP" },
    { src: CLIENT, dst: cip, from: "outside", protocol, access: "clusterIP" },
  ];
  const ownEndpoint = s.eps.find((e) => e.node === NODE);
  if (ownEndpoint) out.push({ src: ownEndpoint.ip, dst: cip, from: "pod", protocol, access: "clusterIP" });
  const np = s.svc.ports![0].nodePort;
  if (np) {
    const dst = `${NODE_IP}:${np}`;
    out.push({ src: CLIENT, dst, from: "outside", protocol, access: "nodePort" });
    out.push({ src: NODE_IP, dst, from: "node", protocol, access: "nodePort" });
    out.push({ src: "10.244.0.50", dst, from: "pod", protocol, access: "nodePort" });
  }
  for (const ip of s.svc.lbIPs ?? []) {
    out.push({ src: ALLOWED_CLIENT, dst: `${ip}:80`, from: "outside", protocol, access: "loadBalancer" });
    out.push({ src: CLIENT, dst: `${ip}:80`, from: "outside", protocol, access: "loadBalancer" });
  }
  for (const ip of s.svc.externalIPs ?? []) {
    out.push({ src: CLIENT, dst: `${ip}:80`, from: "outside", protocol, access: "externalIP" });
    out.push({ src: "10.244.0.50", dst: `${ip}:80`, from: "pod", protocol, access: "externalIP" });
  }
  return out;
}

/** explain's answer in the oracle's terms (endpoints by IP). */
function outcomeOf(e: Explanation): Expected {
  if (e.verdict.kind !== "dnat") return { kind: e.verdict.kind };
  return { kind: "dnat", endpoints: e.endpoints.map((x) => ({ ip: x.ip, masqueraded: x.masqueraded })) };
}

function sorted(x: Expected): Expected {
  return x.kind === "dnat"
    ? { kind: "dnat", endpoints: [...x.endpoints].sort((a, b) => a.ip.localeCompare(b.ip)) }
    : x;
}

for (const mode of ["iptables", "nftables", "ipvs"] as const) {
  Deno.test(`explain (${mode}): the rules take every packet where the Service's semantics say, on generated Services (seed ${SEED}, ${RUNS} runs)`, async () => {
    const { opts } = await corpusSetup(mode);
    let checked = 0;
    await fc.assert(
      fc.asyncProperty(casesArb, async (shapes) => {
        const { sync } = await corpusSetup(mode, corpusYaml(shapes));
        for (const s of shapes) {
          for (const p of packets(s)) {
            const e = explainPacket(
              parsePacket({
                source: p.src,
                destination: p.dst,
                protocol: p.protocol!,
                from: p.from,
                inInterface: "",
              }),
              sync,
              opts,
            );
            const st = sync.snapshots.get("IPv4")!.servicePorts.get(`dp/${s.name}:p`)!;
            const what = `${JSON.stringify(s)}\n${JSON.stringify(p)}\n${formatExplanation(e)}`;
            assert.deepEqual(
              sorted(outcomeOf(e)),
              sorted(expectedOutcome(mode, st, p.access, p.src, p.from)),
              what,
            );
            // Every endpoint gets an equal share of new connections (iptables' statistic rules, nftables'
            // numgen, IPVS rr), as the tracer walks them.
            for (const x of e.endpoints) {
              assert.ok(Math.abs(x.probability! - 1 / e.endpoints.length) < 1e-6, what);
            }
            checked++;
          }
        }
      }),
      { seed: SEED, numRuns: RUNS },
    );
    assert.ok(checked >= RUNS, `${checked} packets checked`);
  });
}
