/**
 * Packet-level tests of the agent in ipvs mode (issue #11 item 3): `main.ts --proxy-mode=ipvs`, with the
 * `start` task's permissions, in the sandbox's node namespace against the API server simulator; real TCP/UDP
 * traffic through IPVS virtual servers, the mode's ipsets and iptables rules.
 *
 * Needs a kernel with IPVS (ip_vs, ip_vs_rr, the dummy link type, xt_ipvs): the host used for development has
 * none, so the test is skipped there with the reason printed; the IPVS VM harness runs it.
 */

import assert from "node:assert/strict";
import { agentCommand } from "../../testkit/agent_command.ts";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe } from "../../testkit/probe.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, nodeObject, service, tally } from "./helpers.ts";

const NODE = "node1";
const OTHER_NODE = "node2";
const SYNC_PERIOD_S = 5;

/** Why IPVS cannot be used here (ipvsadm missing, no ip_vs in the kernel), or undefined. */
export function ipvsUnavailableReason(): string | undefined {
  const base = sandboxUnavailableReason(["ip", "iptables", "iptables-save", "ipset", "ipvsadm", "sysctl"]);
  if (base) return base;
  try {
    const out = new Deno.Command("ipvsadm", { args: ["-S", "-n"] }).outputSync();
    if (!out.success) {
      return `no IPVS in this kernel: ${new TextDecoder().decode(out.stderr).trim().split("\n")[0]}`;
    }
  } catch (err) {
    return `ipvsadm cannot run: ${(err as Error).message}`;
  }
  const dummy = new Deno.Command("ip", { args: ["link", "add", "dkp-dummy-probe", "type", "dummy"] })
    .outputSync();
  if (!dummy.success) return "no dummy link type in this kernel (kube-ipvs0 needs it)";
  new Deno.Command("ip", { args: ["link", "del", "dkp-dummy-probe"] }).outputSync();
  return undefined;
}

const unavailable = ipvsUnavailableReason();
if (unavailable) console.log(`ipvs packet tests skipped: ${unavailable}`);

/** The agent in ipvs mode, with extra flags. */
function startIpvsAgent(sb: Sandbox, kubeconfig: string, extra: string[] = []): SandboxProcess {
  const [cmd, ...args] = agentCommand([
    "--kubeconfig",
    kubeconfig,
    "--hostname-override",
    NODE,
    "--proxy-mode=ipvs",
    "--cluster-cidr=10.244.0.0/16",
    `--ipvs-sync-period=${SYNC_PERIOD_S}s`,
    "--ipvs-min-sync-period=0s",
    "--conntrack-max-per-core=0",
    "-v=2",
    ...extra,
  ]);
  return sb.spawn(sb.node, cmd, args);
}

async function waitServing(agent: SandboxProcess, probe: Probe): Promise<void> {
  let exited = false;
  agent.status.then(() => exited = true);
  await eventually(
    "the agent's first sync",
    async () => {
      if (exited) throw new Error("the agent exited");
      const r = await probe.tcp("10.96.0.10", 80, { timeoutMs: 300 });
      return r.result === "ok" ? r : undefined;
    },
    30_000,
    200,
  ).catch((err) => {
    throw new Error(`${err.message}\nagent output:\n${agent.tail()}`);
  });
}

async function hits(probe: Probe, host: string, port: number, count: number): Promise<string[]> {
  return await probe.repeat({ op: "tcp", host, port, timeoutMs: 1000 }, count);
}

