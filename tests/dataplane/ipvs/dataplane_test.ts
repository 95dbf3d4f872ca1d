/**
 * IpvsDataplane with a fake kernel (recording runner): the exact ipvsadm / ipset / ip batches and iptables
 * payloads per Service shape (expectations from upstream's pkg/proxy/ipvs/proxier_test.go where it has them),
 * partial syncs that write only what changed, full resyncs that repair the kernel, graceful termination.
 */
import assert from "node:assert/strict";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables_local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { commandLines, fakeKernel, inputs, ipvsDataplane, kernelRunner } from "./helpers.ts";

configureLogging({ sink: () => {} });

const NODE = ["100.101.102.103"];
const svcNP = (eps = [{ ip: "10.180.0.1" }]) =>
  makeState({ ns: "ns1", name: "svc1", clusterIP: "10.20.30.41", nodePort: 3001 }, eps);

Deno.test("first sync reads the kernel once, then one ipset, one ipvsadm, one iptables and one ip batch", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const res = await dp.sync(snapshot([svcNP()], { nodeIPs: NODE }));
  assert.equal(res.full, true);
  assert.deepEqual(commandLines(r), [
    "ip -j addr show",
    "ipvsadm -S -n",
    "ipset save",
    "iptables-save -t nat",
    "iptables-save -t filter",
    "ipset restore",
    "ipvsadm -R",
    "iptables-restore --noflush --counters -w 5 -W 100000",
    "ip -force -batch -",
  ]);
  const bytes = r.calls.filter((c) => c.stdin !== "").reduce((n, c) => n + c.stdin.length, 0);
  assert.equal(res.payloadBytes, bytes);
});

Deno.test("NodePort with one endpoint: virtual servers on the ClusterIP and the node IP (upstream TestNodePortIPv4)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  await dp.sync(snapshot([svcNP()], { nodeIPs: NODE }));
  assert.equal(
    inputs(r, "ipvsadm", "-R")[0],
    "-A -t 10.20.30.41:80 -s rr\n" +
      "-a -t 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1\n" +
      "-A -t 100.101.102.103:3001 -s rr\n" +
      "-a -t 100.101.102.103:3001 -r 10.180.0.1:80 -m -w 1\n",
  );
  const ipset = inputs(r, "ipset", "restore")[0];
  assert.equal(ipset.split("\n").filter((l) => l.startsWith("create")).length, 17);
  assert.ok(ipset.includes("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist\n"));
  assert.ok(
    ipset.includes("create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist\n"),
  );
  assert.ok(ipset.includes("create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536 -exist\n"));
  assert.equal(
    ipset.split("\n").filter((l) => l.startsWith("add")).join("\n"),
    "add KUBE-CLUSTER-IP 10.20.30.41,tcp:80 -exist\n" +
      "add KUBE-NODE-PORT-TCP 3001 -exist\n" +
      "add KUBE-IPVS-IPS 10.20.30.41 -exist",
  );
  assert.equal(
    inputs(r, "ip", "-force")[0],
    "link add kube-ipvs0 type dummy\naddr replace 10.20.30.41/32 dev kube-ipvs0\n",
  );
});

/** The nat/filter rules of a payload without chain lines and jumps, by chain. */
function rulesOf(payload: string, chain: string): string[] {
  return payload.split("\n").filter((l) => l.startsWith(`-A ${chain} `));
}

Deno.test("iptables payload of a NodePort service without a local detector (upstream's no-op detector: src,dst)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  await dp.sync(snapshot([svcNP()], { nodeIPs: NODE }));
  const p = inputs(r, "iptables-restore")[0];
  assert.deepEqual(rulesOf(p, "KUBE-SERVICES"), [
    "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN",
    '-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ',
    "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
    "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
  ]);
  assert.deepEqual(rulesOf(p, "KUBE-NODE-PORT"), [
    '-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ',
    '-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT',
  ]);
});

