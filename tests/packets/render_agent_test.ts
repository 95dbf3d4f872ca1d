/**
 * `kube-proxy render` against the real agent: the agent runs in the sandbox's node namespace (tests/packets
 * style: `main.ts` with the start task's permissions, the API server simulator) with a few Services; then
 * `render`, also run as `main.ts` with the start task's permissions, gets the same objects as manifests (a
 * `kubectl get -o yaml` style List and a Node file) and the same flags. Render's commands are replayed into a
 * fresh network namespace, and the kernel's rules there must be the agent's node's rules: `iptables-save` of
 * every table (both families) in iptables mode, `nft list table` (both families) in nftables mode, compared
 * through the normalizers of testkit/rule_listings.ts. `explain` is then checked against real packets: its
 * verdict, endpoints and masquerade decision must be what the traffic shows.
 */
import assert from "node:assert/strict";
import { stringify } from "yaml";
import { parseRenderOutput } from "../../lib/cli/render_output.ts";
import type { KubeObject } from "../../lib/kube/types.ts";
import { agentCommand } from "../../testkit/agent_command.ts";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import { withNetns } from "../../testkit/netns.ts";
import type { Probe } from "../../testkit/probe.ts";
import { canonicalIptablesSave, canonicalListing } from "../../testkit/rule_listings.ts";
import { Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import {
  endpointSlice,
  eventually,
  nodeObject,
  sandboxAgentFlags,
  type SandboxAgentOptions,
  service,
  sleep,
  startSandboxAgent,
} from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const NODE = "node1";
const OTHER = "node2";
const decoder = new TextDecoder();

/** Runs `kube-proxy <args>` as the start task does; resolves with its exit code and output. */
async function kubeProxy(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const [cmd, ...rest] = agentCommand(args);
  const out = await new Deno.Command(cmd, { args: rest, stdout: "piped", stderr: "piped" }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** The objects of the test: Node, Services and EndpointSlices of several shapes. */
function objects(sb: Sandbox): KubeObject[] {
  const a = sb.pod("pod-a").ip, b = sb.pod("pod-b").ip;
  const local = (ip: string) => ({ ip, node: NODE });
  const remote = (ip: string) => ({ ip, node: OTHER });
  return [
    nodeObject(NODE, sb.nodeIP, sb.podCIDR),
    service({ name: "web", clusterIP: "10.96.0.10" }),
    endpointSlice("web", [local(a), local(b), remote("10.244.1.9")]),
    service({
      name: "np",
      clusterIP: "10.96.0.11",
      type: "NodePort",
      ports: [{ port: 80, nodePort: 30081 }],
    }),
    endpointSlice("np", [local(a), local(b)]),
    service({
      name: "lbsr",
      clusterIP: "10.96.0.12",
      type: "LoadBalancer",
      ports: [{ port: 80, nodePort: 30082 }],
      lbIPs: ["172.30.0.12"],
      sourceRanges: [`${sb.clientIP}/32`],
    }),
    endpointSlice("lbsr", [local(a)]),
    service({ name: "sticky", clusterIP: "10.96.0.13", affinitySeconds: 60 }),
    endpointSlice("sticky", [local(a), local(b)]),
    service({
      name: "etp",
      clusterIP: "10.96.0.14",
      type: "NodePort",
      ports: [{ port: 80, nodePort: 30084 }],
      eTPLocal: true,
    }),
    endpointSlice("etp", [local(a), remote("10.244.1.9")]),
    service({ name: "empty", clusterIP: "10.96.0.15" }),
    service({ name: "dns", clusterIP: "10.96.0.16", ports: [{ port: 53, protocol: "UDP" }] }),
    endpointSlice("dns", [local(b)], [{ port: 53, protocol: "UDP" }]),
    service({ name: "ext", clusterIP: "10.96.0.17", externalIPs: ["172.30.0.17"] }),
    endpointSlice("ext", [local(b)]),
  ];
}

/** What the agent's node has, read in its namespace. */
async function kernelRules(
  run: (cmd: string, args: string[]) => Promise<string>,
  mode: string,
): Promise<string[]> {
  if (mode === "nftables") {
    const out: string[] = [];
    for (const fam of ["ip", "ip6"]) {
      out.push(`table ${fam}`, ...canonicalListing(await run("nft", ["list", "table", fam, "kube-proxy"])));
    }
    return out;
  }
  return [
    "IPv4",
    ...canonicalIptablesSave(await run("iptables-nft-save", [])),
    "IPv6",
    ...canonicalIptablesSave(await run("ip6tables-nft-save", [])),
  ];
}

for (const mode of ["iptables", "nftables"] as const) {
  const tools = mode === "nftables"
    ? ["nft"]
    : ["iptables", "iptables-nft-save", "ip6tables-nft-save", "nfacct"];
  const unavailable = sandboxUnavailableReason(["ip", "sysctl", ...tools]);
  privilegedTest(unavailable, {
    name:
      `render (${mode}): replayed into a fresh namespace, render's commands leave exactly the agent's rules`,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async (t) => {
      const sb = await Sandbox.create({ pods: ["pod-a", "pod-b", "pod-x"] });
      let sim: SimulatorProcess | undefined;
      let agent: SandboxProcess | undefined;
      const dir = await Deno.makeTempDir({ prefix: "kp-render-agent-" });
      try {
        const a = sb.pod("pod-a"), b = sb.pod("pod-b"), x = sb.pod("pod-x");
        await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081] })));
        sim = await SimulatorProcess.start({ netns: sb.node });
        const objs = objects(sb);
        for (const o of objs) await sim.upsert(o);
        await sim.upsert(nodeObject(OTHER, "192.168.78.1", "10.244.1.0/24"));
        const flags: SandboxAgentOptions = { nodeName: NODE, mode, syncPeriodS: 5 };
        agent = startSandboxAgent(sb, sim.kubeconfig, flags);
        const [pc, pn, px] = await Promise.all([sb.probe(sb.client), sb.probe(sb.node), sb.probe(x.ns)]);
        const inNode = async (cmd: string, args: string[]) => (await sb.exec(sb.node, cmd, args)).stdout;
        // Every Service is in the kernel once its endpoint-less one is rejected and the others answer.
        await eventually(
          "the agent's rules",
          async () => {
            if ((await pn.tcp("10.96.0.15", 80, { timeoutMs: 300 })).result !== "refused") return undefined;
            return (await pn.tcp("10.96.0.17", 80, { timeoutMs: 300 })).result === "ok" ? true : undefined;
          },
          30_000,
          200,
        ).catch((err) => {
          throw new Error(`${err.message}\nagent output:\n${agent!.tail()}`);
        });

        // The manifests: the Node in its own file, the rest as a kubectl-style List.
        await Deno.writeTextFile(`${dir}/node.yaml`, stringify(objs[0]));
        await Deno.mkdir(`${dir}/dump`);
        await Deno.writeTextFile(
          `${dir}/dump/all.yaml`,
          stringify({
            apiVersion: "v1",
            kind: "List",
            metadata: { resourceVersion: "" },
            items: objs.slice(1),
          }),
        );
        const rendered = await kubeProxy([
          "render",
          "-f",
          `${dir}/node.yaml`,
          "-f",
          `${dir}/dump`,
          ...sandboxAgentFlags(flags),
        ]);
        assert.equal(rendered.code, 0, rendered.stderr);
        const commands = parseRenderOutput(rendered.stdout);
        assert.ok(commands.length > 0);

        await t.step(
          "the agent's node and a namespace with render's commands have the same rules",
          async () => {
            const agentRules = await kernelRules(inNode, mode);
            const replayed = await withNetns(async (runner) => {
              for (const c of commands) {
                await runner.run({
                  cmd: c.cmd,
                  args: [...c.args],
                  stdin: c.stdin === "" ? undefined : c.stdin,
                });
              }
              return await kernelRules(async (cmd, args) => (await runner.run({ cmd, args })).stdout, mode);
            });
            assert.deepEqual(replayed, agentRules);
            assert.ok(agentRules.length > 20, `only ${agentRules.length} chains/objects`);
            // Not vacuous: every Service is in there.
            const text = agentRules.join("\n");
            for (
              const ip of ["10.96.0.10", "10.96.0.11", "10.96.0.12", "10.96.0.13", "10.96.0.14", "10.96.0.15"]
            ) {
              assert.ok(text.includes(ip), ip);
            }
          },
        );

        await t.step(
          "explain's verdicts, endpoints and masquerading are what real packets show",
          async () => {
            const pods = new Map([[a.ip, "pod-a"], [b.ip, "pod-b"]]);
            const cases: { probe: Probe; from: string; src: string; dst: string; proto?: "udp" }[] = [
              { probe: px, from: "pod", src: x.ip, dst: "10.96.0.10:80" },
              { probe: pn, from: "node", src: sb.nodeIP, dst: "10.96.0.10:80" },
              { probe: pc, from: "outside", src: sb.clientIP, dst: `${sb.nodeIP}:30081` },
              { probe: pc, from: "outside", src: sb.clientIP, dst: "172.30.0.12:80" },
              { probe: pn, from: "node", src: sb.nodeIP, dst: "172.30.0.12:80" },
              { probe: px, from: "pod", src: x.ip, dst: "10.96.0.13:80" },
              { probe: pc, from: "outside", src: sb.clientIP, dst: `${sb.nodeIP}:30084` },
              { probe: px, from: "pod", src: x.ip, dst: "10.96.0.15:80" },
              { probe: px, from: "pod", src: x.ip, dst: "10.96.0.16:53", proto: "udp" },
              { probe: pc, from: "outside", src: sb.clientIP, dst: "172.30.0.17:80" },
              { probe: px, from: "pod", src: x.ip, dst: "10.96.0.10:81" },
            ];
            for (const c of cases) {
              const [host, port] = [
                c.dst.slice(0, c.dst.lastIndexOf(":")),
                Number(c.dst.slice(c.dst.lastIndexOf(":") + 1)),
              ];
              const e = await kubeProxy([
                "explain",
                "-f",
                `${dir}/node.yaml`,
                "-f",
                `${dir}/dump`,
                ...sandboxAgentFlags(flags),
                "--source",
                c.src,
                "--destination",
                c.dst,
                "--from",
                c.from,
                "--protocol",
                c.proto ?? "tcp",
                "-v=0",
              ]);
              assert.equal(e.code, 0, e.stderr);
              const verdict = e.stdout.match(/^Verdict: +(.*)$/m)![1];
              const listed = [...e.stdout.matchAll(/^ {2}(\d+\.\d+\.\d+\.\d+):\d+ /gm)].map((m) => m[1]);
              const masq = e.stdout.match(/^Masquerade: (yes|no)/m)?.[1];
              const results = [];
              // Forwarded: enough connections to meet several endpoints. Otherwise a few, a second apart: the
              // kernel sends one ICMP error per second to a host (icmp_ratelimit), and a REJECT must be seen each time.
              const forwarded = verdict.startsWith("forwarded");
              for (let i = 0; i < (forwarded ? 12 : 3); i++) {
                if (!forwarded && i > 0) await sleep(1100);
                results.push(
                  c.proto === "udp"
                    ? await c.probe.udp(host, port, { timeoutMs: 700 })
                    : await c.probe.tcp(host, port, { timeoutMs: 700 }),
                );
              }
              const what = `${c.from} ${c.src} -> ${c.dst}\n${e.stdout}\nprobes: ${JSON.stringify(results)}`;
              if (verdict.startsWith("forwarded")) {
                // 10.244.1.9 (on node2) does not exist in the sandbox: connections sent there time out.
                const unreachable = listed.some((ip) => !pods.has(ip));
                assert.ok(results.some((r) => r.result === "ok"), what);
                assert.ok(
                  results.every((r) => r.result === "ok" || (unreachable && r.result === "timeout")),
                  what,
                );
                for (const r of results.filter((r) => r.result === "ok")) {
                  const [pod, peer] = r.answer!.split(" ");
                  assert.ok(listed.some((ip) => pods.get(ip) === pod), what);
                  const seenFrom = peer.slice(0, peer.lastIndexOf(":"));
                  // Masqueraded: the pod sees a node address; else the packet's own source.
                  assert.equal(seenFrom === c.src ? "no" : "yes", masq, what);
                }
              } else if (verdict.startsWith("rejected")) {
                assert.ok(results.every((r) => r.result === "refused"), what);
              } else if (verdict.startsWith("dropped")) {
                assert.ok(results.every((r) => r.result === "timeout"), what);
              } else {
                // Not handled by kube-proxy: nothing answers on another port of a ClusterIP here.
                assert.ok(results.every((r) => r.result !== "ok"), what);
              }
            }
          },
        );
      } finally {
        await agent?.stop();
        await sim?.close();
        await sb.destroy();
        await Deno.remove(dir, { recursive: true });
      }
    },
  });
}

