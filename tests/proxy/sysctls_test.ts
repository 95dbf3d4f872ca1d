/** Conntrack sysctls and OOM score through a recording command runner; node manager rules. */
import assert from "node:assert/strict";
import { RecordingCommandRunner } from "../../lib/exec.ts";
import { configureLogging } from "../../lib/log.ts";
import {
  applyOOMScoreAdj,
  conntrackMax,
  cpuListSize,
  nodeOnlineCPUs,
  ONLINE_CPUS_PATH,
  setupConntrack,
} from "../../lib/conntrack/sysctls.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { detectNodeIPs, nodeHostIPs, NodeManager } from "../../lib/proxy/node_manager.ts";
import type { Node } from "../../lib/kube/types.ts";

configureLogging({ sink: () => {} });

Deno.test("conntrackMax() is max(maxPerCore x nCPU, min), 0 when maxPerCore is 0", () => {
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 131072 }, 2), 131072);
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 131072 }, 8), 262144);
  assert.equal(conntrackMax({ maxPerCore: 0, min: 131072 }, 8), 0);
});

Deno.test("conntrackMax() caps the scaled value at 1,048,576, even over min (v1.37 #137002)", () => {
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 131072 }, 32), 1_048_576);
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 131072 }, 33), 1_048_576);
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 2_000_000 }, 64), 1_048_576);
  assert.equal(conntrackMax({ maxPerCore: 32768, min: 2_000_000 }, 8), 2_000_000);
});

Deno.test("the CPU count is the node's online CPUs (v1.37 #140021), hardwareConcurrency when unreadable", () => {
  assert.equal(cpuListSize("0-3,6,8-9\n"), 7);
  assert.equal(cpuListSize("0"), 1);
  assert.equal(cpuListSize("x"), null);
  const paths: string[] = [];
  assert.equal(nodeOnlineCPUs((p) => (paths.push(p), "0-63\n")), 64);
  assert.deepEqual(paths, [ONLINE_CPUS_PATH]);
  assert.equal(
    nodeOnlineCPUs(() => {
      throw new Deno.errors.NotFound();
    }),
    navigator.hardwareConcurrency,
  );
});

Deno.test("setupConntrack() only ever raises nf_conntrack_max (v1.37)", async () => {
  for (const [current, wantWrite] of [["2000000", false], ["1048576", false], ["65536", true]] as const) {
    const runner = new RecordingCommandRunner((c) => {
      if (c.args[0] === "-n") {
        return { stdout: `${c.args[1] === "net.netfilter.nf_conntrack_max" ? current : 0}\n` };
      }
    });
    await setupConntrack(runner, {
      maxPerCore: 32768,
      min: 131072,
      tcpEstablishedTimeoutSeconds: 0,
      tcpCloseWaitTimeoutSeconds: 0,
      tcpBeLiberal: false,
      udpTimeoutSeconds: 0,
      udpStreamTimeoutSeconds: 0,
    }, { numCPU: 64 });
    const writes = runner.callsOf("sysctl").filter((c) => c.args[0] === "-w").map((c) => c.args[1]);
    assert.deepEqual(
      writes,
      wantWrite ? ["net.netfilter.nf_conntrack_max=1048576"] : [],
      `current ${current}`,
    );
  }
});

Deno.test("setupConntrack() writes only the values that differ", async () => {
  const current: Record<string, string> = {
    "net.netfilter.nf_conntrack_max": "131072",
    "net.netfilter.nf_conntrack_tcp_timeout_established": "432000",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait": "3600",
  };
  const runner = new RecordingCommandRunner((c) => {
    if (c.args[0] === "-n") return { stdout: `${current[c.args[1]] ?? 0}\n` };
    const [key, value] = c.args[1].split("=");
    current[key] = value;
  });
  const failed = await setupConntrack(runner, {
    maxPerCore: 32768,
    min: 131072,
    tcpEstablishedTimeoutSeconds: 86400,
    tcpCloseWaitTimeoutSeconds: 3600,
    tcpBeLiberal: true,
    udpTimeoutSeconds: 0,
    udpStreamTimeoutSeconds: 0,
  }, { numCPU: 2 });
  assert.deepEqual(failed, []);
  const writes = runner.callsOf("sysctl").filter((c) => c.args[0] === "-w").map((c) => c.args[1]);
  assert.deepEqual(writes, [
    "net.netfilter.nf_conntrack_tcp_timeout_established=86400",
    "net.netfilter.nf_conntrack_tcp_be_liberal=1",
  ]);
});