const GOLDEN_LB = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m comment --comment "Kubernetes service lb portal" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-LOAD-BALANCER -m comment --comment "Kubernetes service load balancer ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN
-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
*filter
:KUBE-FORWARD - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A KUBE-PROXY-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port for load balancer with sourceRange" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A KUBE-NODE-PORT -m comment --comment "Kubernetes health check node port" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT 1 -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT
-I INPUT 1 -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-I FORWARD 1 -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL
-I INPUT 1 -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-I OUTPUT 1 -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER
COMMIT
`;

const lbLocal = () =>
  makeState({
    ns: "ns1",
    name: "lb",
    clusterIP: "10.20.30.42",
    lbVIPs: ["1.2.3.4"],
    sourceRanges: ["10.0.0.0/8"],
    eTPLocal: true,
    nodePort: 3002,
    hcnp: 30000,
    affinity: 10800,
  }, [{ ip: "10.180.0.3", local: true }, { ip: "10.180.1.1" }]);

Deno.test("LoadBalancer eTP=Local with source ranges and affinity: golden iptables payload, sets, virtual servers", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r, { localDetector: detectLocalByCIDR("10.0.0.0/8") });
  await dp.sync(snapshot([lbLocal()], { nodeIPs: NODE }));
  assert.equal(inputs(r, "iptables-restore")[0], GOLDEN_LB);
  // Local policy: only the local endpoint behind the LB and NodePort; the ClusterIP uses both. Persistence.
  assert.equal(
    inputs(r, "ipvsadm", "-R")[0],
    "-A -t 10.20.30.42:80 -s rr -p 10800\n" +
      "-a -t 10.20.30.42:80 -r 10.180.0.3:80 -m -w 1\n" +
      "-a -t 10.20.30.42:80 -r 10.180.1.1:80 -m -w 1\n" +
      "-A -t 1.2.3.4:80 -s rr -p 10800\n" +
      "-a -t 1.2.3.4:80 -r 10.180.0.3:80 -m -w 1\n" +
      "-A -t 100.101.102.103:3002 -s rr -p 10800\n" +
      "-a -t 100.101.102.103:3002 -r 10.180.0.3:80 -m -w 1\n",
  );
  assert.equal(
    inputs(r, "ipset", "restore")[0].split("\n").filter((l) => l.startsWith("add")).join("\n"),
    [
      "add KUBE-LOOP-BACK 10.180.0.3,tcp:80,10.180.0.3 -exist",
      "add KUBE-CLUSTER-IP 10.20.30.42,tcp:80 -exist",
      "add KUBE-LOAD-BALANCER 1.2.3.4,tcp:80 -exist",
      "add KUBE-LOAD-BALANCER-FW 1.2.3.4,tcp:80 -exist",
      "add KUBE-LOAD-BALANCER-LOCAL 1.2.3.4,tcp:80 -exist",
      "add KUBE-LOAD-BALANCER-SOURCE-CIDR 1.2.3.4,tcp:80,10.0.0.0/8 -exist",
      "add KUBE-NODE-PORT-TCP 3002 -exist",
      "add KUBE-NODE-PORT-LOCAL-TCP 3002 -exist",
      "add KUBE-HEALTH-CHECK-NODE-PORT 30000 -exist",
      "add KUBE-IPVS-IPS 10.20.30.42 -exist",
      "add KUBE-IPVS-IPS 1.2.3.4 -exist",
    ].join("\n"),
  );
});

Deno.test("a source range holding the node IP allows the LB IP as source (KUBE-LOAD-BALANCER-SOURCE-IP), no out-filter", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const st = makeState({
    ns: "ns1",
    name: "lb",
    clusterIP: "10.20.30.42",
    lbVIPs: ["1.2.3.4"],
    sourceRanges: ["100.101.0.0/16"],
  }, [{ ip: "10.180.0.3" }]);
  await dp.sync(snapshot([st], { nodeIPs: NODE }));
  const ipset = inputs(r, "ipset", "restore")[0];
  assert.ok(ipset.includes("add KUBE-LOAD-BALANCER-SOURCE-IP 1.2.3.4,tcp:80,1.2.3.4 -exist\n"));
  const p = inputs(r, "iptables-restore")[0];
  assert.deepEqual(rulesOf(p, "KUBE-IPVS-OUT-FILTER"), []);
  assert.deepEqual(rulesOf(p, "KUBE-SOURCE-RANGES-FIREWALL"), [
    '-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port + source cidr for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN',
    '-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment "Kubernetes service load balancer ip + port + source IP for packet filter purpose" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-IP dst,dst,src -j RETURN',
    "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
  ]);
});

Deno.test("externalIPs: eTP=Local keeps only local endpoints (upstream TestOnlyLocalExternalIPs); an IP on a node interface is not bound", async () => {
  const r = kernelRunner(fakeKernel({ links: { eth0: ["100.101.102.103", "50.60.70.82"] } }));
  const { dp } = ipvsDataplane(r);
  const st = makeState({
    ns: "ns1",
    name: "svc1",
    clusterIP: "10.20.30.41",
    externalIPs: ["50.60.70.81", "50.60.70.82"],
    nodePort: 3001,
    eTPLocal: true,
  }, [{ ip: "10.180.0.1", local: true }, { ip: "10.180.1.1" }]);
  await dp.sync(snapshot([st], { nodeIPs: NODE }));
  const batch = inputs(r, "ipvsadm", "-R")[0];
  assert.ok(batch.includes("-A -t 50.60.70.81:80 -s rr\n-a -t 50.60.70.81:80 -r 10.180.0.1:80 -m -w 1\n-A"));
  assert.ok(!batch.includes("-a -t 50.60.70.81:80 -r 10.180.1.1:80"));
  // NodePort virtual servers on every node address (match-all nodePortAddresses), including 50.60.70.82.
  assert.ok(batch.includes("-A -t 50.60.70.82:3001 -s rr\n"));
  const ipset = inputs(r, "ipset", "restore")[0];
  assert.ok(ipset.includes("add KUBE-EXTERNAL-IP-LOCAL 50.60.70.81,tcp:80 -exist\n"));
  assert.ok(!ipset.includes("add KUBE-EXTERNAL-IP "));
  assert.equal(
    inputs(r, "ip", "-force")[0],
    "link add kube-ipvs0 type dummy\naddr replace 10.20.30.41/32 dev kube-ipvs0\n" +
      "addr replace 50.60.70.81/32 dev kube-ipvs0\n",
  );
  const p = inputs(r, "iptables-restore")[0];
  assert.deepEqual(rulesOf(p, "KUBE-SERVICES").filter((l) => l.includes("EXTERNAL-IP")), [
    '-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT',
    '-A KUBE-SERVICES -m comment --comment "Kubernetes service external ip + port with externalTrafficPolicy=local" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT',
  ]);
});

Deno.test("externalIP with eTP=Cluster: KUBE-EXTERNAL-IP masquerade and accept rules (upstream TestAcceptIPVSTraffic)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const st = makeState({ ns: "ns1", name: "svc1", clusterIP: "10.20.30.40", externalIPs: ["5.6.7.8"] }, [
    { ip: "10.180.0.1" },
  ]);
  await dp.sync(snapshot([st], { nodeIPs: NODE }));
  const p = inputs(r, "iptables-restore")[0];
  const c = '"Kubernetes service external ip + port for masquerade and filter purpose"';
  assert.deepEqual(rulesOf(p, "KUBE-SERVICES").filter((l) => l.includes("EXTERNAL-IP")), [
    `-A KUBE-SERVICES -m comment --comment ${c} -m set --match-set KUBE-EXTERNAL-IP dst,dst -j KUBE-MARK-MASQ`,
    `-A KUBE-SERVICES -m comment --comment ${c} -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT`,
    `-A KUBE-SERVICES -m comment --comment ${c} -m set --match-set KUBE-EXTERNAL-IP dst,dst -m addrtype --dst-type LOCAL -j ACCEPT`,
  ]);
});

Deno.test("no endpoints: the virtual server exists without real servers (upstream TestExternalIPsNoEndpoint)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const st = makeState(
    { ns: "ns1", name: "svc1", clusterIP: "10.20.30.41", externalIPs: ["50.60.70.81"] },
    [],
  );
  await dp.sync(snapshot([st], { nodeIPs: NODE }));
  assert.equal(inputs(r, "ipvsadm", "-R")[0], "-A -t 10.20.30.41:80 -s rr\n-A -t 50.60.70.81:80 -s rr\n");
});

Deno.test("iTP=Local without local endpoints: the ClusterIP gets the cluster endpoints when externally reachable (upstream #97081)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const ext = makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41", iTPLocal: true, nodePort: 3001 }, [
    { ip: "10.180.1.1" },
  ]);
  const internalOnly = makeState({ ns: "ns1", name: "b", clusterIP: "10.20.30.42", iTPLocal: true }, [
    { ip: "10.180.1.2" },
  ]);
  await dp.sync(snapshot([ext, internalOnly], { nodeIPs: NODE }));
  const batch = inputs(r, "ipvsadm", "-R")[0];
  assert.ok(batch.includes("-a -t 10.20.30.41:80 -r 10.180.1.1:80 -m -w 1\n"));
  assert.ok(batch.includes("-A -t 10.20.30.42:80 -s rr\n"));
  assert.ok(!batch.includes("-r 10.180.1.2:80"));
});

Deno.test("UDP and SCTP NodePorts: bitmap set for UDP, hash:ip,port per node IP for SCTP, --sctp-service", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const udp = makeState({ ns: "ns1", name: "u", protocol: "UDP", clusterIP: "10.20.30.41", nodePort: 3001 }, [
    {
      ip: "10.180.0.1",
    },
  ]);
  const sctp = makeState({
    ns: "ns1",
    name: "s",
    protocol: "SCTP",
    clusterIP: "10.20.30.42",
    nodePort: 3002,
    eTPLocal: true,
  }, [{ ip: "10.180.0.2", local: true }]);
  await dp.sync(snapshot([udp, sctp], { nodeIPs: NODE }));
  assert.equal(
    inputs(r, "ipvsadm", "-R")[0],
    "-A -u 10.20.30.41:80 -s rr\n-a -u 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1\n" +
      "-A -u 100.101.102.103:3001 -s rr\n-a -u 100.101.102.103:3001 -r 10.180.0.1:80 -m -w 1\n" +
      "-A --sctp-service 10.20.30.42:80 -s rr\n-a --sctp-service 10.20.30.42:80 -r 10.180.0.2:80 -m -w 1\n" +
      "-A --sctp-service 100.101.102.103:3002 -s rr\n" +
      "-a --sctp-service 100.101.102.103:3002 -r 10.180.0.2:80 -m -w 1\n",
  );
  const ipset = inputs(r, "ipset", "restore")[0];
  for (
    const l of [
      "add KUBE-NODE-PORT-UDP 3001 -exist",
      "add KUBE-NODE-PORT-SCTP-HASH 100.101.102.103,sctp:3002 -exist",
      "add KUBE-NODE-PORT-LOCAL-SCTP-HASH 100.101.102.103,sctp:3002 -exist",
      "add KUBE-LOOP-BACK 10.180.0.2,sctp:80,10.180.0.2 -exist",
    ]
  ) assert.ok(ipset.includes(l + "\n"), l);
  const p = inputs(r, "iptables-restore")[0];
  assert.deepEqual(rulesOf(p, "KUBE-NODE-PORT").slice(0, 3), [
    '-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ',
    `-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'" -m set --match-set KUBE-NODE-PORT-LOCAL-SCTP-HASH dst,dst -j RETURN`,
    `-A KUBE-NODE-PORT -p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ`,
  ]);
});

