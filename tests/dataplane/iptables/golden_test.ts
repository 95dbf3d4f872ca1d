/**
 * Golden tests: the reference §2.4 example line for line, upstream's TestOverallIPTablesRules fixture, and the
 * chain-name vectors.
 */
import assert from "node:assert/strict";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables/local_detector.ts";
import { endpointChainName, hash16, servicePortChains } from "../../../lib/dataplane/iptables/chain_names.ts";
import { masqueradeMark, probability } from "../../../lib/dataplane/iptables/rules.ts";
import { makeState, overallFixture, recorder, snapshot } from "../../../testkit/fixtures.ts";
import { dedent, restores, sortIPTablesRules, stripExtras } from "./helpers.ts";

Deno.test("chain names: upstream vectors", () => {
  assert.equal(servicePortChains("ns1/svc1:p80", "tcp").svc, "KUBE-SVC-XPGD46QRK7WJZT7O");
  assert.equal(servicePortChains("ns1/svc1:p80", "tcp").svl, "KUBE-SVL-XPGD46QRK7WJZT7O");
  assert.equal(servicePortChains("ns1/svc1:p80", "tcp").ext, "KUBE-EXT-XPGD46QRK7WJZT7O");
  assert.equal(servicePortChains("ns1/svc1:p80", "tcp").fw, "KUBE-FW-XPGD46QRK7WJZT7O");
  assert.equal(endpointChainName("ns1/svc1:p80", "tcp", "10.180.0.1:80"), "KUBE-SEP-SXIVWICOYRO3J4NJ");
  assert.equal(endpointChainName("ns1/svc1:p80", "tcp", "10.180.0.2:80"), "KUBE-SEP-LXVODXWDISEETFEF");
  assert.equal(servicePortChains("default/kubernetes:https", "tcp").svc, "KUBE-SVC-NPX46M4PTMTKRN6Y");
  // From upstream's TestOverallIPTablesRules.
  assert.equal(servicePortChains("ns2/svc2:p80", "tcp").svc, "KUBE-SVC-GNZBNJ2PO5MGZ6GT");
  assert.equal(servicePortChains("ns5/svc5:p80", "tcp").fw, "KUBE-FW-NUKIZ6OKUXPJNT4C");
  assert.equal(endpointChainName("ns4/svc4:p80", "tcp", "10.180.0.5:80"), "KUBE-SEP-C6EBXVWJJZMIWKLZ");
  assert.equal(hash16("").length, 16);
});

Deno.test("probabilities and mark format", () => {
  assert.equal(probability(2), "0.5000000000");
  assert.equal(probability(3), "0.3333333333");
  assert.equal(probability(7), "0.1428571429");
  assert.equal(masqueradeMark(14), "0x00004000");
  assert.equal(masqueradeMark(0), "0x00000001");
});

Deno.test("golden: reference §2.4 example, line for line", async () => {
  const r = recorder();
  const dp = new IptablesDataplane({
    family: "IPv4",
    runner: r,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
  });
  await dp.sync(snapshot([
    makeState({ ns: "ns1", name: "svc1", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1" }, {
      ip: "10.180.0.2",
    }]),
  ]));
  const payload = restores(r)[0];
  const nat = payload.slice(payload.indexOf("*nat\n"));
  const own = nat.split("\n").filter((l) =>
    l === "*nat" || /^:KUBE-(SVC|SEP)-/.test(l) ||
    /^-A KUBE-(SERVICES|SVC|SEP)/.test(l) && !l.includes("nodeports")
  );
  assert.equal(
    own.join("\n") + "\n",
    dedent(`
      *nat
      :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
      :KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
      :KUBE-SEP-LXVODXWDISEETFEF - [0:0]
      -A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
      -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
      -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
      -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF
      -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
      -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
      -A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
      -A KUBE-SEP-LXVODXWDISEETFEF -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
    `),
  );
});

