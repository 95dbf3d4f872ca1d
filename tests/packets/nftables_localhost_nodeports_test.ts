/**
 * KubeProxyNFTablesLocalhostNodePorts (alpha in v1.37, off by default) in nftables mode, with real packets, as
 * upstream v1.37 behaves:
 * - nodePortAddresses without loopback (the default): traffic to a NodePort on 127.0.0.1 is rejected and counted
 *   (`localhost-nodeport-rejected-tcp`) before it reaches whatever listens there; other localhost ports and the
 *   NodePort on the node's address are untouched;
 * - nodePortAddresses naming 127.0.0.0/8: the agent's loopback listener serves TCP NodePorts that have endpoints
 *   (and follows endpoint changes), a TCP NodePort without endpoints is refused, UDP ones are rejected and counted.
 * Both read on the agent's /metrics too: `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` (the
 * counters, read at scrape time) and `kubeproxy_nftables_localhost_nodeport_listeners` (the listeners bound).
 */
import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, startSandboxAgent } from "./helpers.ts";

const GATE = "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true";

const NODE = "node1";

/** Packets counted by a named counter of the `ip kube-proxy` table. */
async function counted(sb: Sandbox, name: string): Promise<number> {
  const out = (await sb.exec(sb.node, "nft", ["list", "counter", "ip", "kube-proxy", name])).stdout;
  return Number(/packets (\d+)/.exec(out)?.[1] ?? NaN);
}

/** One sample of the agent's /metrics (in the node namespace), by its exact name and labels; null when absent. */
async function metric(sb: Sandbox, series: string): Promise<number | null> {
  const r = await sb.tryExec(sb.node, Deno.execPath(), [
    "eval",
    "const r = await fetch('http://127.0.0.1:10249/metrics'); console.log(await r.text())",
  ]);
  const line = r.stdout.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? null : Number(line.slice(series.length + 1));
}

const REJECTED = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
const LISTENERS = "kubeproxy_nftables_localhost_nodeport_listeners";

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
        extraArgs: [GATE],
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
      assert.equal(
        await metric(sb, `${REJECTED}{ip_family="IPv4",protocol="TCP"}`),
        before + 1,
        "on /metrics",
      );
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

privilegedTest(sandboxUnavailableReason(["ip", "nft", "conntrack", "sysctl"]), {
  name: "packets (nftables, KubeProxyNFTablesLocalhostNodePorts, nodePortAddresses with 127.0.0.0/8): a " +
    "loopback listener serves TCP NodePorts with endpoints; without endpoints refused; UDP rejected and counted",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    const sb = await Sandbox.create({ pods: ["pod-a", "pod-b"] });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b");
      await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081] })));
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
      await sim.upsert(
        service({
          name: "none",
          clusterIP: "10.96.0.12",
          type: "NodePort",
          ports: [{ port: 80, nodePort: 30082 }],
        }),
      );
      await sim.upsert(endpointSlice("none", []));
      const udp = [{ port: 53, protocol: "UDP" as const, nodePort: 30053 }];
      await sim.upsert(service({ name: "dns", clusterIP: "10.96.0.13", type: "NodePort", ports: udp }));
      await sim.upsert(endpointSlice("dns", [{ ip: a.ip, node: NODE }], udp));
      const pn = await sb.probe(sb.node);
      agent = startSandboxAgent(sb, sim.kubeconfig, {
        nodeName: NODE,
        mode: "nftables",
        extraArgs: [GATE, `--nodeport-addresses=127.0.0.0/8,${sb.nodeIP}/32`],
      });
      await eventually(
        "the loopback listener of NodePort 30080",
        async () => {
          const r = await pn.tcp("127.0.0.1", 30080, { timeoutMs: 300 });
          return r.answer?.startsWith("pod-a ") ? r : undefined;
        },
        30_000,
        200,
      ).catch((err) => {
        throw new Error(`${err.message}\n${agent!.tail()}`);
      });
      assert.equal((await pn.tcp("127.0.0.1", 30082, { timeoutMs: 2000 })).result, "refused", "no endpoints");
      // One listener: NodePort 30080 (30082 has no endpoints, 30053 is UDP).
      assert.equal(await metric(sb, `${LISTENERS}{ip_family="IPv4"}`), 1);
      const udpRejected = `${REJECTED}{ip_family="IPv4",protocol="UDP"}`;
      assert.equal(await counted(sb, "localhost-nodeport-rejected-udp"), 0);
      assert.equal(await metric(sb, udpRejected), 0);
      await pn.udp("127.0.0.1", 30053, { timeoutMs: 500 });
      assert.equal(await counted(sb, "localhost-nodeport-rejected-udp"), 1, "the UDP datagram was rejected");
      await eventually("the rejected UDP datagram on /metrics", async () => {
        const v = await metric(sb, udpRejected);
        return v === 1 ? v : undefined;
      }, 5000);
      // The NodePort's endpoints change: the listener follows.
      await sim.upsert(endpointSlice("np", [{ ip: b.ip, node: NODE }]));
      await eventually("NodePort 30080 on loopback to reach pod-b", async () => {
        const r = await pn.tcp("127.0.0.1", 30080, { timeoutMs: 300 });
        return r.answer?.startsWith("pod-b ") ? r : undefined;
      }, 5000);
      // Its last endpoint gone: the listener closes.
      await sim.upsert(endpointSlice("np", []));
      await eventually("NodePort 30080 on loopback to be refused", async () => {
        const r = await pn.tcp("127.0.0.1", 30080, { timeoutMs: 300 });
        return r.result === "refused" ? r : undefined;
      }, 5000);
      await eventually("no listener on /metrics", async () => {
        const v = await metric(sb, `${LISTENERS}{ip_family="IPv4"}`);
        return v === 0 ? v : undefined;
      }, 5000);
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  },
});
