/**
 * `kube-proxy explain` on every Service shape of the corpus, in every mode: exact text for a few packets, and
 * for all of them the verdict each mode gives each packet (a table written by hand: explain's verdict is the
 * packet tracer's walk through the rules render prints, so this pins what the rules do) and properties that
 * tie the explanation to the model (DNAT exactly when endpoints are listed; shares add up; endpoints belong to
 * the Service; only the source's own endpoint differs in masquerading).
 */
import assert from "node:assert/strict";
import type { ProxyOptions } from "../../lib/config/command.ts";
import type { FirstSync } from "../../lib/cli/engine.ts";
import { explainPacket, type Explanation, formatExplanation, parsePacket } from "../../lib/cli/explain.ts";
import type { PacketOrigin } from "../../lib/cli/explain_common.ts";
import { configureLogging } from "../../lib/log.ts";
import {
  ALLOWED_CLIENT,
  CLIENT,
  CORPUS_FLAGS,
  corpusSetup,
  corpusYaml,
  NODE_IP,
  POD,
  POD6,
  runCli,
  type Shape,
  SHAPES,
} from "./helpers.ts";

configureLogging({ sink: () => {} });

const MODES = ["iptables", "nftables", "ipvs"] as const;
type Mode = typeof MODES[number];

const SERVICE_CIDR = "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\n" +
  "spec: {cidrs: [10.96.0.0/16, fd00:96::/112]}\n";

function setup(mode: Mode): Promise<{ opts: ProxyOptions; sync: FirstSync }> {
  return corpusSetup(mode, corpusYaml() + "---\n" + SERVICE_CIDR);
}

const cache = new Map<Mode, Promise<{ opts: ProxyOptions; sync: FirstSync }>>();
function corpus(mode: Mode) {
  if (!cache.has(mode)) cache.set(mode, setup(mode));
  return cache.get(mode)!;
}

async function explain(mode: Mode, src: string, dst: string, from: PacketOrigin, protocol = "tcp") {
  const { opts, sync } = await corpus(mode);
  return explainPacket(
    parsePacket({ source: src, destination: dst, protocol, from: from ?? "", inInterface: "" }),
    sync,
    opts,
  );
}

/** One packet of the table and the verdict each mode gives it, with the endpoint IPs it can reach. */
interface Case {
  readonly name: string;
  readonly shape?: string;
  readonly src: string;
  readonly dst: string;
  readonly from: PacketOrigin;
  readonly protocol?: string;
  readonly want: Record<Mode, string>;
}

const shape = (n: string): Shape => SHAPES.find((s) => s.name === n)!;
const cip = (n: string, port = 80) => `${shape(n).svc.clusterIP}:${port}`;
const np = (n: string) => `${NODE_IP}:${shape(n).svc.ports![0].nodePort}`;
const all = (v: string): Record<Mode, string> => ({ iptables: v, nftables: v, ipvs: v });
const A = POD.a, B = POD.b, C = POD.c, X = POD.x;

