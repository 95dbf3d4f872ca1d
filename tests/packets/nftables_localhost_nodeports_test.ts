/**
 * KubeProxyNFTablesLocalhostNodePorts (alpha in v1.37, off by default) in nftables mode, with real packets: the
 * agent runs with the gate on and the default nodePortAddresses (no loopback), so, as upstream v1.37, traffic to a
 * NodePort on 127.0.0.1 is rejected and counted (`localhost-nodeport-rejected-tcp`) before it reaches whatever
 * listens there, while other localhost ports and the NodePort on the node's address are untouched.
 */
import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, startSandboxAgent } from "./helpers.ts";

const NODE = "node1";

/** Packets counted by a named counter of the `ip kube-proxy` table. */
async function counted(sb: Sandbox, name: string): Promise<number> {
  const out = (await sb.exec(sb.node, "nft", ["list", "counter", "ip", "kube-proxy", name])).stdout;
  return Number(/packets (\d+)/.exec(out)?.[1] ?? NaN);
}

privilegedTest(sandboxUnavailableReason(["ip", "nft", "conntrack", "sysctl"]), {
  name: "packets (nftables, KubeProxyNFTablesLocalhostNodePorts): a NodePort on 127.0.0.1 is rejected and " +
    "counted, other localhost ports and the node address's NodePort are not",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const sb = await Sandbox.create({ pods: ["pod-a"] });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    try {
      const a = sb.pod("pod-a");
      await sb.startServer(a.ns, { tcp: [8080] });
      // Something of the node's own listens on the NodePort and on another port, on every address.
      await sb.startServer(sb.node, { name: "node-local", tcp: [30080, 30090] });
      sim = await SimulatorProcess.start({ netns: sb.node });
      await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      await sim.upsert(
        service({
          name: "np",
          clusterIP: "10.96.0.11",
          type: "NodePort",
          ports: [{ port: 80, nodePort: 30080 }],
        }),
      );
      await sim.upsert(endpointSlice("np", [{ ip: a.ip, node: NODE }]));
      const pn = await sb.probe(sb.node);
      const pc = await sb.probe(sb.client);
      // Before the agent: the node's listener answers on 127.0.0.1:30080.
      assert.match((await pn.tcp("127.0.0.1", 30080)).answer ?? "", /^node-local /);
      agent = startSandboxAgent(sb, sim.kubeconfig, {
        nodeName: NODE,
        mode: "nftables",
        extraArgs: ["--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true"],
      });
      await eventually(
        "the NodePort on the node's address",
        async () => {
          const r = await pc.tcp(sb.nodeIP, 30080, { timeoutMs: 300 });
          return r.answer?.startsWith("pod-a ") ? r : undefined;
        },
        30_000,
        200,
      ).catch((err) => {
        throw new Error(`${err.message}\n${agent!.tail()}`);
      });
      const before = await counted(sb, "localhost-nodeport-rejected-tcp");
      const r = await pn.tcp("127.0.0.1", 30080, { timeoutMs: 2000 });
      assert.equal(r.result, "refused", JSON.stringify(r));
      assert.equal(await counted(sb, "localhost-nodeport-rejected-tcp"), before + 1, "the SYN was counted");
      assert.match(
        (await pn.tcp("127.0.0.1", 30090)).answer ?? "",
        /^node-local /,
        "not a NodePort: untouched",
      );
      assert.equal(await counted(sb, "localhost-nodeport-rejected-udp"), 0);
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  },
});
