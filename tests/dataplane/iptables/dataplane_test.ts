/** IptablesDataplane behaviour with a recording runner: exact payloads, partial syncs, failures, stale chains. */
import assert from "node:assert/strict";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import {
  detectLocalByBridgeInterface,
  detectLocalByCIDR,
  detectLocalByInterfaceNamePrefix,
  newLocalDetector,
} from "../../../lib/dataplane/iptables/local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { makeState, recorder, snapshot } from "../../../testkit/fixtures.ts";
import { jumpRecorder, restores } from "./helpers.ts";
import { overallFixture } from "../../../testkit/fixtures.ts";

const logs: string[] = [];
configureLogging({ sink: (l) => logs.push(l) });

const svcA = (eps = [{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }]) =>
  makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.1" }, eps);
const svcB = () =>
  makeState({ ns: "ns1", name: "b", clusterIP: "172.30.0.2", nodePort: 30002 }, [{ ip: "10.1.0.9" }]);

function dp(r = recorder(), extra: Partial<ConstructorParameters<typeof IptablesDataplane>[0]> = {}) {
  return new IptablesDataplane({
    family: "IPv4",
    runner: r,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    ...extra,
  });
}

Deno.test("first sync: sysctls, one iptables-save per table, missing jumps inserted, canaries, one restore", async () => {
  const r = recorder();
  const res = await dp(r).sync(snapshot([svcA()]));
  assert.equal(res.full, true);
  assert.deepEqual(r.calls.map((c) => [c.cmd, ...c.args].join(" ")), [
    "sysctl -n net.ipv4.conf.all.route_localnet",
    "sysctl -w net.ipv4.conf.all.route_localnet=1",
    "sysctl -n net.ipv4.conf.all.route_localnet", // read back: a write can exit 0 and not take effect
    "sysctl -n net.netfilter.nf_conntrack_tcp_be_liberal",
    "nfacct get ct_state_invalid_dropped_pkts", // upstream ensures its counters on every full sync
    "nfacct get localhost_nps_accepted_pkts",
    "iptables-save -t filter",
    "iptables-save -t nat",
    "iptables-restore --noflush --counters -w 5 -W 100000",
  ]);
  const p = restores(r)[0];
  assert.ok(
    p.includes(
      '-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES\n',
    ),
  );
  assert.ok(
    p.includes('-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING\n'),
  );
  assert.ok(p.includes("-I INPUT 1 -j KUBE-FIREWALL\n"));
  assert.ok(p.includes("*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n"));
  assert.ok(p.includes("-j MASQUERADE --random-fully\n"));
  assert.ok(
    p.includes(
      "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n",
    ),
  );
  assert.equal(res.payloadBytes, new TextEncoder().encode(p).byteLength);
});

Deno.test("existing jump rules are not inserted again", async () => {
  const saved =
    `*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES\nCOMMIT\n`;
  const r = recorder((
    c,
  ) => (c.cmd === "iptables-save" && c.args[1] === "filter" ? { stdout: saved } : undefined));
  await dp(r).sync(snapshot([svcA()]));
  const p = restores(r)[0];
  assert.ok(
    !p.includes('-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible'),
  );
  assert.ok(
    p.includes('-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible'),
  );
});

Deno.test("partial sync: only changed services' chains, no other program runs", async () => {
  const r = recorder();
  const d = dp(r);
  await d.sync(snapshot([svcA(), svcB()]));
  const before = r.calls.length;
  const res = await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }]), svcB()], { changed: ["ns1/a"] }));
  assert.equal(res.full, false);
  assert.deepEqual(r.calls.slice(before).map((c) => c.cmd), ["iptables-restore"]);
  const p = restores(r)[1];
  // b's chains are not written, but its dispatch rules are.
  assert.ok(!p.match(/^:KUBE-EXT-/m), "b's EXT chain is not rewritten");
  assert.equal(p.match(/^:KUBE-SVC-/gm)?.length, 1);
  assert.ok(p.includes(`-A KUBE-NODEPORTS -m comment --comment ns1/b:p80 -m tcp -p tcp --dport 30002`));
  assert.equal(p.match(/^-A KUBE-SEP-/gm)?.length, 2, "only a's remaining SEP rules");
  assert.ok(!p.includes("10.1.0.9:80"));
  // The endpoint that went away is flushed and deleted.
  assert.match(p, /^-X KUBE-SEP-\w+$/m);
  assert.equal(p.match(/^-X /gm)?.length, 1);
  assert.ok(!p.includes("KUBE-PROXY-CANARY"));
  assert.ok(!p.includes("-I "));
});

