/**
 * The mode-switch scenario shared by tests/packets/mode_switch_test.ts (iptables ↔ nftables, on the host) and
 * ipvs_mode_switch_vmtest.ts (iptables ↔ ipvs, in the IPVS VM): one node with a NodePort Service over two
 * pods; for each mode in turn the agent is restarted in that mode, ClusterIP and NodePort traffic must reach
 * both pods (NodePort masqueraded), and the caller checks that only that mode's state is left.
 */
import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe } from "../../testkit/probe.ts";
import { Sandbox, type SandboxProcess } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, startSandboxAgent, tally } from "./helpers.ts";

const NODE = "node1";

/** Waits until `host:port` answers through `probe`; fails at once when the agent exits. */
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

/** iptables-mode service chains in the nat table (both backends). */
export async function iptablesServiceChains(sb: Sandbox): Promise<number> {
  let n = 0;
  for (const save of ["iptables-legacy-save", "iptables-nft-save"]) {
    const r = await sb.tryExec(sb.node, save, ["-t", "nat"]);
    if (r.code === 0) n += r.stdout.split("\n").filter((l) => /^:KUBE-(SVC|SEP)-/.test(l)).length;
  }
  return n;
}

/**
 * Runs the agent in each of `modes` in turn (one test step each) on one sandbox node and checks traffic;
 * `onlyState(mode, sb, agent)` then asserts that only that mode's state exists.
 */
export async function switchModes<M extends "iptables" | "nftables" | "ipvs">(
  t: Deno.TestContext,
  modes: readonly M[],
  onlyState: (mode: M, sb: Sandbox, agent: SandboxProcess) => Promise<void>,
): Promise<void> {
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

    for (const mode of modes) {
      await t.step(`${mode}: ClusterIP and NodePort work, only ${mode} state exists`, async () => {
        await agent?.stop(10_000);
        agent = startSandboxAgent(sb, sim!.kubeconfig, { nodeName: NODE, mode });
        // The previous mode's rules stay in place until the new agent's first sync replaces them.
        await agent.waitForOutput("SyncProxyRules complete", 60_000);
        await serving(agent, pn, "10.96.0.10", 80);
        await serving(agent, pc, sb.nodeIP, 30080);
        const got = tally(await pn.repeat({ op: "tcp", host: "10.96.0.10", port: 80, timeoutMs: 1000 }, 30));
        assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
        const r = await pc.tcp(sb.nodeIP, 30080);
        assert.ok(!r.answer!.includes(` ${sb.clientIP}:`), `NodePort masqueraded: ${r.answer}`);
        await onlyState(mode, sb, agent);
      });
    }
  } finally {
    await agent?.stop(5000).catch(() => {});
    await sim?.close().catch(() => {});
    await sb.destroy();
  }
}