Deno.test("IPv6: KUBE-6- set names (cut to 31 characters), inet6 sets, bracketed addresses, ::1 RETURN, /128 binds", async () => {
  const r = kernelRunner(fakeKernel({ links: { eth0: ["2001:db8::1:1", "fe80::1"] } }));
  const { dp } = ipvsDataplane(r, { family: "IPv6" });
  const st = makeState({
    ns: "ns1",
    name: "svc1",
    clusterIP: "fd00::41",
    nodePort: 3001,
    lbVIPs: ["2001:db8:1::4"],
    sourceRanges: ["2001:db8:2::/48"],
    protocol: "SCTP",
  }, [{ ip: "fd00:1::1" }]);
  await dp.sync(snapshot([st], { family: "IPv6", nodeIPs: ["2001:db8::1:1"] }));
  const ipset = inputs(r, "ipset", "restore")[0];
  for (
    const l of [
      "create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536 -exist",
      "create KUBE-6-NODE-PORT-LOCAL-SCTP-HAS hash:ip,port family inet6 hashsize 1024 maxelem 65536 -exist",
      "create KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535 -exist",
      "add KUBE-6-CLUSTER-IP fd00::41,sctp:80 -exist",
      "add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8:1::4,sctp:80,2001:db8:2::/48 -exist",
      "add KUBE-6-NODE-PORT-SCTP-HASH 2001:db8::1:1,sctp:3001 -exist",
      "add KUBE-6-IPVS-IPS fd00::41 -exist",
    ]
  ) assert.ok(ipset.includes(l + "\n"), l);
  assert.equal(
    inputs(r, "ipvsadm", "-R")[0],
    "-A --sctp-service [fd00::41]:80 -s rr\n-a --sctp-service [fd00::41]:80 -r [fd00:1::1]:80 -m -w 1\n" +
      "-A --sctp-service [2001:db8:1::4]:80 -s rr\n" +
      "-a --sctp-service [2001:db8:1::4]:80 -r [fd00:1::1]:80 -m -w 1\n" +
      "-A --sctp-service [2001:db8::1:1]:3001 -s rr\n" +
      "-a --sctp-service [2001:db8::1:1]:3001 -r [fd00:1::1]:80 -m -w 1\n",
  );
  assert.equal(
    inputs(r, "ip", "-force")[0],
    "link add kube-ipvs0 type dummy\naddr replace fd00::41/128 dev kube-ipvs0\n" +
      "addr replace 2001:db8:1::4/128 dev kube-ipvs0\n",
  );
  const p = inputs(r, "iptables-restore", undefined)[0] ?? inputs(r, "ip6tables-restore")[0];
  assert.ok(p.includes("-A KUBE-SERVICES -s ::1/128 -j RETURN\n"));
  assert.ok(
    p.includes(
      "-A KUBE-IPVS-OUT-FILTER -s 2001:db8:1::4 -m ipvs --vaddr 2001:db8:1::4 --vproto sctp --vport 80 -j DROP\n",
    ),
  );
  assert.ok(p.includes("--match-set KUBE-6-IPVS-IPS dst -j REJECT\n"));
  assert.equal(r.callsOf("ip6tables-restore").length, 1);
});