Deno.test("stale chains: a deleted service's chains are deleted from memory, without iptables-save", async () => {
  const r = recorder();
  const d = dp(r);
  await d.sync(snapshot([svcA(), svcB()]));
  await d.sync(snapshot([svcA()], { changed: ["ns1/b"] }));
  const p = restores(r)[1];
  const deleted = [...p.matchAll(/^-X (\S+)$/gm)].map((m) => m[1]).sort();
  assert.equal(deleted.length, 3); // EXT, SVC, SEP of b
  assert.ok(deleted.every((c) => /^KUBE-(EXT|SVC|SEP)-/.test(c)));
  for (const c of deleted) assert.ok(p.includes(`:${c} - [0:0]\n`));
  assert.ok(!p.includes("ns1/b"));
  assert.equal(r.callsOf("iptables-save").length, 2); // only the first sync's scan
  // And a later full sync does not delete them again.
  await d.sync(snapshot([svcA()]));
  assert.ok(!restores(r)[2].includes("-X "));
});

Deno.test("leftover chains of an earlier run are deleted on the first full sync", async () => {
  const saved =
    "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-OLDOLDOLDOLDOLD1 - [0:0]\n:KUBE-SEP-OLDOLDOLDOLDOLD2 - [0:0]\n:OTHER - [0:0]\nCOMMIT\n";
  const r = recorder((
    c,
  ) => (c.cmd === "iptables-save" && c.args[1] === "nat" ? { stdout: saved } : undefined));
  await dp(r).sync(snapshot([svcA()]));
  const p = restores(r)[0];
  assert.ok(p.includes("-X KUBE-SVC-OLDOLDOLDOLDOLD1\n"));
  assert.ok(p.includes("-X KUBE-SEP-OLDOLDOLDOLDOLD2\n"));
  assert.ok(!p.includes("-X OTHER"));
});

Deno.test("failed restore: logs the failing line, counts, rejects, next sync is full", async () => {
  let fail = false;
  const r = recorder((c) =>
    c.cmd === "iptables-restore" && fail
      ? { code: 2, stderr: "iptables-restore: line 3 failed\n" }
      : undefined
  );
  const d = dp(r);
  await d.sync(snapshot([svcA()]));
  fail = true;
  logs.length = 0;
  await assert.rejects(d.sync(snapshot([svcA([{ ip: "10.180.0.1" }])], { changed: ["ns1/a"] })));
  const line3 = restores(r)[1].split("\n")[2];
  assert.ok(
    logs.some((l) =>
      l.includes("Failed to execute iptables-restore") && l.includes(JSON.stringify(line3).slice(1, -1))
    ),
  );
  fail = false;
  assert.equal(await d.needsFullSync(), true);
  const res = await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }])], { changed: [] }));
  assert.equal(res.full, true);
  assert.ok(restores(r)[2].includes("KUBE-PROXY-CANARY"));
  assert.equal(r.callsOf("iptables-save").length, 4, "jumps re-verified after a failure");
});

const SERVICES_LISTING = "-N KUBE-SERVICES\n-A KUBE-SERVICES -d 172.30.0.1/32 -p tcp -j KUBE-SVC-X\n";

