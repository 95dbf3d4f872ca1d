/**
 * The ipvs mode on its Fake kernel (`lib/dataplane/ipvs/fake.ts`): what the dataplane writes lands in typed
 * state that the tools' dumps read back unchanged, a restarted agent finds nothing to write, the packet tracer
 * over the state read back follows every sync, and the Fake refuses what the real tools refuse.
 */
import assert from "node:assert/strict";
import { readLiveIpvs, traceIpvs } from "../../../lib/cli/explain_trace_ipvs.ts";
import type { TracePacket } from "../../../lib/dataplane/iptables/trace.ts";
import { iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables_local_detector.ts";
import { IpvsDataplane } from "../../../lib/dataplane/ipvs/dataplane.ts";
import { FakeIpvsKernel } from "../../../lib/dataplane/ipvs/fake.ts";
import { parseIpsetSave } from "../../../lib/dataplane/ipvs/ipsets.ts";
import { parseIpvsadmSave } from "../../../lib/dataplane/ipvs/ipvsadm.ts";
import { configureLogging } from "../../../lib/log.ts";
import { FakeClock } from "../../../lib/proxy/clock.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { outcomeLines, tcpPacket } from "../../cli/helpers.ts";

configureLogging({ sink: () => {} });

const NODE_IP = "192.168.0.2";
const CLIENT = "203.0.113.9";

function states(eps = [{ ip: "10.244.0.5", local: true }, { ip: "10.244.1.5" }]) {
  return [
    makeState({ ns: "ns", name: "web", clusterIP: "10.96.0.10", nodePort: 30010 }, eps),
    makeState(
      {
        ns: "ns",
        name: "lb",
        clusterIP: "10.96.0.11",
        lbVIPs: ["172.30.0.11"],
        sourceRanges: ["198.51.100.0/24"],
      },
      [{ ip: "10.244.1.6" }],
    ),
    makeState({ ns: "ns", name: "empty", clusterIP: "10.96.0.12" }, []),
  ];
}

function dataplane(kernel: FakeIpvsKernel) {
  return new IpvsDataplane({
    family: "IPv4",
    runner: kernel,
    iptables: iptablesTools("system", "IPv4"),
    clock: new FakeClock(0),
    localDetector: detectLocalByCIDR("10.244.0.0/16"),
  });
}

async function trace(
  kernel: FakeIpvsKernel,
  src: string,
  from: TracePacket["from"],
  dst: string,
  dport = 80,
) {
  return outcomeLines(
    traceIpvs(await readLiveIpvs(kernel, "IPv4"), tcpPacket(src, from, dst, dport, [NODE_IP])),
  );
}

Deno.test("ipvs Fake: a sync lands, the dumps read back as the same state, and a restarted agent writes nothing new", async () => {
  const kernel = new FakeIpvsKernel([NODE_IP]);
  await dataplane(kernel).sync(snapshot(states(), { nodeIPs: [NODE_IP] }));
  assert.deepEqual(
    [...kernel.virtualServers.keys()].sort(),
    ["-t 10.96.0.10:80", "-t 10.96.0.11:80", "-t 10.96.0.12:80", "-t 172.30.0.11:80", `-t ${NODE_IP}:30010`],
  );
  assert.deepEqual(parseIpvsadmSave(kernel.saveIpvs()), kernel.virtualServers);
  const sets = parseIpsetSave(kernel.saveIpsets());
  for (const [name, s] of kernel.sets) assert.deepEqual(sets.get(name)?.entries, s.entries, name);
  assert.deepEqual(kernel.addresses("kube-ipvs0").sort(), [
    "10.96.0.10",
    "10.96.0.11",
    "10.96.0.12",
    "172.30.0.11",
  ]);

  // A restarted agent reads the kernel on its first (full) sync and finds every object in place.
  const before = kernel.calls.length;
  await dataplane(kernel).sync(snapshot(states(), { nodeIPs: [NODE_IP] }));
  const writes = kernel.calls.slice(before);
  assert.ok(!writes.includes("ip -force -batch -"), writes.join("\n"));
  assert.ok(!writes.includes("ipvsadm -R"), writes.join("\n"));
  assert.deepEqual(parseIpvsadmSave(kernel.saveIpvs()).size, 5);
});

Deno.test("ipvs Fake + tracer: packets traced through the state read back follow each sync", async () => {
  const kernel = new FakeIpvsKernel([NODE_IP]);
  const dp = dataplane(kernel);
  await dp.sync(snapshot(states(), { nodeIPs: [NODE_IP] }));
  assert.deepEqual(await trace(kernel, "10.244.0.9", "pod", "10.96.0.10"), [
    "dnat 10.244.0.5:80 0.5",
    "dnat 10.244.1.5:80 0.5",
  ]);
  assert.deepEqual(await trace(kernel, CLIENT, "outside", NODE_IP, 30010), [
    "dnat 10.244.0.5:80 masq 0.5",
    "dnat 10.244.1.5:80 masq 0.5",
  ]);
  assert.deepEqual(await trace(kernel, CLIENT, "outside", "172.30.0.11"), ["drop 1"]);
  assert.deepEqual(await trace(kernel, "198.51.100.7", "outside", "172.30.0.11"), [
    "dnat 10.244.1.6:80 masq 1",
  ]);
  assert.deepEqual(await trace(kernel, "10.244.0.9", "pod", "10.96.0.12"), ["reject 1"]);

  // One endpoint gone (a partial sync): IPVS stops sending it new connections.
  await dp.sync(snapshot(states([{ ip: "10.244.1.5" }]), { nodeIPs: [NODE_IP], changed: ["ns/web"] }));
  assert.deepEqual(await trace(kernel, "10.244.0.9", "pod", "10.96.0.10"), ["dnat 10.244.1.5:80 1"]);
  // The Service gone: its address leaves kube-ipvs0 and the packet is no longer the node's.
  await dp.sync(snapshot(states().slice(1), { nodeIPs: [NODE_IP], changed: ["ns/web"] }));
  assert.ok(!kernel.addresses("kube-ipvs0").includes("10.96.0.10"));
  assert.deepEqual(await trace(kernel, "10.244.0.9", "pod", "10.96.0.10"), ["untouched 1"]);
});

Deno.test("ipvs Fake: refuses what the tools refuse, with an error and a non-zero exit", async () => {
  const kernel = new FakeIpvsKernel([NODE_IP]);
  const r1 = await kernel.tryRun({
    cmd: "ipvsadm",
    args: ["-R"],
    stdin: "-a -t 10.96.0.1:80 -r 10.244.0.1:80 -m -w 1\n",
  });
  assert.notEqual(r1.code, 0);
  assert.match(r1.stderr, /Service not defined/);
  const r2 = await kernel.tryRun({
    cmd: "ipset",
    args: ["restore"],
    stdin: "add KUBE-CLUSTER-IP 10.96.0.1,tcp:80\n",
  });
  assert.notEqual(r2.code, 0);
  assert.match(r2.stderr, /Error in line 1: The set with the given name does not exist/);
  const r3 = await kernel.tryRun({
    cmd: "ip",
    args: ["-force", "-batch", "-"],
    stdin: "addr replace 10.96.0.1/32 dev kube-ipvs0\n",
  });
  assert.notEqual(r3.code, 0);
  assert.match(r3.stderr, /Cannot find device "kube-ipvs0"/);
  const r4 = await kernel.tryRun({
    cmd: "iptables-restore",
    args: ["--noflush"],
    stdin: "*nat\n-A KUBE-NOPE -j ACCEPT\nCOMMIT\n",
  });
  assert.notEqual(r4.code, 0);
  const r5 = await kernel.tryRun({ cmd: "modprobe", args: ["ip_vs"] });
  assert.notEqual(r5.code, 0, "a command the Fake does not emulate fails rather than passing silently");
});