Deno.test("mh scheduler sets the mh-port flag (upstream's FlagSourceHash)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r, { scheduler: "mh" });
  await dp.sync(snapshot([makeState({ ns: "a", name: "b", clusterIP: "10.0.0.1", affinity: 60 }, [])]));
  assert.equal(inputs(r, "ipvsadm", "-R")[0], "-A -t 10.0.0.1:80 -s mh -p 60 -b mh-port\n");
});

Deno.test("partial sync: one endpoint added writes one real server per virtual server and nothing else", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const other = makeState({ ns: "ns2", name: "other", clusterIP: "10.20.30.50" }, [{ ip: "10.180.9.9" }]);
  await dp.sync(snapshot([svcNP(), other], { nodeIPs: NODE }));
  r.calls.length = 0;
  const res = await dp.sync(
    snapshot([svcNP([{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }]), other], {
      nodeIPs: NODE,
      changed: ["ns1/svc1"],
    }),
  );
  assert.equal(res.full, false);
  assert.deepEqual(commandLines(r), ["ipvsadm -R"]);
  assert.equal(
    inputs(r, "ipvsadm")[0],
    "-a -t 10.20.30.41:80 -r 10.180.0.2:80 -m -w 1\n-a -t 100.101.102.103:3001 -r 10.180.0.2:80 -m -w 1\n",
  );
});

