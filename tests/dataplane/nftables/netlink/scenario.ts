/**
 * The sequence of syncs the netlink tests run: every shape of service port the renderer writes, for one family,
 * in three rounds (endpoints change, Services come and go, an affinity timeout changes), and the dataplane
 * that syncs them.
 * @module
 */
import { NftablesDataplane } from "../../../../lib/dataplane/nftables/dataplane.ts";
import type { Nftables } from "../../../../lib/dataplane/nftables/interface.ts";
import type { IPFamily, ProxySnapshot, ServicePortState } from "../../../../lib/proxy/types.ts";
import { type EpSpec, makeState, snapshot, type SvcSpec } from "../../../../testkit/fixtures.ts";
import type { NetnsRunner } from "../helpers.ts";

/** Every shape of service port the renderer writes, for one family. */
export function shapes(v6: boolean, round: number): ServicePortState[] {
  const ip = (i: number) => v6 ? `fd00:96::${i.toString(16)}` : `172.30.0.${i}`;
  const pod = (i: number) => v6 ? `fd00:10:244::${i.toString(16)}` : `10.244.0.${i}`;
  const eps = (n: number, from = 1, extra: Partial<EpSpec> = {}): EpSpec[] =>
    Array.from({ length: n }, (_, k) => ({ ip: pod(from + k), port: 8080, ...extra }));
  const s = (spec: Omit<SvcSpec, "ns" | "clusterIP">, i: number, e: EpSpec[]) =>
    makeState({ ns: "nl", clusterIP: ip(i), ...spec }, e);
  // Round 0 → 1 → 2: every Service's endpoints move in round 1 (and back), Services come and go, an affinity
  // timeout changes; "empty" gains an endpoint and "local" loses its local one in round 1.
  const d = round === 1 ? 100 : 0;
  const out = [
    s({ name: "one" }, 1, eps(round === 1 ? 1 : 2, 1 + d)),
    s({ name: "many", nodePort: 30100 }, 2, eps(3 + round, 10 + d)),
    s({ name: "udp", protocol: "UDP", port: "dns", portNum: 53 }, 3, eps(2, 20 + d)),
    s({ name: "sctp", protocol: "SCTP" }, 4, eps(2, 25 + d)),
    s({ name: "sticky", affinity: round === 2 ? 600 : 300 }, 5, eps(3 - (round === 1 ? 1 : 0), 30 + d)),
    s({ name: "empty", nodePort: 30101 }, 6, round === 1 ? eps(1, 35) : []),
    s({ name: "local", nodePort: 30102, eTPLocal: true, hcnp: 32000 }, 7, [
      ...(round === 1 ? [] : [{ ip: pod(40), port: 8080, local: true }]),
      { ip: pod(41 + d), port: 8080 },
    ]),
    s({ name: "nolocal", nodePort: 30103, eTPLocal: true }, 8, eps(2, 45 + d)),
    s({ name: "extip", externalIPs: [v6 ? "fd00:30::5" : "172.31.0.5"] }, 9, eps(1, 50 + d)),
    s({ name: "lb", lbVIPs: [v6 ? "fd00:40::1" : "192.0.2.10"], nodePort: 30104 }, 10, eps(2, 55 + d)),
    s({ name: "terminating" }, 11, eps(2, 60 + d, { ready: false, serving: true, terminating: true })),
    // loadBalancerSourceRanges: overlapping, adjacent and single-address ranges; ranges from the first and to
    // the last address.
    s(
      { name: "lbsr", lbVIPs: [v6 ? "fd00:40::2" : "192.0.2.11"], sourceRanges: sourceRanges(v6, round) },
      13,
      eps(2, 65),
    ),
  ];
  if (round >= 1) out.push(s({ name: "added", nodePort: 30105 }, 12, eps(4, 70)));
  if (round === 2) out.splice(1, 1); // "many" goes
  return out;
}

function sourceRanges(v6: boolean, round: number): string[] {
  if (round === 1) {
    return v6
      ? ["2001:db8::/64", "fd00::/9", "fd80::/9", "2001:db8:1::5", "2001:db8::/48"]
      : ["203.0.113.0/24", "10.0.0.0/9", "10.128.0.0/9", "10.1.2.3", "203.0.0.0/16"];
  }
  if (round === 2) return v6 ? ["::/1", "ffff::/16"] : ["0.0.0.0/1", "255.255.255.0/24", "10.0.0.0/8"];
  return v6 ? ["2001:db8::/32"] : ["198.51.100.0/24"];
}

export function dataplane(runner: NetnsRunner, family: IPFamily, nftables?: Nftables): NftablesDataplane {
  return new NftablesDataplane({
    family,
    runner,
    localTraffic: { kind: "cidr", cidr: family === "IPv6" ? "fd00:10:244::/56" : "10.244.0.0/16" },
    nodePortAddresses: ["primary"],
    nodeAddresses: [family === "IPv6" ? "fd00:77::1" : "192.168.0.2"],
    // The first full sync writes runs of 4 new ports ahead of its own transaction (13 ports: three runs).
    precreatePorts: 4,
    ...(nftables ? { nftables } : {}),
  });
}

const ALL = [
  "one",
  "many",
  "udp",
  "sctp",
  "sticky",
  "empty",
  "local",
  "nolocal",
  "extip",
  "lb",
  "terminating",
  "lbsr",
  "added",
].map((n) => `nl/${n}`);

/** The syncs in order: a full sync of round 0, then partial syncs of every Service. */
export const ROUNDS: readonly [round: number, changed: string[] | null][] = [[0, null], [1, ALL], [2, ALL], [
  0,
  ALL,
]];

/** The snapshot of sync `k` of {@linkcode ROUNDS}. */
export function roundSnapshot(family: IPFamily, k: number): ProxySnapshot {
  const v6 = family === "IPv6";
  const [round, changed] = ROUNDS[k];
  return snapshot(shapes(v6, round), { family, changed, nodeIPs: [v6 ? "fd00:77::1" : "192.168.0.2"] });
}
