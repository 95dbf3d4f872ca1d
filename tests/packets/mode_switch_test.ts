/**
 * Switching proxy modes on one node, as an operator does by changing `mode` and restarting: iptables →
 * nftables → iptables, with the same Services. After each switch traffic flows, and the previous mode's
 * rules are gone (the agent removes other modes' leftovers before its first sync).
 */
import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe } from "../../testkit/probe.ts";
import { Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, startSandboxAgent, tally } from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason([
  "ip",
  "iptables",
  "iptables-save",
  "nft",
  "conntrack",
  "sysctl",
]);
const NODE = "node1";

async function serving(agent: SandboxProcess, probe: Probe, host: string, port: number): Promise<void> {
  let exited = false;
  agent.status.then(() => exited = true);
  await eventually(
    `${host}:${port} to be served`,
    async () => {
      if (exited) throw new Error(`the agent exited:\n${agent.tail()}`);
      const r = await probe.tcp(host, port, { timeoutMs: 300 });
      return r.result === "ok" ? r : undefined;
    },
    30_000,
    200,
  );
}

async function iptablesServiceChains(sb: Sandbox): Promise<number> {
  let n = 0;
  for (const save of ["iptables-legacy-save", "iptables-nft-save"]) {
    const r = await sb.tryExec(sb.node, save, ["-t", "nat"]);
    if (r.code === 0) n += r.stdout.split("\n").filter((l) => /^:KUBE-(SVC|SEP)-/.test(l)).length;
  }
  return n;
}

async function hasNftTable(sb: Sandbox): Promise<boolean> {
  return (await sb.exec(sb.node, "nft", ["list", "tables"])).stdout.includes("kube-proxy");
}

privilegedTest(unavailable, {
  name:
    "packets: switching iptables -> nftables -> iptables keeps Services working and leaves one mode's rules",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const sb = await Sandbox.create({ pods: ["pod-a", "pod-b"] });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b");
      await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080] })));
      sim = await SimulatorProcess.start({ netns: sb.node });
      await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      await sim.upsert(service({
        name: "web",
        clusterIP: "10.96.0.10",
        type: "NodePort",
        ports: [{ port: 80, nodePort: 30080 }],
      }));
      await sim.upsert(endpointSlice("web", [{ ip: a.ip, node: NODE }, { ip: b.ip, node: NODE }]));
      const [pc, pn] = await Promise.all([sb.probe(sb.client), sb.probe(sb.node)]);

      for (const mode of ["iptables", "nftables", "iptables"] as const) {
        await t.step(`${mode}: ClusterIP and NodePort work, only ${mode} rules exist`, async () => {
          await agent?.stop(10_000);
          agent = startSandboxAgent(sb, sim!.kubeconfig, { nodeName: NODE, mode });
          // The previous mode's rules stay in place until the new agent's first sync replaces them.
          await agent.waitForOutput("SyncProxyRules complete", 30_000);
          await serving(agent, pn, "10.96.0.10", 80);
          await serving(agent, pc, sb.nodeIP, 30080);
          const got = tally(
            await pn.repeat({ op: "tcp", host: "10.96.0.10", port: 80, timeoutMs: 1000 }, 30),
          );
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
          if (mode === "nftables") {
            assert.equal(await iptablesServiceChains(sb), 0, "iptables mode's chains were removed");
            assert.ok(await hasNftTable(sb));
          } else {
            assert.ok((await iptablesServiceChains(sb)) > 0);
            assert.equal(await hasNftTable(sb), false, "the nftables table was removed");
          }
        });
      }
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
  },
});