Deno.test("graceful termination: a removed TCP real server gets weight 0, then is deleted once it has no connections", async () => {
  const k = fakeKernel();
  const r = kernelRunner(k);
  const { dp, clock } = ipvsDataplane(r, { drainCheckIntervalMs: 60_000 });
  const svc = (eps: { ip: string }[]) => makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41" }, eps);
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])], { nodeIPs: NODE }));
  r.calls.length = 0;
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1" }])], { nodeIPs: NODE, changed: ["ns1/a"] }));
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), ["-e -t 10.20.30.41:80 -r 10.180.0.2:80 -m -w 0\n"]);
  assert.deepEqual(dp.drainingRealServers(), ["-t 10.20.30.41:80 -r 10.180.0.2:80"]);
  // Right after the sync: the server still has an established connection: kept.
  k.ipvsadmList = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n" +
    "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\nTCP  10.20.30.41:80 rr\n" +
    "  -> 10.180.0.1:80                Masq    1      0          0\n" +
    "  -> 10.180.0.2:80                Masq    0      1          0\n";
  r.calls.length = 0;
  await clock.advance(0);
  assert.deepEqual(commandLines(r), ["ipvsadm -L -n -t 10.20.30.41:80"]);
  assert.deepEqual(dp.drainingRealServers(), ["-t 10.20.30.41:80 -r 10.180.0.2:80"]);
  // A minute later the connection is closed: deleted with one batch, and the checks stop.
  k.ipvsadmList = k.ipvsadmList.replace("Masq    0      1          0", "Masq    0      0          0");
  r.calls.length = 0;
  await clock.advance(60_000);
  assert.deepEqual(commandLines(r), ["ipvsadm -L -n -t 10.20.30.41:80", "ipvsadm -R"]);
  assert.equal(inputs(r, "ipvsadm", "-R")[0], "-d -t 10.20.30.41:80 -r 10.180.0.2:80\n");
  assert.deepEqual(dp.drainingRealServers(), []);
  r.calls.length = 0;
  await clock.advance(120_000);
  assert.deepEqual(r.calls, []);
});