Deno.test("canary gone → needsFullSync true and the next sync is full", async () => {
  let gone = false;
  const r = recorder((c) => {
    if (c.cmd !== "iptables") return undefined;
    if (gone) return { code: 1, stderr: "No chain/target/match by that name." };
    return c.args.includes("KUBE-SERVICES") ? { stdout: SERVICES_LISTING } : undefined;
  });
  const d = dp(r);
  await d.sync(snapshot([svcA()]));
  assert.equal(await d.needsFullSync(), false);
  assert.deepEqual(r.callsOf("iptables")[0].args, ["-w", "5", "-t", "mangle", "-S", "KUBE-PROXY-CANARY"]);
  gone = true;
  assert.equal(await d.needsFullSync(), true);
  const res = await d.sync(snapshot([svcA()], { changed: [] }));
  assert.equal(res.full, true);
});

Deno.test("a flushed nat KUBE-SERVICES with the canary intact → needsFullSync true (small clusters)", async () => {
  let flushed = false;
  const r = recorder((c) =>
    c.cmd === "iptables" && c.args.includes("KUBE-SERVICES")
      ? { stdout: flushed ? "-N KUBE-SERVICES\n" : SERVICES_LISTING }
      : undefined
  );
  const d = dp(r);
  await d.sync(snapshot([svcA()]));
  assert.equal(await d.needsFullSync(), false);
  assert.deepEqual(r.callsOf("iptables").map((c) => c.args.at(-1)), ["KUBE-PROXY-CANARY", "KUBE-SERVICES"]);
  flushed = true;
  assert.equal(await d.needsFullSync(), true);
  const res = await d.sync(snapshot([svcA()], { changed: [] }));
  assert.equal(res.full, true);
});

Deno.test("masqueradeAll masquerades every ClusterIP connection", async () => {
  const r = recorder();
  await dp(r, { masqueradeAll: true }).sync(snapshot([svcA()]));
  assert.match(
    restores(r)[0],
    /^-A KUBE-SVC-\w+ -m comment --comment "ns1\/a:p80 cluster IP" -m tcp -p tcp -d 172.30.0.1 --dport 80 -j KUBE-MARK-MASQ$/m,
  );
});

Deno.test("local detector modes give the right match args", async () => {
  assert.deepEqual(detectLocalByBridgeInterface("cbr0"), {
    isImplemented: true,
    ifLocal: "-i cbr0",
    ifNotLocal: "! -i cbr0",
  });
  assert.deepEqual(detectLocalByInterfaceNamePrefix("veth"), {
    isImplemented: true,
    ifLocal: "-i veth+",
    ifNotLocal: "! -i veth+",
  });
  assert.equal(
    newLocalDetector({ mode: "ClusterCIDR", family: "IPv6", clusterCIDRs: ["10.0.0.0/8", "fd00::/48"] })
      .ifLocal,
    "-s fd00::/48",
  );
  assert.equal(
    newLocalDetector({ mode: "NodeCIDR", family: "IPv4", podCIDRs: ["10.1.2.0/24"] }).ifNotLocal,
    "! -s 10.1.2.0/24",
  );
  assert.equal(
    newLocalDetector({ mode: "ClusterCIDR", family: "IPv6", clusterCIDRs: ["10.0.0.0/8"] }).isImplemented,
    false,
  );
  const r = recorder();
  await dp(r, { localDetector: detectLocalByInterfaceNamePrefix("veth") }).sync(
    snapshot([
      makeState({ ns: "ns", name: "l", clusterIP: "172.30.0.9", nodePort: 30009, eTPLocal: true }, [{
        ip: "10.0.0.5",
        local: true,
      }]),
    ]),
  );
  const p = restores(r)[0];
  assert.match(
    p,
    /-m comment --comment "pod traffic for ns\/l:p80 external destinations" -i veth\+ -j KUBE-SVC-/,
  );
  assert.match(p, /--dport 80 ! -i veth\+ -j KUBE-MARK-MASQ/);
  // eTP=Local with a local endpoint: EXT ends in the SVL chain.
  assert.match(p, /^-A KUBE-EXT-(\w+) -j KUBE-SVL-\1$/m);
});