Deno.test({
  name: "ipvs dataplane: the agent's virtual servers, ipsets and iptables rules carry real traffic",
  ignore: unavailable !== undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const sb = await Sandbox.create({
      pods: ["pod-a", "pod-b", "pod-c", "pod-x"],
      extraClientIPs: ["192.168.77.3"],
    });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), c = sb.pod("pod-c");
      await Promise.all([a, b, c].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081] })));
      sim = await SimulatorProcess.start({ netns: sb.node });
      await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      await sim.upsert(nodeObject(OTHER_NODE, "192.168.78.1", "10.244.1.0/24"));
      const local = (ip: string) => ({ ip, node: NODE });
      const remote = (ip: string) => ({ ip, node: OTHER_NODE });
      await sim.upsert(service({ name: "web", clusterIP: "10.96.0.10" }));
      await sim.upsert(endpointSlice("web", [local(a.ip), local(b.ip), remote(c.ip)]));
      await sim.upsert(
        service({
          name: "np",
          clusterIP: "10.96.0.11",
          type: "NodePort",
          ports: [{ port: 80, nodePort: 30080 }],
        }),
      );
      await sim.upsert(endpointSlice("np", [local(a.ip), local(b.ip)]));
      await sim.upsert(service({
        name: "lb",
        clusterIP: "10.96.0.12",
        type: "LoadBalancer",
        ports: [{ port: 80, nodePort: 30082 }],
        lbIPs: ["172.30.0.10"],
        externalIPs: ["172.30.0.20"],
      }));
      await sim.upsert(endpointSlice("lb", [local(a.ip), remote(c.ip)]));
      await sim.upsert(service({
        name: "lbsr",
        clusterIP: "10.96.0.13",
        type: "LoadBalancer",
        ports: [{ port: 80, nodePort: 30083 }],
        lbIPs: ["172.30.0.11"],
        sourceRanges: [`${sb.clientIP}/32`],
      }));
      await sim.upsert(endpointSlice("lbsr", [local(a.ip)]));
      await sim.upsert(service({ name: "sticky", clusterIP: "10.96.0.14", affinitySeconds: 60 }));
      await sim.upsert(endpointSlice("sticky", [local(a.ip), local(b.ip), remote(c.ip)]));
      await sim.upsert(
        service({
          name: "etp",
          clusterIP: "10.96.0.15",
          type: "NodePort",
          ports: [{ port: 80, nodePort: 30085 }],
          eTPLocal: true,
        }),
      );
      await sim.upsert(endpointSlice("etp", [local(a.ip), remote(c.ip)]));
      await sim.upsert(service({ name: "itp", clusterIP: "10.96.0.16", iTPLocal: true }));
      await sim.upsert(endpointSlice("itp", [local(b.ip), remote(c.ip)]));
      await sim.upsert(service({ name: "drain", clusterIP: "10.96.0.19" }));
      await sim.upsert(endpointSlice("drain", [local(a.ip)]));

      agent = startIpvsAgent(sb, sim.kubeconfig, ["--ipvs-strict-arp"]);
      const x = sb.pod("pod-x");
      const [pc, pn, px] = await Promise.all([sb.probe(sb.client), sb.probe(sb.node), sb.probe(x.ns)]);
      await waitServing(agent, pn);

      await t.step("deprecation warning, kube-ipvs0 and virtual servers as upstream", async () => {
        assert.match(agent!.tail(), /The ipvs proxier is now deprecated/);
        const addrs = (await sb.exec(sb.node, "ip", ["-o", "addr", "show", "dev", "kube-ipvs0"])).stdout;
        for (const ip of ["10.96.0.10", "10.96.0.11", "172.30.0.10", "172.30.0.20"]) {
          assert.ok(addrs.includes(` ${ip}/32 `), addrs);
        }
        const vs = (await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout;
        assert.ok(vs.includes(`-A -t ${sb.nodeIP}:30080 -s rr\n`), vs);
        assert.ok(vs.includes("-A -t 10.96.0.14:80 -s rr -p 60\n"), vs);
      });

      await t.step("--ipvs-strict-arp sets arp_ignore=1 and arp_announce=2", async () => {
        assert.equal(
          (await sb.exec(sb.node, "sysctl", ["-n", "net.ipv4.conf.all.arp_ignore"])).stdout.trim(),
          "1",
        );
        assert.equal(
          (await sb.exec(sb.node, "sysctl", ["-n", "net.ipv4.conf.all.arp_announce"])).stdout.trim(),
          "2",
        );
      });

      await t.step("ClusterIP from the node and from a pod reaches every endpoint", async () => {
        for (const probe of [pn, px]) {
          const got = tally(await hits(probe, "10.96.0.10", 80, 60));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b", "pod-c"], JSON.stringify(got));
        }
      });

      await t.step("NodePort from the client reaches every endpoint, masqueraded", async () => {
        const answers = await hits(pc, sb.nodeIP, 30080, 40);
        assert.deepEqual(new Set(answers.map((s) => s.split(" ")[0])), new Set(["pod-a", "pod-b"]));
        const r = await pc.tcp(sb.nodeIP, 30080);
        assert.ok(!r.answer!.includes(` ${sb.clientIP}:`), `client IP not masqueraded: ${r.answer}`);
      });

      await t.step("LoadBalancer IP and externalIP from the client", async () => {
        for (const ip of ["172.30.0.10", "172.30.0.20"]) {
          const got = tally(await hits(pc, ip, 80, 40));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-c"], `${ip}: ${JSON.stringify(got)}`);
        }
      });

      await t.step("loadBalancerSourceRanges allow the listed client and drop others", async () => {
        assert.equal((await pc.tcp("172.30.0.11", 80)).answer?.split(" ")[0], "pod-a");
        const denied = await pc.tcp("172.30.0.11", 80, { localAddress: "192.168.77.3", timeoutMs: 700 });
        assert.equal(denied.result, "timeout", JSON.stringify(denied));
      });

      await t.step("ClientIP session affinity keeps one endpoint per client", async () => {
        assert.equal(new Set(await hits(pc, "10.96.0.14", 80, 25)).size, 1);
        assert.equal(new Set(await hits(pn, "10.96.0.14", 80, 25)).size, 1);
      });

      await t.step("externalTrafficPolicy Local keeps the client IP", async () => {
        for (let i = 0; i < 20; i++) {
          const r = await pc.tcp(sb.nodeIP, 30085);
          assert.match(r.answer ?? "", new RegExp(`^pod-a ${sb.clientIP.replaceAll(".", "\\.")}:\\d+$`));
        }
      });

      await t.step("internalTrafficPolicy Local uses only this node's endpoints", async () => {
        assert.deepEqual(new Set(await hits(px, "10.96.0.16", 80, 30)), new Set(["pod-b"]));
      });

      await t.step(
        "graceful termination: the established connection lives on, no new one reaches the removed endpoint",
        async () => {
          const held = await pc.open("10.96.0.19", 80);
          assert.equal(held.result, "ok");
          await sim!.upsert(endpointSlice("drain", [local(b.ip)]));
          await eventually("the new endpoint to serve", async () => {
            const r = await pc.tcp("10.96.0.19", 80, { timeoutMs: 300 });
            return r.answer?.startsWith("pod-b ") ? r : undefined;
          }, 5000);
          assert.deepEqual(new Set(await hits(pc, "10.96.0.19", 80, 20)), new Set(["pod-b"]));
          const vs = (await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout;
          assert.ok(vs.includes(`-a -t 10.96.0.19:80 -r ${a.ip}:8080 -m -w 0`), vs);
          assert.equal((await pc.send(held.conn!)).result, "ok", "the established connection still works");
          await pc.closeConn(held.conn!);
        },
      );

      await t.step("an agent restart keeps established connections and never blackholes", async () => {
        const held = await pc.open(sb.nodeIP, 30080);
        const status = await agent!.stop(10_000);
        assert.equal(status.code, 0, agent!.tail());
        assert.equal((await pc.tcp("10.96.0.10", 80)).result, "ok", "while stopped");
        agent = startIpvsAgent(sb, sim!.kubeconfig);
        await agent.waitForOutput("SyncProxyRules complete", 30_000);
        assert.equal((await pc.send(held.conn!)).result, "ok", "after restart");
        await pc.closeConn(held.conn!);
      });

      await t.step("--cleanup leaves no virtual server, no kube-ipvs0 and no ipset", async () => {
        await agent!.stop(10_000);
        const [cmd, ...args] = agentCommand(["--cleanup"]);
        const r = await sb.tryExec(sb.node, cmd, args, undefined, 60_000);
        assert.equal(r.code, 0, r.stderr);
        assert.equal((await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout.trim(), "");
        assert.notEqual((await sb.tryExec(sb.node, "ip", ["link", "show", "kube-ipvs0"])).code, 0);
        const sets = (await sb.exec(sb.node, "ipset", ["list", "-n"])).stdout.split("\n").filter((s) =>
          s.startsWith("KUBE-")
        );
        assert.deepEqual(sets, []);
      });

      await t.step("switching ipvs -> iptables -> ipvs on one node", async () => {
        agent = startIpvsAgent(sb, sim!.kubeconfig);
        await waitServing(agent, pn);
        await agent.stop(10_000);
        const [cmd, ...args] = agentCommand([
          "--kubeconfig",
          sim!.kubeconfig,
          "--hostname-override",
          NODE,
          "--proxy-mode=iptables",
          "--cluster-cidr=10.244.0.0/16",
          "--conntrack-max-per-core=0",
        ]);
        agent = sb.spawn(sb.node, cmd, args);
        await waitServing(agent, pn);
        assert.notEqual((await sb.tryExec(sb.node, "ip", ["link", "show", "kube-ipvs0"])).code, 0);
        assert.equal((await pc.tcp(sb.nodeIP, 30080)).result, "ok");
        await agent.stop(10_000);
        agent = startIpvsAgent(sb, sim!.kubeconfig);
        await waitServing(agent, pn);
        const nat = (await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout;
        assert.ok(!nat.includes("KUBE-SVC-"), "iptables mode chains removed");
        assert.equal((await pc.tcp(sb.nodeIP, 30080)).result, "ok");
      });
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  },
});