Deno.test("graceful termination: a drained real server that comes back gets its weight back", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const svc = (eps: { ip: string }[]) => makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41" }, eps);
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])], { nodeIPs: NODE }));
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1" }])], { nodeIPs: NODE, changed: ["ns1/a"] }));
  r.calls.length = 0;
  await dp.sync(
    snapshot([svc([{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])], { nodeIPs: NODE, changed: ["ns1/a"] }),
  );
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), ["-e -t 10.20.30.41:80 -r 10.180.0.2:80 -m -w 1\n"]);
  assert.deepEqual(dp.drainingRealServers(), []);
  dp.stop();
});

Deno.test("graceful termination: after a drained real server is deleted, the model follows (same endpoints write nothing, a removed one drains)", async () => {
  const k = fakeKernel();
  const r = kernelRunner(k);
  const { dp, clock } = ipvsDataplane(r);
  const svc = (eps: { ip: string }[]) => makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41" }, eps);
  const two = [{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }];
  await dp.sync(snapshot([svc([...two, { ip: "10.180.0.3" }])], { nodeIPs: NODE }));
  await dp.sync(snapshot([svc(two)], { nodeIPs: NODE, changed: ["ns1/a"] }));
  // ipvsadm -L shows no connection left on the drained server: deleted by the check right after the sync.
  k.ipvsadmList = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n" +
    "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\nTCP  10.20.30.41:80 rr\n" +
    "  -> 10.180.0.1:80                Masq    1      0          0\n" +
    "  -> 10.180.0.2:80                Masq    1      0          0\n" +
    "  -> 10.180.0.3:80                Masq    0      0          0\n";
  r.calls.length = 0;
  await clock.advance(0);
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), ["-d -t 10.20.30.41:80 -r 10.180.0.3:80\n"]);
  assert.deepEqual(dp.drainingRealServers(), []);
  r.calls.length = 0;
  await dp.sync(snapshot([svc(two)], { nodeIPs: NODE, changed: ["ns1/a"] }));
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), []);
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1" }])], { nodeIPs: NODE, changed: ["ns1/a"] }));
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), ["-e -t 10.20.30.41:80 -r 10.180.0.2:80 -m -w 0\n"]);
  assert.deepEqual(dp.drainingRealServers(), ["-t 10.20.30.41:80 -r 10.180.0.2:80"]);
  dp.stop();
});

Deno.test("UDP real servers are deleted at once (no graceful termination, as upstream)", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const svc = (eps: { ip: string }[]) =>
    makeState({ ns: "ns1", name: "dns", protocol: "UDP", clusterIP: "10.20.30.10", portNum: 53 }, eps);
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1", port: 53 }, { ip: "10.180.0.2", port: 53 }] as never)]));
  r.calls.length = 0;
  await dp.sync(snapshot([svc([{ ip: "10.180.0.1", port: 53 }] as never)], { changed: ["ns1/dns"] }));
  assert.deepEqual(inputs(r, "ipvsadm", "-R"), ["-d -u 10.20.30.10:53 -r 10.180.0.2:53\n"]);
  assert.deepEqual(dp.drainingRealServers(), []);
});

Deno.test("partial sync: a removed Service loses its virtual servers, set members and address; iptables only when the rules change", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const other = makeState({ ns: "ns2", name: "other", clusterIP: "10.20.30.50" }, [{ ip: "10.180.9.9" }]);
  await dp.sync(snapshot([svcNP(), other], { nodeIPs: NODE }));
  r.calls.length = 0;
  await dp.sync(snapshot([other], { nodeIPs: NODE, changed: ["ns1/svc1"] }));
  assert.deepEqual(commandLines(r), [
    "ipset restore",
    "ipvsadm -R",
    "iptables-restore --noflush --counters -w 5 -W 100000",
    "ip -force -batch -",
  ]);
  assert.equal(inputs(r, "ipvsadm")[0], "-D -t 10.20.30.41:80\n-D -t 100.101.102.103:3001\n");
  assert.equal(
    inputs(r, "ipset")[0],
    "del KUBE-CLUSTER-IP 10.20.30.41,tcp:80 -exist\ndel KUBE-NODE-PORT-TCP 3001 -exist\n" +
      "del KUBE-IPVS-IPS 10.20.30.41 -exist\n",
  );
  assert.equal(inputs(r, "ip", "-force")[0], "addr del 10.20.30.41/32 dev kube-ipvs0\n");
  // KUBE-NODE-PORT-TCP is empty now: its rule goes (no jump rules in a partial payload).
  const p = inputs(r, "iptables-restore")[0];
  assert.ok(!p.includes("KUBE-NODE-PORT-TCP"));
  assert.ok(!p.includes("-I "));
});