Deno.test("setupConntrack() reports a value that cannot be written and goes on", async () => {
  const runner = new RecordingCommandRunner((
    c,
  ) => (c.args[0] === "-w" ? { code: 255, stderr: "read-only" } : { stdout: "0" }));
  const failed = await setupConntrack(runner, {
    maxPerCore: 1,
    min: 10,
    tcpEstablishedTimeoutSeconds: 5,
    tcpCloseWaitTimeoutSeconds: 0,
    tcpBeLiberal: false,
    udpTimeoutSeconds: 0,
    udpStreamTimeoutSeconds: 0,
  }, { numCPU: 1 });
  assert.deepEqual(failed, [
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
  ]);
});

Deno.test("applyOOMScoreAdj() runs choom and only logs a failure", async () => {
  const ok = new RecordingCommandRunner();
  assert.equal(await applyOOMScoreAdj(ok, -999, 42), true);
  assert.deepEqual(ok.calls[0], { cmd: "choom", args: ["-n", "-999", "-p", "42"], stdin: "" });
  const bad = new RecordingCommandRunner(() => ({ code: 1, stderr: "permission denied" }));
  assert.equal(await applyOOMScoreAdj(bad, -999, 42), false);
});

const node = (addrs: [string, string][], extra: Partial<Node> = {}): Node => ({
  metadata: { name: "host1" },
  status: { addresses: addrs.map(([type, address]) => ({ type, address })) },
  ...extra,
});

Deno.test("nodeHostIPs() and detectNodeIPs() pick the primary IP as upstream", () => {
  assert.deepEqual(
    nodeHostIPs(node([["ExternalIP", "1.1.1.1"], ["InternalIP", "fd00::1"], ["InternalIP", "10.0.0.1"]])),
    [
      "fd00::1",
      "10.0.0.1",
    ],
  );
  assert.deepEqual(detectNodeIPs(undefined), {
    primaryFamily: "IPv4",
    ips: { IPv4: "127.0.0.1", IPv6: "::1" },
  });
  assert.deepEqual(detectNodeIPs(node([["InternalIP", "fd00::1"]])).primaryFamily, "IPv6");
  assert.deepEqual(detectNodeIPs(node([["InternalIP", "fd00::1"]]), "192.168.1.1"), {
    primaryFamily: "IPv4",
    ips: { IPv4: "192.168.1.1", IPv6: "fd00::1" },
  });
  assert.equal(detectNodeIPs(node([["InternalIP", "fd00::1"]]), "0.0.0.0").primaryFamily, "IPv6");
});

Deno.test("NodeManager waits for the node's IPs, then exits when they change or the node is deleted", async () => {
  const clock = new FakeClock(0);
  const exits: number[] = [];
  const nm = new NodeManager({ nodeName: "host1", exit: (c) => exits.push(c), clock, waitTimeoutMs: 10_000 });
  const waiting = nm.waitForNode();
  nm.onNodeAdd(node([]));
  nm.onNodeUpdate(null, node([["InternalIP", "10.0.0.1"]]));
  assert.deepEqual((await waiting).status?.addresses?.[0].address, "10.0.0.1");
  nm.onNodeUpdate(
    null,
    node([["InternalIP", "10.0.0.1"]], { metadata: { name: "host1", labels: { a: "b" } } }),
  );
  assert.deepEqual(exits, []);
  nm.onNodeUpdate(null, node([["InternalIP", "10.0.0.2"]]));
  assert.deepEqual(exits, [1]);
  nm.onNodeDelete(node([]));
  assert.deepEqual(exits, [1, 1]);
});

Deno.test("NodeManager times out waiting for a node without IPs, and watches podCIDRs in NodeCIDR mode", async () => {
  const clock = new FakeClock(0);
  const exits: number[] = [];
  const nm = new NodeManager({ nodeName: "host1", exit: (c) => exits.push(c), clock, waitTimeoutMs: 10_000 });
  const waiting = nm.waitForNode().then(() => "ok", (e: Error) => e.message);
  nm.onNodeAdd(node([]));
  await clock.advance(10_000);
  assert.match(await waiting, /host IP unknown/);
  const cidr = new NodeManager({ nodeName: "host1", watchPodCIDRs: true, exit: (c) => exits.push(c), clock });
  cidr.onNodeAdd(node([["InternalIP", "10.0.0.1"]], { spec: { podCIDRs: ["10.244.0.0/24"] } }));
  await cidr.waitForNode();
  cidr.onNodeUpdate(null, node([["InternalIP", "10.0.0.1"]], { spec: { podCIDRs: ["10.244.1.0/24"] } }));
  assert.deepEqual(exits, [1]);
});
