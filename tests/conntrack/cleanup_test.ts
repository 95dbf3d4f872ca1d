/** Stale UDP conntrack cleanup: parser + decision on recorded output, and a real netns run. */
import assert from "node:assert/strict";
import { RecordingCommandRunner } from "../../lib/exec.ts";
import {
  cleanStaleUDPConntrack,
  deleteBatch,
  parseConntrackList,
  staleUDPFlows,
} from "../../lib/conntrack/cleanup.ts";
import { configureLogging } from "../../lib/log.ts";
import { makeState, snapshot } from "../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../testkit/netns.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

configureLogging({ sink: () => {} });

const LIST = [
  // to the ClusterIP, DNATed to a serving endpoint: keep
  "udp      17 29 src=10.0.0.1 dst=172.30.0.48 sport=5000 dport=53 src=10.180.0.8 dst=10.0.0.1 sport=5353 dport=5000 [ASSURED] mark=0 use=1",
  // to the ClusterIP, pinned to an endpoint that is gone: delete
  "udp      17 29 src=10.0.0.2 dst=172.30.0.48 sport=5001 dport=53 src=10.180.0.9 dst=10.0.0.2 sport=5353 dport=5001 mark=0 use=1",
  // to the ClusterIP, never DNATed (black-holed while there were no endpoints): delete
  "udp      17 29 src=10.0.0.3 dst=172.30.0.48 sport=5002 dport=53 [UNREPLIED] src=172.30.0.48 dst=10.0.0.3 sport=53 dport=5002 mark=0 use=1",
  // to the NodePort on a node IP, pinned to a non-serving (terminating) endpoint: delete
  "ipv4     2 udp      17 29 src=1.1.1.1 dst=192.168.0.2 sport=7000 dport=30053 src=10.180.0.10 dst=1.1.1.1 sport=5353 dport=7000 mark=0 use=1",
  // another port of the same IP (not a UDP service port): keep
  "udp      17 29 src=10.0.0.4 dst=172.30.0.48 sport=5003 dport=54 [UNREPLIED] src=172.30.0.48 dst=10.0.0.4 sport=54 dport=5003 mark=0 use=1",
  // unrelated destination: keep
  "udp      17 29 src=10.0.0.5 dst=8.8.8.8 sport=5004 dport=53 src=8.8.8.8 dst=10.0.0.5 sport=53 dport=5004 mark=0 use=1",
  // right IP but wrong endpoint port: delete
  "udp      17 29 src=10.0.0.6 dst=172.30.0.48 sport=5005 dport=53 src=10.180.0.8 dst=10.0.0.6 sport=9999 dport=5005 mark=0 use=1",
].join("\n");

function dnsSnapshot() {
  return snapshot([
    makeState({
      ns: "kube-system",
      name: "dns",
      protocol: "UDP",
      clusterIP: "172.30.0.48",
      portNum: 53,
      nodePort: 30053,
    }, [
      { ip: "10.180.0.8", port: 5353 },
      { ip: "10.180.0.10", port: 5353, ready: false, serving: false, terminating: true },
    ]),
    makeState({ ns: "x", name: "tcp", clusterIP: "172.30.0.49", portNum: 54 }, []),
  ]);
}

Deno.test("parse + decide: exactly the stale UDP flows", () => {
  const flows = parseConntrackList(LIST, "IPv4");
  assert.equal(flows.length, 7);
  const stale = staleUDPFlows(dnsSnapshot(), flows);
  assert.deepEqual(stale.map((f) => f.origSport), [5001, 5002, 7000, 5005]);
  assert.equal(
    deleteBatch(stale.slice(0, 1)),
    "-D -p udp -s 10.0.0.2 -d 172.30.0.48 --sport 5001 --dport 53 -r 10.180.0.9\n",
  );
});