Deno.test("full resync repairs the kernel: stale virtual servers, real servers, members and addresses; weight restored; excluded CIDRs untouched", async () => {
  const k = fakeKernel({
    links: { eth0: ["100.101.102.103"], "kube-ipvs0": ["10.20.30.41", "10.99.0.1"] },
    ipvsadmSave: "-A -t 10.20.30.41:80 -s wlc\n-a -t 10.20.30.41:80 -r 10.180.0.1:80 -m -w 0\n" +
      "-a -t 10.20.30.41:80 -r 10.180.0.7:80 -m -w 1\n-A -t 10.99.0.1:80 -s rr\n-A -t 10.250.0.1:443 -s rr\n" +
      "-A -u [fd00::1]:53 -s rr\n",
    ipsetSave: "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n" +
      "add KUBE-CLUSTER-IP 10.99.0.1,tcp:80\nadd KUBE-CLUSTER-IP 10.20.30.41,tcp:80\n",
  });
  const r = kernelRunner(k);
  const { dp } = ipvsDataplane(r, { excludeCIDRs: ["10.250.0.0/16"] });
  const svc = makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41" }, [{ ip: "10.180.0.1" }]);
  await dp.sync(snapshot([svc], { nodeIPs: NODE }));
  assert.equal(
    inputs(r, "ipvsadm", "-R")[0],
    "-E -t 10.20.30.41:80 -s rr\n-e -t 10.20.30.41:80 -r 10.180.0.1:80 -m -w 1\n" +
      "-e -t 10.20.30.41:80 -r 10.180.0.7:80 -m -w 0\n-D -t 10.99.0.1:80\n",
  );
  assert.deepEqual(dp.drainingRealServers(), ["-t 10.20.30.41:80 -r 10.180.0.7:80"]);
  const adds = inputs(r, "ipset", "restore")[0].split("\n").filter((l) => !l.startsWith("create"));
  assert.deepEqual(adds, [
    "del KUBE-CLUSTER-IP 10.99.0.1,tcp:80 -exist",
    "add KUBE-IPVS-IPS 10.20.30.41 -exist",
    "",
  ]);
  assert.equal(inputs(r, "ip", "-force")[0], "addr del 10.99.0.1/32 dev kube-ipvs0\n");
  dp.stop();
});

Deno.test("a failed batch makes the next sync full (kernel read again); ipvsadm's error output counts as failure", async () => {
  let fail = true;
  const r = kernelRunner(
    fakeKernel(),
    (c) =>
      c.cmd === "ipvsadm" && c.args[0] === "-R" && fail
        ? { code: 0, stderr: "Memory allocation problem\n" }
        : undefined,
  );
  const { dp } = ipvsDataplane(r);
  await assert.rejects(dp.sync(snapshot([svcNP()], { nodeIPs: NODE })));
  fail = false;
  r.calls.length = 0;
  const res = await dp.sync(snapshot([svcNP()], { nodeIPs: NODE, changed: [] }));
  assert.equal(res.full, true);
  assert.ok(commandLines(r).includes("ipvsadm -S -n"));
});

Deno.test("needsFullSync: quiet when nothing changed, true when kube-ipvs0 lost an address or a virtual server vanished", async () => {
  const k = fakeKernel();
  const r = kernelRunner(k, (c) => {
    if (c.cmd === "ipset" && c.args[0] === "list") {
      return { stdout: "Name: KUBE-CLUSTER-IP\nNumber of entries: 1\n" };
    }
    return undefined;
  });
  const { dp } = ipvsDataplane(r);
  await dp.sync(snapshot([svcNP()], { nodeIPs: NODE }));
  k.links["kube-ipvs0"] = ["10.20.30.41"];
  assert.equal(await dp.needsFullSync(), false);
  k.links["kube-ipvs0"] = [];
  assert.equal(await dp.needsFullSync(), true);
});