/** `dnat a,c masq` = DNAT to those endpoints, masqueraded; `dnat a keep` = not masqueraded. */
const CASES: readonly Case[] = [
  {
    name: "ClusterIP from a pod",
    shape: "clusterip",
    src: X,
    dst: cip("clusterip"),
    from: "pod",
    want: all(`dnat ${A},${C} keep`),
  },
  {
    name: "ClusterIP from the node",
    shape: "clusterip",
    src: NODE_IP,
    dst: cip("clusterip"),
    from: "node",
    want: all(`dnat ${A},${C} masq`),
  },
  {
    name: "ClusterIP from outside",
    shape: "clusterip",
    src: CLIENT,
    dst: cip("clusterip"),
    from: "outside",
    want: all(`dnat ${A},${C} masq`),
  },
  {
    name: "NodePort from outside",
    shape: "nodeport",
    src: CLIENT,
    dst: np("nodeport"),
    from: "outside",
    want: all(`dnat ${A},${B} masq`),
  },
  {
    name: "NodePort from a pod",
    shape: "nodeport",
    src: X,
    dst: np("nodeport"),
    from: "pod",
    want: all(`dnat ${A},${B} masq`),
  },
  {
    name: "LoadBalancer IP from outside",
    shape: "lb",
    src: CLIENT,
    dst: "172.30.1.3:80",
    from: "outside",
    want: all(`dnat ${A},${C} masq`),
  },
  {
    name: "LoadBalancer NodePort from outside",
    shape: "lb",
    src: CLIENT,
    dst: np("lb"),
    from: "outside",
    want: all(`dnat ${A},${C} masq`),
  },
  {
    name: "source range: a client outside it",
    shape: "lbsr",
    src: CLIENT,
    dst: "172.30.1.4:80",
    from: "outside",
    want: all("drop"),
  },
  {
    name: "source range: a client inside it",
    shape: "lbsr",
    src: ALLOWED_CLIENT,
    dst: "172.30.1.4:80",
    from: "outside",
    want: all(`dnat ${A} masq`),
  },
  {
    name: "externalIP from outside",
    shape: "extip",
    src: CLIENT,
    dst: "172.30.2.5:80",
    from: "outside",
    want: all(`dnat ${C} masq`),
  },
  {
    name: "eTP Local NodePort from outside",
    shape: "etp",
    src: CLIENT,
    dst: np("etp"),
    from: "outside",
    want: all(`dnat ${A} keep`),
  },
  {
    name: "eTP Local NodePort from a pod",
    shape: "etp",
    src: X,
    dst: np("etp"),
    from: "pod",
    want: { iptables: `dnat ${A},${C} keep`, nftables: `dnat ${A},${C} keep`, ipvs: `dnat ${A} keep` },
  },
  {
    name: "eTP Local NodePort from the node",
    shape: "etp",
    src: NODE_IP,
    dst: np("etp"),
    from: "node",
    want: { iptables: `dnat ${A},${C} masq`, nftables: `dnat ${A},${C} masq`, ipvs: `dnat ${A} keep` },
  },
  {
    name: "eTP Local without local endpoints from outside",
    shape: "etp-nolocal",
    src: CLIENT,
    dst: np("etp-nolocal"),
    from: "outside",
    want: { iptables: "drop", nftables: "drop", ipvs: `dnat ${C} keep` },
  },
  {
    name: "iTP Local from a pod",
    shape: "itp",
    src: X,
    dst: cip("itp"),
    from: "pod",
    want: all(`dnat ${B} keep`),
  },
  {
    name: "iTP Local without local endpoints",
    shape: "itp-nolocal",
    src: X,
    dst: cip("itp-nolocal"),
    from: "pod",
    want: { iptables: "drop", nftables: "drop", ipvs: "reject" },
  },
  {
    name: "affinity",
    shape: "sticky",
    src: X,
    dst: cip("sticky"),
    from: "pod",
    want: all(`dnat ${A},${B},${C} keep`),
  },
  { name: "no endpoints", shape: "empty", src: X, dst: cip("empty"), from: "pod", want: all("reject") },
  {
    name: "terminating endpoints only",
    shape: "terminating",
    src: X,
    dst: cip("terminating"),
    from: "pod",
    want: all(`dnat ${A},${C} keep`),
  },
  {
    name: "UDP",
    shape: "udp",
    src: X,
    dst: cip("udp", 53),
    from: "pod",
    protocol: "udp",
    want: all(`dnat ${A} keep`),
  },
  {
    name: "dual-stack, IPv4",
    shape: "dual",
    src: X,
    dst: cip("dual"),
    from: "pod",
    want: all(`dnat ${A} keep`),
  },
  {
    name: "dual-stack, IPv6",
    shape: "dual",
    src: POD6.x,
    dst: "[fd00:96::14]:80",
    from: "pod",
    want: all(`dnat ${POD6.a} keep`),
  },
  {
    name: "LoadBalancer eTP Local from outside",
    shape: "lb-local",
    src: CLIENT,
    dst: "172.30.1.15:80",
    from: "outside",
    want: all(`dnat ${A} keep`),
  },
  {
    name: "another port of a ClusterIP",
    src: X,
    dst: cip("clusterip", 81),
    from: "pod",
    want: { iptables: "untouched", nftables: "reject", ipvs: "reject" },
  },
  {
    name: "an unallocated ClusterIP",
    src: X,
    dst: "10.96.200.200:80",
    from: "pod",
    want: { iptables: "untouched", nftables: "drop", ipvs: "untouched" },
  },
  { name: "not a Service", src: X, dst: "8.8.8.8:53", from: "pod", protocol: "udp", want: all("untouched") },
  {
    name: "UDP to a TCP Service's port",
    src: X,
    dst: cip("clusterip"),
    from: "pod",
    protocol: "udp",
    want: { iptables: "untouched", nftables: "reject", ipvs: "reject" },
  },
];