// Upstream's expected output (proxier_test.go TestOverallIPTablesRules, nfacct counters available), with one
// difference: upstream's fake proxier spells the mark "0x4000" where the real one writes 0x00004000.
const OVERALL_EXPECTED = dedent(`
  *filter
  :KUBE-NODEPORTS - [0:0]
  :KUBE-SERVICES - [0:0]
  :KUBE-EXTERNAL-SERVICES - [0:0]
  :KUBE-FIREWALL - [0:0]
  :KUBE-FORWARD - [0:0]
  :KUBE-PROXY-FIREWALL - [0:0]
  -A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT
  -A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT
  -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP
  -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
  -A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP
  -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
  -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
  -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
  -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
  -A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP
  COMMIT
  *nat
  :KUBE-NODEPORTS - [0:0]
  :KUBE-SERVICES - [0:0]
  :KUBE-EXT-4SW47YFZTEDKD3PK - [0:0]
  :KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
  :KUBE-EXT-NUKIZ6OKUXPJNT4C - [0:0]
  :KUBE-EXT-X27LE4BHSL4DOUIK - [0:0]
  :KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]
  :KUBE-MARK-MASQ - [0:0]
  :KUBE-POSTROUTING - [0:0]
  :KUBE-SEP-C6EBXVWJJZMIWKLZ - [0:0]
  :KUBE-SEP-I77PXRDZVX7PMWMN - [0:0]
  :KUBE-SEP-OYPFS5VJICHGATKP - [0:0]
  :KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
  :KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
  :KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
  :KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
  :KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
  :KUBE-SVC-NUKIZ6OKUXPJNT4C - [0:0]
  :KUBE-SVC-X27LE4BHSL4DOUIK - [0:0]
  :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
  -A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
  -A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
  -A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK
  -A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK
  -A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C
  -A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
  -A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
  -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
  -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
  -A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
  -A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK
  -A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
  -A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK
  -A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C
  -A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C
  -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
  -A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
  -A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK
  -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
  -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
  -A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
  -A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ
  -A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C
  -A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ
  -A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK
  -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C
  -A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"
  -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
  -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
  -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
  -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
  -A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ
  -A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80
  -A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
  -A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
  -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
  -A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
  -A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
  -A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
  -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
  -A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
  -A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ
  -A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80
  -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
  -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC
  -A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ
  -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
  -A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
  -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
  -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN
  -A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN
  -A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
  -A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP
  -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
  -A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
  COMMIT
`);

Deno.test("golden: upstream TestOverallIPTablesRules fixture", async () => {
  const r = recorder();
  const dp = new IptablesDataplane({
    family: "IPv4",
    runner: r,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    randomFully: false,
  });
  await dp.sync(snapshot(overallFixture()));
  const payload = restores(r)[0].replaceAll("0x00004000", "0x4000");
  assert.equal(sortIPTablesRules(stripExtras(payload)), OVERALL_EXPECTED);
});

Deno.test("golden: without nfacct counters the same rules are written without the nfacct matches", async () => {
  const r = recorder((c) =>
    c.cmd === "nfacct" ? { code: 1, stderr: "nfacct: Operation not supported" } : undefined
  );
  const dp = new IptablesDataplane({
    family: "IPv4",
    runner: r,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    randomFully: false,
  });
  await dp.sync(snapshot(overallFixture()));
  const payload = restores(r)[0].replaceAll("0x00004000", "0x4000");
  const withoutCounters = OVERALL_EXPECTED.split("\n").filter((l) => !l.includes("127.0.0.0/8 --dport"))
    .join("\n").replace(" -m nfacct --nfacct-name ct_state_invalid_dropped_pkts", "");
  assert.equal(sortIPTablesRules(stripExtras(payload)), withoutCounters);
  assert.deepEqual(r.callsOf("nfacct").map((c) => c.args.join(" ")), [
    "get ct_state_invalid_dropped_pkts",
    "add ct_state_invalid_dropped_pkts",
    "get localhost_nps_accepted_pkts",
    "add localhost_nps_accepted_pkts",
  ]);
});