Deno.test("internalTrafficPolicy Local without local endpoints → filter DROP", async () => {
  const r = recorder();
  await dp(r).sync(
    snapshot([
      makeState({ ns: "ns", name: "i", clusterIP: "172.30.0.7", iTPLocal: true }, [{ ip: "10.0.0.5" }]),
    ]),
  );
  const p = restores(r)[0];
  assert.ok(
    p.includes(
      `-A KUBE-SERVICES -m comment --comment "ns/i:p80 has no local endpoints" -m tcp -p tcp -d 172.30.0.7 --dport 80 -j DROP\n`,
    ),
  );
  assert.ok(!p.includes(":KUBE-SVC-"));
});

Deno.test("nodePortAddresses: per-IP rules from `ip -j addr`, loopback only with localhost NodePorts", async () => {
  const addrs = JSON.stringify([
    { ifname: "lo", addr_info: [{ family: "inet", local: "127.0.0.1" }] },
    {
      ifname: "eth0",
      addr_info: [{ family: "inet", local: "192.168.0.2" }, { family: "inet", local: "10.9.9.9" }],
    },
  ]);
  const r = recorder((c) => (c.cmd === "ip" ? { stdout: addrs } : undefined));
  await dp(r, { nodePortAddresses: ["192.168.0.0/24", "127.0.0.0/8"] }).sync(snapshot([svcB()]));
  assert.deepEqual(r.callsOf("ip")[0].args, ["-j", "-4", "addr", "show"]);
  const p = restores(r)[0];
  const tail = p.split("\n").filter((l) => l.includes("must be the last rule"));
  assert.deepEqual(tail.map((l) => l.replace(/.*chain" /, "")), [
    "-d 127.0.0.1 -j KUBE-NODEPORTS",
    "-d 192.168.0.2 -j KUBE-NODEPORTS",
  ]);

  const r2 = recorder();
  await dp(r2, { nodePortAddresses: ["primary"] }).sync(snapshot([svcB()]));
  const p2 = restores(r2)[0];
  assert.ok(!p2.includes("KUBE-FIREWALL"), "no localhost NodePorts without loopback in nodePortAddresses");
  assert.equal(r2.callsOf("sysctl").length, 1, "route_localnet untouched");
});

Deno.test("localhostNodePorts=false blocks 127.0.0.0/8 in the match-all rule", async () => {
  const r = recorder();
  await dp(r, { localhostNodePorts: false }).sync(snapshot([svcB()]));
  assert.ok(restores(r)[0].includes("-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS\n"));
});

Deno.test("IPv6: ip6tables-restore, ::1 excluded, no localnet rule, bracketed DNAT", async () => {
  const r = recorder();
  const d = new IptablesDataplane({
    family: "IPv6",
    runner: r,
    localDetector: detectLocalByCIDR("fd00::/48"),
    backend: "nft",
  });
  await d.sync(
    snapshot([makeState({ ns: "ns", name: "v6", clusterIP: "fd00:1::10" }, [{ ip: "fd00::5" }])], {
      family: "IPv6",
      nodeIPs: ["fd00::2"],
    }),
  );
  const p = restores(r, "ip6tables-nft-restore")[0];
  assert.ok(p.includes("-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS\n"));
  assert.ok(!p.includes("KUBE-FIREWALL"));
  assert.ok(p.includes("-s fd00::5 -j KUBE-MARK-MASQ\n"));
  assert.ok(p.includes("-j DNAT --to-destination [fd00::5]:80\n"));
  assert.deepEqual(r.callsOf("ip6tables-nft-save").length, 2);
  assert.equal(r.callsOf("sysctl").length, 1);
});

Deno.test("large-cluster mode leaves out SVC/SEP comments", async () => {
  const eps = Array.from({ length: 1001 }, (_, i) => ({ ip: `10.2.${i >> 8}.${i & 255}` }));
  const r = recorder();
  await dp(r).sync(snapshot([makeState({ ns: "ns", name: "big", clusterIP: "172.30.0.99" }, eps)]));
  const p = restores(r)[0];
  assert.match(p, /^-A KUBE-SEP-\w+ -s 10\.2\.0\.0 -j KUBE-MARK-MASQ$/m);
  assert.match(
    p,
    /^-A KUBE-SVC-\w+ -m statistic --mode random --probability 0\.0009990010 -j KUBE-SEP-\w+$/m,
  );
  assert.ok(p.includes(`-A KUBE-SERVICES -m comment --comment "ns/big:p80 cluster IP"`));
});

Deno.test("large-cluster mode (> 1000 endpoints at the last sync) skips the hourly full resync (v1.37 #138571)", async () => {
  const eps = (n: number) => Array.from({ length: n }, (_, i) => ({ ip: `10.2.${i >> 8}.${i & 255}` }));
  const d = dp(recorder());
  assert.equal(d.skipsPeriodicFullSync(), false);
  await d.sync(snapshot([makeState({ ns: "ns", name: "big", clusterIP: "172.30.0.99" }, eps(1001))]));
  assert.equal(d.skipsPeriodicFullSync(), true);
  await d.sync(snapshot([makeState({ ns: "ns", name: "big", clusterIP: "172.30.0.99" }, eps(1000))]));
  assert.equal(d.skipsPeriodicFullSync(), false, "1000 endpoints is not large");
});

Deno.test("nf_conntrack_tcp_be_liberal=1 → no INVALID drop", async () => {
  const r = recorder((
    c,
  ) => (c.cmd === "sysctl" && c.args[1]?.endsWith("be_liberal") ? { stdout: "1\n" } : undefined));
  await dp(r).sync(snapshot([svcA()]));
  assert.ok(!restores(r)[0].includes("INVALID"));
});

Deno.test("loadBalancerSourceRanges containing the node IP allow the VIP itself", async () => {
  const r = recorder();
  await dp(r).sync(
    snapshot([
      makeState({
        ns: "ns",
        name: "lb",
        clusterIP: "172.30.0.5",
        lbVIPs: ["5.6.7.8"],
        nodePort: 30005,
        sourceRanges: ["192.168.0.0/16"],
      }, [{ ip: "10.0.0.1" }]),
    ]),
  );
  const p = restores(r)[0];
  assert.match(
    p,
    /-A KUBE-FW-(\w+) -m comment --comment "ns\/lb:p80 loadbalancer IP" -s 192.168.0.0\/16 -j KUBE-EXT-\1\n/,
  );
  assert.match(
    p,
    /-A KUBE-FW-(\w+) -m comment --comment "ns\/lb:p80 loadbalancer IP" -s 5.6.7.8 -j KUBE-EXT-\1\n/,
  );
});

Deno.test("full sync with unchanged states reuses cached blocks (identical payload)", async () => {
  // The jumps inserted by the first sync are then in place, so the second (re-verifying) full sync finds them.
  const { r } = jumpRecorder();
  const d = dp(r);
  const states = overallFixture();
  await d.sync(snapshot(states));
  await d.sync(snapshot(states));
  // Same content except the one-time jump insertion of the first sync.
  assert.equal(restores(r)[1], restores(r)[0].split("\n").filter((l) => !l.startsWith("-I ")).join("\n"));
});

Deno.test("health check node port rule for an eTP=Local LoadBalancer with no NodePort and no VIP-mode ingress yet", async () => {
  // allocateLoadBalancerNodePorts:false and no status.loadBalancer.ingress (or only ipMode Proxy) yet: the port is
  // not externally reachable, but upstream still writes the rule (it conditions on HealthCheckNodePort() != 0).
  const r = recorder();
  await dp(r).sync(snapshot([
    makeState({ ns: "ns", name: "lbl", clusterIP: "172.30.0.60", eTPLocal: true, hcnp: 30100 }, [
      { ip: "10.180.0.60", local: true },
    ]),
  ]));
  assert.ok(
    restores(r)[0].includes(
      `-A KUBE-NODEPORTS -m comment --comment "ns/lbl:p80 health check node port" -m tcp -p tcp --dport 30100 -j ACCEPT\n`,
    ),
  );
});

Deno.test("every full sync (incl. periodic) re-verifies jump rules; partial syncs still run nothing else", async () => {
  const { r, state } = jumpRecorder();
  const d = dp(r);
  await d.sync(snapshot([svcA()]));
  assert.ok(restores(r)[0].includes('-I PREROUTING 1 -m comment --comment "kubernetes service portals"'));
  // Someone flushes nat PREROUTING; the canary is untouched, so nothing forces a full sync.
  state.drop("nat", "PREROUTING");
  let before = r.calls.length;
  await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }])], { changed: ["ns1/a"] }));
  assert.deepEqual(r.calls.slice(before).map((c) => c.cmd), ["iptables-restore"]);
  // The periodic (hourly) full sync puts the jump back, and only that one.
  before = r.calls.length;
  const res = await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }])]));
  assert.equal(res.full, true);
  assert.deepEqual(r.calls.slice(before).map((c) => [c.cmd, ...c.args].join(" ")), [
    "nfacct get ct_state_invalid_dropped_pkts",
    "nfacct get localhost_nps_accepted_pkts",
    "iptables-save -t filter",
    "iptables-save -t nat",
    "iptables-restore --noflush --counters -w 5 -W 100000",
  ]);
  const jumps = restores(r)[2].split("\n").filter((l) => l.startsWith("-I "));
  assert.deepEqual(jumps, [
    '-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
  ]);
  // Nothing missing: a further full sync inserts nothing.
  await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }])]));
  assert.ok(!restores(r)[3].includes("-I "));
});