Deno.test("one list, one batched delete", async () => {
  const r = new RecordingCommandRunner((c) => (c.args[0] === "-L" ? { stdout: LIST } : undefined));
  assert.equal(await cleanStaleUDPConntrack(r, dnsSnapshot()), 4);
  assert.deepEqual(r.calls.map((c) => c.args.join(" ")), ["-L -f ipv4 -p udp", "-R /dev/stdin"]);
  assert.equal(r.calls[1].stdin.split("\n").filter(Boolean).length, 4);
  // No UDP service: nothing runs.
  const r2 = new RecordingCommandRunner();
  assert.equal(await cleanStaleUDPConntrack(r2, snapshot([])), 0);
  assert.equal(r2.calls.length, 0);
});

Deno.test("IPv6 spellings are compared canonically", () => {
  const out =
    "udp      17 29 src=fd00::1 dst=fd00:1:0:0::10 sport=5000 dport=53 src=fd00:0::5 dst=fd00::1 sport=53 dport=5000 mark=0 use=1";
  const snap = snapshot([
    makeState({ ns: "a", name: "d", protocol: "UDP", clusterIP: "fd00:1::10", portNum: 53 }, [{
      ip: "fd00::5",
      port: 53,
    }]),
  ], { family: "IPv6" });
  assert.deepEqual(staleUDPFlows(snap, parseConntrackList(out, "IPv6")), []);
  assert.deepEqual(parseConntrackList(out, "IPv4"), []);
});

privilegedTest(netnsUnavailableReason(), {
  name: "netns: real UDP conntrack entries, only the stale ones are deleted",
  fn: () =>
    withNetns(async (runner) => {
      const ins = (s: string, sp: number, d: string, dp: number, rs: string, rsp: number) =>
        runner.run({
          cmd: "conntrack",
          args: [
            "-I",
            "-p",
            "udp",
            "-s",
            s,
            "-d",
            d,
            "--sport",
            String(sp),
            "--dport",
            String(dp),
            "-r",
            rs,
            "-q",
            s,
            "--reply-port-src",
            String(rsp),
            "--reply-port-dst",
            String(sp),
            "-t",
            "120",
          ],
        });
      await ins("10.0.0.1", 5000, "172.30.0.48", 53, "10.180.0.8", 5353); // keep
      await ins("10.0.0.2", 5001, "172.30.0.48", 53, "10.180.0.9", 5353); // stale
      await ins("10.0.0.3", 5002, "172.30.0.48", 53, "172.30.0.48", 53); // stale (never DNATed)
      await ins("1.1.1.1", 7000, "192.168.0.2", 30053, "10.180.0.10", 5353); // stale (not serving)
      await ins("10.0.0.5", 5004, "8.8.8.8", 53, "8.8.8.8", 53); // keep
      assert.equal(await cleanStaleUDPConntrack(runner, dnsSnapshot()), 3);
      const left = (await runner.run({ cmd: "conntrack", args: ["-L", "-p", "udp"] })).stdout;
      const sports = parseConntrackList(left, "IPv4").map((f) => f.origSport).sort();
      assert.deepEqual(sports, [5000, 5004]);
    }),
});

privilegedTest(netnsUnavailableReason(), {
  name: "netns: real UDP conntrack entries of a Service without endpoints, and of a deleted one, are deleted",
  fn: () =>
    withNetns(async (runner) => {
      const ins = (s: string, sp: number, d: string, dp: number, rs: string, rsp: number) =>
        runner.run({
          cmd: "conntrack",
          args: [
            "-I",
            "-p",
            "udp",
            "-s",
            s,
            "-d",
            d,
            "--sport",
            String(sp),
            "--dport",
            String(dp),
            "-r",
            rs,
            "-q",
            s,
          ]
            .concat(["--reply-port-src", String(rsp), "--reply-port-dst", String(sp), "-t", "120"]),
        });
      const sports = async () =>
        parseConntrackList((await runner.run({ cmd: "conntrack", args: ["-L", "-p", "udp"] })).stdout, "IPv4")
          .map((f) => f.origSport).sort();
      await ins("10.0.0.1", 5000, "172.30.0.48", 53, "10.180.0.8", 5353); // was served by a deleted endpoint
      await ins("10.0.0.2", 5001, "172.30.0.48", 53, "172.30.0.48", 53); // never DNATed
      await ins("1.1.1.1", 7000, "192.168.0.2", 30053, "10.180.0.8", 5353); // NodePort: kept
      await ins("10.0.0.3", 5002, "172.30.0.50", 53, "10.180.0.9", 5353); // another Service, deleted below
      await ins("10.0.0.5", 5004, "8.8.8.8", 53, "8.8.8.8", 53); // unrelated: kept
      const noEndpoints = snapshot([
        makeState(
          {
            ns: "kube-system",
            name: "dns",
            protocol: "UDP",
            clusterIP: "172.30.0.48",
            portNum: 53,
            nodePort: 30053,
          },
          [],
        ),
      ]);
      assert.equal(await cleanStaleUDPConntrack(runner, noEndpoints), 2);
      assert.deepEqual(await sports(), [5002, 5004, 7000]);
      const deleted = {
        protocol: "UDP" as const,
        clusterIP: "172.30.0.50",
        loadBalancerVIPs: [],
        externalIPs: [],
        port: 53,
      };
      assert.equal(await cleanStaleUDPConntrack(runner, noEndpoints, "IPv4", [deleted]), 1);
      assert.deepEqual(await sports(), [5004, 7000]);
    }),
});

