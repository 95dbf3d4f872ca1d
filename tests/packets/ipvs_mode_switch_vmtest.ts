/**
 * Switching iptables → ipvs → iptables → ipvs on one node, inside the IPVS VM, as an operator does by
 * changing `mode` and restarting. After each switch ClusterIP and NodePort traffic flows and only the running
 * mode's state exists: the agent removes the other mode's leftovers before its first sync (beyond upstream,
 * whose platformCleanup leaves the ipvs mode's virtual servers, kube-ipvs0 and ipsets behind when switching
 * to iptables; see lib/modes.ts).
 */
import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import { ipvsKernelUnavailableReason } from "../../testkit/ipvs_vm.ts";
import type { Probe } from "../../testkit/probe.ts";
import { Sandbox, type SandboxProcess } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, startSandboxAgent, tally } from "./helpers.ts";

const unavailable = ipvsKernelUnavailableReason(["iptables", "iptables-save", "conntrack"]);
if (unavailable) console.log(`ipvs mode switch test skipped: ${unavailable}`);
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

/** What of the ipvs mode is on the node: virtual servers, kube-ipvs0, KUBE- ipsets. */
async function ipvsState(sb: Sandbox): Promise<string[]> {
  const out: string[] = [];
  const vs = (await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout.trim();
  if (vs) out.push(...vs.split("\n"));
  if ((await sb.tryExec(sb.node, "ip", ["link", "show", "kube-ipvs0"])).code === 0) out.push("kube-ipvs0");
  const sets = (await sb.exec(sb.node, "ipset", ["list", "-n"])).stdout.split("\n");
  out.push(...sets.filter((s) => s.startsWith("KUBE-")));
  return out;
}

/** iptables-mode service chains in the nat table (both backends). */
async function iptablesServiceChains(sb: Sandbox): Promise<number> {
  let n = 0;
  for (const save of ["iptables-legacy-save", "iptables-nft-save"]) {
    const r = await sb.tryExec(sb.node, save, ["-t", "nat"]);
    if (r.code === 0) n += r.stdout.split("\n").filter((l) => /^:KUBE-(SVC|SEP)-/.test(l)).length;
  }
  return n;
}

Deno.test({
  name: "packets: switching iptables -> ipvs -> iptables -> ipvs keeps Services working, one mode's state",
  ignore: unavailable !== undefined,
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

      for (const mode of ["iptables", "ipvs", "iptables", "ipvs"] as const) {
        await t.step(`${mode}: ClusterIP and NodePort work, only ${mode} state exists`, async () => {
          await agent?.stop(10_000);
          agent = startSandboxAgent(sb, sim!.kubeconfig, { nodeName: NODE, mode });
          await agent.waitForOutput("SyncProxyRules complete", 60_000);
          await serving(agent, pn, "10.96.0.10", 80);
          await serving(agent, pc, sb.nodeIP, 30080);
          const got = tally(
            await pn.repeat({ op: "tcp", host: "10.96.0.10", port: 80, timeoutMs: 1000 }, 20),
          );
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
          const r = await pc.tcp(sb.nodeIP, 30080);
          assert.ok(!r.answer!.includes(` ${sb.clientIP}:`), `NodePort masqueraded: ${r.answer}`);
          const ipvs = await ipvsState(sb);
          if (mode === "ipvs") {
            assert.equal(await iptablesServiceChains(sb), 0, "the iptables mode's chains were removed");
            assert.ok(ipvs.includes("kube-ipvs0") && ipvs.includes("KUBE-CLUSTER-IP"), ipvs.join("\n"));
            assert.ok(ipvs.includes("-A -t 10.96.0.10:80 -s rr"), ipvs.join("\n"));
          } else {
            assert.ok((await iptablesServiceChains(sb)) > 0);
            assert.deepEqual(ipvs, [], `the ipvs mode's state was removed:\n${agent.tail()}`);
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