Deno.test("CIDR nodePortAddresses: node addresses re-read on every sync, a partial sync rewrites the nodeports tail", async () => {
  const addrs = (ips: string[]) =>
    JSON.stringify([{ ifname: "eth0", addr_info: ips.map((local) => ({ family: "inet", local })) }]);
  let cur = addrs(["192.168.0.2"]);
  const r = recorder((c) => (c.cmd === "ip" ? { stdout: cur } : undefined));
  const d = dp(r, { nodePortAddresses: ["192.168.0.0/24"] });
  await d.sync(snapshot([svcA(), svcB()]));
  const tail = (p: string) => p.split("\n").filter((l) => l.includes("must be the last rule"));
  assert.deepEqual(tail(restores(r)[0]).map((l) => l.replace(/.*chain" /, "")), [
    "-d 192.168.0.2 -j KUBE-NODEPORTS",
  ]);
  // The node gets another address (DHCP, a VIP moved here): the next sync, even partial, picks it up.
  cur = addrs(["192.168.0.2", "192.168.0.7"]);
  const before = r.calls.length;
  const res = await d.sync(snapshot([svcA([{ ip: "10.180.0.1" }]), svcB()], { changed: ["ns1/a"] }));
  assert.equal(res.full, false);
  assert.deepEqual(r.calls.slice(before).map((c) => c.cmd), ["ip", "iptables-restore"]);
  const p = restores(r)[1];
  assert.ok(p.includes("*nat\n:KUBE-SERVICES - [0:0]\n"), "nat KUBE-SERVICES is flushed and rewritten");
  assert.deepEqual(tail(p).map((l) => l.replace(/.*chain" /, "")), [
    "-d 192.168.0.2 -j KUBE-NODEPORTS",
    "-d 192.168.0.7 -j KUBE-NODEPORTS",
  ]);
});

Deno.test("kubelet KUBE-FIREWALL jumps ensured on full syncs without localhost NodePorts, the chain never flushed", async () => {
  for (
    const [family, opts, tool] of [
      ["IPv4", { localhostNodePorts: false }, "iptables"],
      ["IPv4", { nodePortAddresses: ["primary"] }, "iptables"],
      ["IPv6", {}, "ip6tables"],
    ] as const
  ) {
    const { r, state } = jumpRecorder();
    const d = new IptablesDataplane({
      family,
      runner: r,
      localDetector: detectLocalByCIDR(family === "IPv6" ? "fd00::/48" : "10.0.0.0/8"),
      ...opts,
    });
    const snap = family === "IPv6"
      ? snapshot([makeState({ ns: "ns", name: "v6", clusterIP: "fd00:1::10" }, [{ ip: "fd00::5" }])], {
        family,
        nodeIPs: ["fd00::2"],
      })
      : snapshot([svcA()]);
    await d.sync(snap);
    const p = restores(r, `${tool}-restore`)[0];
    assert.ok(!p.includes("KUBE-FIREWALL"), "the payload leaves kubelet's chain alone");
    // After the restore (so that, as upstream's prepend order leaves them, they come first).
    const calls = r.calls.map((c) => [c.cmd, ...c.args].join(" "));
    const i = calls.indexOf(`${tool}-restore --noflush --counters -w 5 -W 100000`);
    assert.deepEqual(calls.slice(i + 1), [
      `${tool} -w 5 -t filter -N KUBE-FIREWALL`,
      `${tool} -w 5 -t filter -I INPUT 1 -j KUBE-FIREWALL`,
      `${tool} -w 5 -t filter -I OUTPUT 1 -j KUBE-FIREWALL`,
    ], `${family} ${JSON.stringify(opts)}`);
    // Present now: the next full sync runs nothing for them; a flushed OUTPUT gets its jump back, the chain
    // (which kubelet owns and may fill) is not created or declared again.
    state.drop("filter", "OUTPUT");
    const before = r.calls.length;
    await d.sync(snap);
    const after = r.calls.slice(before).map((c) => [c.cmd, ...c.args].join(" "));
    assert.deepEqual(after.slice(after.indexOf(`${tool}-restore --noflush --counters -w 5 -W 100000`) + 1), [
      `${tool} -w 5 -t filter -I OUTPUT 1 -j KUBE-FIREWALL`,
    ], JSON.stringify(after));
    assert.ok(!restores(r, `${tool}-restore`)[1].includes("KUBE-FIREWALL"));
  }
});

Deno.test("bindAddress node IP (nodeIP option) wins over the Node's IP for the source-range self-allow", async () => {
  const lb = () =>
    snapshot([
      makeState({
        ns: "ns",
        name: "lb",
        clusterIP: "172.30.0.5",
        lbVIPs: ["5.6.7.8"],
        nodePort: 30005,
        sourceRanges: ["10.20.0.0/16"],
      }, [{ ip: "10.0.0.1" }]),
    ], { nodeIPs: ["192.168.0.2"] });
  const selfAllow =
    /-A KUBE-FW-\w+ -m comment --comment "ns\/lb:p80 loadbalancer IP" -s 5.6.7.8 -j KUBE-EXT-/;
  for (
    const [nodeIP, allowed] of [
      [undefined, false], // the Node's 192.168.0.2 is outside 10.20.0.0/16
      ["10.20.0.5", true], // --bind-address=10.20.0.5
      ["0.0.0.0", false], // wildcard: ignored, as upstream
      ["fd00::5", false], // the other family's bindAddress: ignored by the IPv4 dataplane
    ] as const
  ) {
    const r = recorder();
    await dp(r, { nodeIP }).sync(lb());
    assert.equal(selfAllow.test(restores(r)[0]), allowed, String(nodeIP));
  }
});

Deno.test("nft backend: a full sync above 1,000 service ports warns once that iptables-nft-restore does not scale; legacy and smaller syncs do not", async () => {
  const many = (n: number) =>
    Array.from(
      { length: n },
      (_, i) =>
        makeState({ ns: "ns", name: `s${i}`, clusterIP: `172.30.${i >> 8}.${i & 255}` }, [{
          ip: "10.1.0.9",
        }]),
    );
  const warnings = () => logs.filter((l) => l.includes("iptables on the nft backend does not scale"));
  logs.length = 0;
  await dp(recorder(), { backend: "nft" }).sync(snapshot(many(1000)));
  await dp(recorder(), { backend: "legacy" }).sync(snapshot(many(1001)));
  assert.equal(warnings().length, 0, "at the limit, or on the legacy backend: no warning");
  const d = dp(recorder(), { backend: "nft" });
  await d.sync(snapshot(many(1001)));
  assert.equal(warnings().length, 1);
  assert.match(warnings()[0], /servicePorts=1001/);
  assert.match(warnings()[0], /restore="?iptables-nft-restore/);
  await d.sync({ ...snapshot(many(1002)), changedServices: null }); // another full sync
  assert.equal(warnings().length, 1, "said once per dataplane");
});