function summary(e: Explanation): string {
  if (e.verdict.kind !== "dnat") return e.verdict.kind;
  const ips = e.endpoints.map((x) => x.ip).sort().join(",");
  return `dnat ${ips} ${e.masquerade!.masqueraded ? "masq" : "keep"}`;
}

for (const mode of MODES) {
  Deno.test(`explain (${mode}): every packet of the corpus gets its verdict, and the explanation holds together`, async () => {
    const { sync } = await corpus(mode);
    for (const c of CASES) {
      const e = await explain(mode, c.src, c.dst, c.from, c.protocol);
      const what = `${mode}: ${c.name}\n${formatExplanation(e)}`;
      assert.equal(summary(e), c.want[mode], what);
      assert.ok(e.path.prefix.length + e.path.branches.length > 0, what);
      // DNAT exactly when endpoints are listed, and then masquerading is decided.
      assert.equal(e.verdict.kind === "dnat", e.endpoints.length > 0, what);
      assert.equal(e.masquerade !== null, e.verdict.kind === "dnat", what);
      const ps = e.endpoints.map((x) => x.probability);
      if (ps.length > 0 && ps.every((p) => p !== null)) {
        assert.ok(Math.abs(ps.reduce((a, b) => a! + b!, 0)! - 1) < 1e-9, what);
      }
      if (c.shape !== undefined) {
        const s = shape(c.shape);
        const family = c.dst.startsWith("[") ? "IPv6" : "IPv4";
        assert.equal(e.service, `dp/${c.shape}:p`, what);
        // The endpoints are the Service's, as selected in the snapshot the rules were rendered from.
        const st = sync.snapshots.get(family)!.servicePorts.get(`dp/${c.shape}:p`)!;
        for (const x of e.endpoints) assert.ok(st.endpoints.some((ep) => ep.endpoint === x.endpoint), what);
        assert.ok(e.endpoints.every((x) => [...s.eps, ...(s.eps6 ?? [])].some((ep) => ep.ip === x.ip)), what);
        assert.equal(
          e.affinity,
          s.svc.affinitySeconds
            ? (mode === "ipvs" ? "ClientIP, 300 s (IPVS persistence)" : "ClientIP, 300 s")
            : "none",
          what,
        );
      } else {
        assert.equal(e.service, null, what);
      }
      // Only a packet that lands on its own source (hairpin) is masqueraded otherwise than the rest.
      for (const x of e.endpoints) {
        assert.equal(x.masqueraded, e.masquerade!.masqueraded || x.hairpin, what);
      }
    }
  });
}

Deno.test("explain: terminating endpoints and the ipvs Local fallback are called out", async () => {
  const t = await explain("nftables", X, cip("terminating"), "pod");
  assert.ok(t.notes.some((n) => n.includes("terminating (still serving)")), t.notes.join("\n"));
  const f = await explain("ipvs", CLIENT, np("etp-nolocal"), "outside");
  assert.ok(f.notes.some((n) => n.includes("kubernetes#97081")), f.notes.join("\n"));
});