privilegedTest(sandboxUnavailableReason(["ip", "ipset", "iptables-nft-restore", "ip6tables-nft-restore"]), {
  name:
    "render (ipvs): the ipset and iptables batches load into a fresh namespace (no IPVS here for the rest)",
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "kp-render-ipvs-" });
    try {
      const objs: KubeObject[] = [
        nodeObject(NODE, "192.168.77.1", "10.244.0.0/24"),
        service({
          name: "web",
          clusterIP: "10.96.0.10",
          type: "NodePort",
          ports: [{ port: 80, nodePort: 30080 }],
        }),
        endpointSlice("web", [{ ip: "10.244.0.2", node: NODE }, { ip: "10.244.1.2", node: OTHER }]),
        service({
          name: "lbsr",
          clusterIP: "10.96.0.12",
          type: "LoadBalancer",
          ports: [{ port: 80, nodePort: 30082 }],
          lbIPs: ["172.30.0.12"],
          // With the node IP in range: no KUBE-IPVS-OUT-FILTER rule, whose "-m ipvs" needs xt_ipvs (not here).
          sourceRanges: ["203.0.113.0/24", "192.168.77.0/24"],
          eTPLocal: true,
          healthCheckNodePort: 32000,
        }),
        endpointSlice("lbsr", [{ ip: "10.244.0.2", node: NODE }]),
      ];
      await Deno.writeTextFile(`${dir}/all.yaml`, objs.map((o) => stringify(o)).join("---\n"));
      const r = await kubeProxy([
        "render",
        "-f",
        dir,
        ...sandboxAgentFlags({ nodeName: NODE, mode: "ipvs" }),
      ]);
      assert.equal(r.code, 0, r.stderr);
      const commands = parseRenderOutput(r.stdout);
      const loadable = commands.filter((c) => c.cmd === "ipset" || c.cmd.endsWith("-restore"));
      assert.equal(loadable.length, 4, "ipset and iptables batches of both families");
      const saved = await withNetns(async (runner) => {
        for (const c of loadable) await runner.run({ cmd: c.cmd, args: [...c.args], stdin: c.stdin });
        return (await runner.run({ cmd: "ipset", args: ["save"] })).stdout +
          (await runner.run({ cmd: "iptables-nft-save", args: ["-t", "nat"] })).stdout;
      });
      for (
        const want of [
          "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
          "add KUBE-NODE-PORT-TCP 30080",
          "add KUBE-LOAD-BALANCER-LOCAL 172.30.0.12,tcp:80",
          "add KUBE-LOAD-BALANCER-SOURCE-CIDR 172.30.0.12,tcp:80,203.0.113.0/24",
          "add KUBE-LOAD-BALANCER-SOURCE-IP 172.30.0.12,tcp:80,172.30.0.12",
          "add KUBE-HEALTH-CHECK-NODE-PORT 32000",
          // (as iptables-save prints it)
          '-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment "Kubernetes service cluster ip + port for ' +
          'masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ',
          "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ",
        ]
      ) assert.ok(saved.includes(want), `${want}\n${saved}`);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
