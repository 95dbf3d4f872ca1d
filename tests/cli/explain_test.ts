/**
 * `kube-proxy explain` on every Service shape of the corpus, in every mode: exact text for a few packets, and
 * for all of them properties that tie the explanation to the model and to the rules render prints (every
 * name cited exists in the rules; DNAT exactly when endpoints are listed; probabilities add up; endpoints
 * belong to the Service; the verdict each mode gives each packet).
 */
import assert from "node:assert/strict";
import type { ProxyOptions } from "../../lib/config/command.ts";
import type { FirstSync } from "../../lib/cli/engine.ts";
import { explainPacket, type Explanation, formatExplanation, parsePacket } from "../../lib/cli/explain.ts";
import type { PacketOrigin } from "../../lib/cli/explain_common.ts";
import { configureLogging } from "../../lib/log.ts";
import { assertTracerAgrees } from "./tracer_agreement.ts";
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
  const ips = e.endpoints.map((x) => x.ip).join(",");
  return `dnat ${ips} ${e.masquerade!.masqueraded ? "masq" : "keep"}`;
}

for (const mode of MODES) {
  Deno.test(`explain (${mode}): every packet of the corpus gets its verdict, and the explanation holds together`, async () => {
    const { sync } = await corpus(mode);
    for (const c of CASES) {
      const e = await explain(mode, c.src, c.dst, c.from, c.protocol);
      const what = `${mode}: ${c.name}\n${formatExplanation(e)}`;
      assert.equal(summary(e), c.want[mode], what);
      // Every chain, map, set and virtual server cited is in the rules render prints.
      assert.deepEqual(e.unknownNames, [], what);
      assert.ok(e.steps.length > 0, what);
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
      assertTracerAgrees(sync, c, e, what, mode);
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

Path:
  1. nat PREROUTING -> KUBE-SERVICES: rule "dp/lbsr:p loadbalancer IP" (-d 172.30.1.4 --dport 80) jumps to
     KUBE-FW-E4EOB43T7Q5ETYMN.
  2. KUBE-FW-E4EOB43T7Q5ETYMN: the source 192.168.1.5 is not in loadBalancerSourceRanges (203.0.113.0/24); no
     rule matches, so the packet leaves the chain without DNAT.
  3. filter FORWARD -> KUBE-PROXY-FIREWALL: rule "dp/lbsr:p traffic not accepted by KUBE-FW-E4EOB43T7Q5ETYMN"
     DROPs it.

Verdict:    dropped: the source 192.168.1.5 is not in the Service's loadBalancerSourceRanges
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

Path:
  1. nat-prerouting -> services: "ip daddr @nodeport-ips" and @service-nodeports maps tcp . 30086 to goto
     external-Y4HXSDIL-dp/etp/tcp/p.
  2. external-Y4HXSDIL-dp/etp/tcp/p: externalTrafficPolicy Local: "goto local-Y4HXSDIL-dp/etp/tcp/p", this
     node's endpoints only.
  3. local-Y4HXSDIL-dp/etp/tcp/p: "meta l4proto tcp dnat to 10.244.0.2:8080", its only endpoint.

Verdict:    forwarded (DNAT): to 10.244.0.2:8080
Endpoints:
  10.244.0.2:8080    100%  local-Y4HXSDIL-dp/etp/tcp/p  (this node)
Masquerade: no - externalTrafficPolicy Local keeps the client's source IP
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

Path:
  1. nat OUTPUT -> KUBE-SERVICES: "-m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j
     KUBE-MARK-MASQ" matches 10.96.1.10,tcp:80 (the source 192.168.77.1 is not in 10.244.0.0/16).
  2. 10.96.1.10 is bound on kube-ipvs0: IPVS takes the node's own connection on its way out (LOCAL_OUT).
  3. IPVS virtual server "-t 10.96.1.10:80 -s rr -p 300" forwards to one of 3 real server(s) (masquerading
     forward, weight 1 each): round robin, each in turn (1/3 of new connections); a client keeps its real
     server while its persistence template lives (300 s).
  4. nat POSTROUTING -> KUBE-POSTROUTING: the packet carries the mark 0x00004000 and is masqueraded.

Verdict:    forwarded (DNAT): to one of 3 endpoints
Endpoints:
  10.244.0.2:8080   33.3%  real server 10.244.0.2:8080  (this node)
  10.244.0.3:8080   33.3%  real server 10.244.0.3:8080  (this node)
  10.244.1.2:8080   33.3%  real server 10.244.1.2:8080  (node node2)
Masquerade: yes - traffic from outside the pod network is masqueraded (the source 192.168.77.1 is not in
            10.244.0.0/16)
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
  assert.match(
    rejected.stdout,
    new RegExp(
      `filter-input -> nodeport-endpoints-check: @localhost-nodeport-reject-ports maps tcp \\. ${port} to goto\\s+` +
        "localhost-nodeport-reject-tcp, which counts it",
    ),
  );
  assert.match(rejected.stdout, /Verdict: +rejected: a NodePort on localhost, not served/);
  const served = await run(`--nodeport-addresses=127.0.0.0/8,${NODE_IP}/32`);
  assert.equal(served.code, 0, served.stderr);
  assert.match(served.stdout, /the agent's own listener on 127\.0\.0\.1:\d+/);
  assert.match(
    served.stdout,
    /Verdict: +not handled by kube-proxy: no rule matches; the agent's own localhost NodePort listener serves it/,
  );
});