Deno.test("UDP service with no serving endpoints: its ClusterIP flows are deleted, its NodePort flows kept (v1.37 #139629)", async () => {
  const snap = snapshot([
    makeState({
      ns: "kube-system",
      name: "dns",
      protocol: "UDP",
      clusterIP: "172.30.0.48",
      portNum: 53,
      nodePort: 30053,
    }, [{ ip: "10.180.0.10", port: 5353, ready: false, serving: false, terminating: true }]),
  ]);
  const flows = parseConntrackList(LIST, "IPv4");
  // Every flow to 172.30.0.48:53, the one DNATed to a serving endpoint before included; the NodePort flow
  // (port 30053, matched on the port alone) and the other destinations stay.
  assert.deepEqual(staleUDPFlows(snap, flows).map((f) => f.origSport), [5000, 5001, 5002, 5005]);
  const r = new RecordingCommandRunner((c) => (c.args[0] === "-L" ? { stdout: LIST } : undefined));
  assert.equal(await cleanStaleUDPConntrack(r, snap), 4);
  assert.deepEqual(r.calls.map((c) => c.args[0]), ["-L", "-R"]);
  // With no endpoint at all, the same.
  const none = snapshot([
    makeState(
      { ns: "a", name: "u", protocol: "UDP", clusterIP: "172.30.0.48", portNum: 53, nodePort: 30053 },
      [],
    ),
  ]);
  assert.deepEqual(staleUDPFlows(none, flows).map((f) => f.origSport), [5000, 5001, 5002, 5005]);
});

Deno.test("a deleted UDP Service: its frontends' flows are deleted, unless a current port took the address over (v1.38 #141371)", async () => {
  const flows = parseConntrackList(LIST, "IPv4");
  const dns = {
    protocol: "UDP" as const,
    clusterIP: "172.30.0.48",
    loadBalancerVIPs: [],
    externalIPs: [],
    port: 53,
  };
  // Nothing left of the Service: every flow to 172.30.0.48:53 goes; the NodePort's are left alone.
  assert.deepEqual(staleUDPFlows(snapshot([]), flows, [dns]).map((f) => f.origSport), [
    5000,
    5001,
    5002,
    5005,
  ]);
  const r = new RecordingCommandRunner((c) => (c.args[0] === "-L" ? { stdout: LIST } : undefined));
  assert.equal(await cleanStaleUDPConntrack(r, snapshot([]), "IPv4", [dns]), 4);
  assert.deepEqual(r.calls.map((c) => c.args[0]), ["-L", "-R"]);
  // A new Service on the same ClusterIP and port: its serving endpoints' flows are kept.
  assert.deepEqual(staleUDPFlows(dnsSnapshot(), flows, [dns]).map((f) => f.origSport), [
    5001,
    5002,
    7000,
    5005,
  ]);
  // A deleted TCP port: nothing.
  assert.deepEqual(staleUDPFlows(snapshot([]), flows, [{ ...dns, protocol: "TCP" }]), []);
});