Deno.test("explain (iptables): a LoadBalancer client outside the source ranges, exact text", async () => {
  const r = await runCli([
    "explain",
    "-f",
    "-",
    ...CORPUS_FLAGS,
    "--source",
    CLIENT,
    "--destination",
    "172.30.1.4:80",
  ], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  assert.equal(
    r.stdout,
    `Packet:     TCP 192.168.1.5 -> 172.30.1.4:80 (IPv4), from outside node1 (the source 192.168.1.5 is neither a
            node address nor local traffic)
Service:    dp/lbsr:p, LoadBalancer IP 172.30.1.4:80/TCP
Mode:       iptables

Path (traced through the rules the agent writes):
  1. nat PREROUTING #1: -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
  2. nat KUBE-SERVICES #13: -m comment --comment "dp/lbsr:p loadbalancer IP" -m tcp -p tcp -d 172.30.1.4
     --dport 80 -j KUBE-FW-E4EOB43T7Q5ETYMN
  3. nat KUBE-FW-E4EOB43T7Q5ETYMN #2: -m comment --comment "other traffic to dp/lbsr:p will be dropped by
     KUBE-PROXY-FIREWALL"
  4. filter FORWARD #1: -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j
     KUBE-PROXY-FIREWALL
  5. filter KUBE-PROXY-FIREWALL #1: -m comment --comment "dp/lbsr:p traffic not accepted by
     KUBE-FW-E4EOB43T7Q5ETYMN" -m tcp -p tcp -d 172.30.1.4 --dport 80 -j DROP

Verdict:    dropped: by filter KUBE-PROXY-FIREWALL #1 ("dp/lbsr:p traffic not accepted by
            KUBE-FW-E4EOB43T7Q5ETYMN")
Affinity:   none
`,
  );
});

Deno.test("explain (nftables): an eTP Local NodePort from outside keeps the client IP, exact text", async () => {
  const r = await runCli([
    "explain",
    "-f",
    "-",
    ...CORPUS_FLAGS,
    "--proxy-mode=nftables",
    "--source",
    CLIENT,
    "--destination",
    np("etp"),
  ], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  assert.equal(
    r.stdout,
    `Packet:     TCP 192.168.1.5 -> 192.168.77.1:30086 (IPv4), from outside node1 (the source 192.168.1.5 is
            neither a node address nor local traffic)
Service:    dp/etp:p, NodePort 192.168.77.1:30086/TCP
Mode:       nftables

Path (traced through the rules the agent writes):
  1. filter-prerouting-pre-dnat #1: ct state new jump firewall-check
  2. nat-prerouting #1: jump services
  3. services #3: ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports
  4. external-Y4HXSDIL-dp/etp/tcp/p #4: goto local-Y4HXSDIL-dp/etp/tcp/p
  5. local-Y4HXSDIL-dp/etp/tcp/p #1: meta l4proto tcp dnat to 10.244.0.2:8080
  6. filter-forward #1: ct state new jump service-endpoints-check
  7. filter-forward #2: ct state new jump cluster-ips-check
  8. nat-postrouting #1: jump masquerading

Verdict:    forwarded (DNAT): to 10.244.0.2:8080
Endpoints:
  10.244.0.2:8080    100%  local-Y4HXSDIL-dp/etp/tcp/p  (this node)
Masquerade: no - no rule on its path marks it for masquerading: the endpoint sees the client's address
Affinity:   none
`,
  );
});

Deno.test("explain (ipvs): sticky ClusterIP from the node, exact text", async () => {
  const r = await runCli([
    "explain",
    "-f",
    "-",
    ...CORPUS_FLAGS,
    "--proxy-mode=ipvs",
    "--from=node",
    "--destination",
    cip("sticky"),
  ], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  assert.equal(
    r.stdout,
    `Packet:     TCP 192.168.77.1 -> 10.96.1.10:80 (IPv4), from node1 itself
Service:    dp/sticky:p, ClusterIP 10.96.1.10:80/TCP
Mode:       ipvs

Path (traced through the rules the agent writes):
  1. nat OUTPUT #1: -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
  2. nat KUBE-SERVICES #3: -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose"
     -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ
  3. nat KUBE-MARK-MASQ #1: -j MARK --or-mark 0x00004000
  4. nat KUBE-SERVICES #8: -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
  5. IPVS virtual server -A -t 10.96.1.10:80 -s rr -p 300: IPVS picks a real server
  6. nat POSTROUTING #1: -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
  7. nat KUBE-POSTROUTING #3: -j MARK --xor-mark 0x00004000
  8. nat KUBE-POSTROUTING #4: -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
     --random-fully

Verdict:    forwarded (DNAT): to one of 3 endpoints
Endpoints:
  10.244.0.2:8080   33.3%  real server 10.244.0.2:8080  (this node)
  10.244.0.3:8080   33.3%  real server 10.244.0.3:8080  (this node)
  10.244.1.2:8080   33.3%  real server 10.244.1.2:8080  (node node2)
Masquerade: yes - marked by nat KUBE-SERVICES #3 ("Kubernetes service cluster ip + port for masquerade
            purpose")
Affinity:   ClientIP, 300 s (IPVS persistence)
Note:       a connection from the node to an address on kube-ipvs0 gets that address as its source unless the
            program picks one
`,
  );
});

Deno.test("explain: the packet flags are checked, and where the packet enters is inferred when not given", async () => {
  const bad = async (args: string[], re: RegExp) => {
    const r = await runCli(["explain", "-f", "-", ...CORPUS_FLAGS, ...args], corpusYaml());
    assert.equal(r.code, 2, r.stdout);
    assert.match(r.stderr, re);
  };
  await bad(["--source", X], /--destination IP:PORT is required/);
  await bad(["--destination", "10.96.1.1"], /--destination must be IP:PORT or \[IPv6\]:PORT/);
  await bad(["--destination", "10.96.1.1:80"], /--source is required/);
  await bad(
    ["--source", X, "--destination", "10.96.1.1:80", "--protocol", "icmp"],
    /--protocol must be tcp, udp or sctp/,
  );
  await bad(["--source", "fd00::1", "--destination", "10.96.1.1:80"], /of different IP families/);
  await bad(
    ["--source", X, "--destination", "10.96.1.1:80", "--from", "mars"],
    /--from must be pod, node or outside/,
  );
  const pod = await explain("iptables", X, cip("clusterip"), null as unknown as PacketOrigin);
  assert.match(pod.origin, /^from a pod on node1 \(the source 10\.244\.0\.50 is local traffic/);
  const node = await explain("iptables", NODE_IP, cip("clusterip"), null as unknown as PacketOrigin);
  assert.match(node.origin, /^from node1 itself/);
  const out = await explain("iptables", CLIENT, cip("clusterip"), null as unknown as PacketOrigin);
  assert.match(out.origin, /^from outside node1/);
});

Deno.test("explain (nftables): a NodePort on localhost with KubeProxyNFTablesLocalhostNodePorts is rejected and counted, or taken by the agent's listener", async () => {
  const port = np("nodeport").split(":")[1];
  const run = (...flags: string[]) =>
    runCli([
      "explain",
      "-f",
      "-",
      ...CORPUS_FLAGS,
      "--proxy-mode=nftables",
      "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
      ...flags,
      "--source",
      "127.0.0.1",
      "--destination",
      `127.0.0.1:${port}`,
    ], corpusYaml());
  const rejected = await run();
  assert.equal(rejected.code, 0, rejected.stderr);
  // The tracer's path: filter-input's check maps the port on loopback to the chain that counts and rejects.
  assert.match(
    rejected.stdout,
    /nodeport-endpoints-check #\d+: ip daddr 127\.0\.0\.0\/8 meta l4proto \. th dport vmap\s+@localhost-nodeport-reject-ports/,
  );
  assert.match(
    rejected.stdout,
    /localhost-nodeport-reject-tcp #1: counter name "localhost-nodeport-rejected-tcp" reject/,
  );
  assert.match(rejected.stdout, /Verdict: +rejected: by localhost-nodeport-reject-tcp #1/);
  const served = await run(`--nodeport-addresses=127.0.0.0/8,${NODE_IP}/32`);
  assert.equal(served.code, 0, served.stderr);
  assert.match(
    served.stdout,
    /Verdict: +not handled by kube-proxy: no rule takes it; the agent's own localhost NodePort listener on\s+127\.0\.0\.1:\d+ serves it/,
  );
  assert.doesNotMatch(served.stdout, /localhost-nodeport-reject/);
});