Deno.test("needsFullSync: true when nat KUBE-SERVICES was flushed or deleted behind our back (beyond upstream)", async () => {
  const k = fakeKernel();
  const r = kernelRunner(k, (c) => {
    if (c.cmd === "ipset" && c.args[0] === "list") {
      return { stdout: "Name: KUBE-CLUSTER-IP\nNumber of entries: 1\n" };
    }
    return undefined;
  });
  const { dp } = ipvsDataplane(r);
  await dp.sync(snapshot([svcNP()], { nodeIPs: NODE }));
  k.links["kube-ipvs0"] = ["10.20.30.41"];
  const written = k.natServices!;
  assert.ok(written.length > 2, written.join("\n"));
  assert.equal(await dp.needsFullSync(), false);
  k.natServices = []; // iptables -t nat -F KUBE-SERVICES
  assert.equal(await dp.needsFullSync(), true);
  // The full sync writes the rules again; then all is quiet.
  await dp.sync(snapshot([svcNP()], { nodeIPs: NODE, changed: [] }));
  assert.deepEqual(k.natServices, written);
  assert.equal(await dp.needsFullSync(), false);
  k.natServices = null; // a firewall reload deleted the chain
  assert.equal(await dp.needsFullSync(), true);
});

Deno.test("two Services on one externalIP:port share its virtual server; removing one leaves the other's", async () => {
  const r = kernelRunner(fakeKernel());
  const { dp } = ipvsDataplane(r);
  const a = makeState({ ns: "ns1", name: "a", clusterIP: "10.20.30.41", externalIPs: ["50.60.70.81"] }, [
    { ip: "10.180.0.1" },
  ]);
  const b = makeState({ ns: "ns1", name: "b", clusterIP: "10.20.30.42", externalIPs: ["50.60.70.81"] }, [
    { ip: "10.180.0.2" },
  ]);
  await dp.sync(snapshot([a, b], { nodeIPs: NODE }));
  // The last claim (b, later in the snapshot) is programmed.
  assert.match(inputs(r, "ipvsadm", "-R")[0], /^-a -t 50\.60\.70\.81:80 -r 10\.180\.0\.2:80 -m -w 1$/m);
  assert.doesNotMatch(inputs(r, "ipvsadm", "-R")[0], /^-a -t 50\.60\.70\.81:80 -r 10\.180\.0\.1:80/m);
  r.calls.length = 0;
  await dp.sync(snapshot([a], { nodeIPs: NODE, changed: ["ns1/b"] }));
  // b's claim goes: the virtual server stays, now with a's endpoint (b's is drained).
  const batch = inputs(r, "ipvsadm", "-R")[0];
  assert.doesNotMatch(batch, /^-D -t 50\.60\.70\.81:80/m);
  assert.match(batch, /^-a -t 50\.60\.70\.81:80 -r 10\.180\.0\.1:80 -m -w 1$/m);
  assert.match(batch, /^-e -t 50\.60\.70\.81:80 -r 10\.180\.0\.2:80 -m -w 0$/m);
  assert.deepEqual(
    inputs(r, "ip", "-force"),
    ["addr del 10.20.30.42/32 dev kube-ipvs0\n"],
    "50.60.70.81 stays",
  );
  r.calls.length = 0;
  await dp.sync(snapshot([], { nodeIPs: NODE, changed: ["ns1/a"] }));
  assert.match(inputs(r, "ipvsadm", "-R")[0], /^-D -t 50\.60\.70\.81:80$/m);
  dp.stop();
});

Deno.test("a full sync streams its ipvsadm batch in chunks, the same text a sync that keeps its batches writes", async () => {
  const forms: string[] = [];
  const run = async (keepLastBatches: boolean) => {
    const r = kernelRunner(fakeKernel());
    const tryRun = r.tryRun.bind(r);
    r.tryRun = (spec) => {
      if (spec.cmd === "ipvsadm" && spec.args[0] === "-R") forms.push(typeof spec.stdin);
      return tryRun(spec);
    };
    const { dp } = ipvsDataplane(r, { keepLastBatches });
    const res = await dp.sync(
      snapshot([svcNP([{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])], { nodeIPs: NODE }),
    );
    return { text: inputs(r, "ipvsadm", "-R").join(""), bytes: res.payloadBytes };
  };
  const streamed = await run(false);
  const kept = await run(true);
  assert.deepEqual(forms, ["object", "string"], "an iterable of chunks, then the kept string");
  assert.match(streamed.text, /^-a -t 10\.20\.30\.41:80 -r 10\.180\.0\.2:80 -m -w 1$/m);
  assert.equal(streamed.text, kept.text);
  assert.equal(streamed.bytes, kept.bytes);
});
