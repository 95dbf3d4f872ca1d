/**
 * Real-packet dual-stack test of the agent: the sandbox runs IPv4 and IPv6 on every link
 * (`Sandbox.create({ ipv6: true })`), the Node has an IPv4 and an IPv6 InternalIP, and one
 * `RequireDualStack` Service (ClusterIPs 10.96.0.40 and fd00:10:96::40, a NodePort) has one EndpointSlice
 * per address type. The agent (`main.ts` with the `start` task's permissions, as in suite.ts) must then run
 * one proxier per family (lib/agent.ts: the secondary family runs when the mode works for it) and carry TCP
 * and UDP in both families. It runs in iptables and in nftables mode; what each mode wrote is checked by
 * mode-specific steps.
 *
 * Chain names: upstream's `servicePortChainName` hashes only `namespace/name:port` + protocol, not the
 * cluster IP, and each family's proxier writes its own table (iptables vs ip6tables), so the v4 and v6
 * KUBE-SVC chains of a Service port have the same name; KUBE-SEP names hash the endpoint (`ip:port`, or
 * `[ip]:port` for IPv6, Go's `net.JoinHostPort`) and so differ between families. The test computes these
 * names itself (checked against a chain name from upstream's proxier_test.go), not with lib/ code.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe } from "../../testkit/probe.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import {
  dualStackNodeObject,
  endpointSlice,
  eventually,
  NS,
  type PortSpec,
  service,
  startSandboxAgent,
  tally,
} from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const noIPv6 = (() => {
  try {
    Deno.statSync("/proc/sys/net/ipv6");
    return undefined;
  } catch {
    return "the kernel has no IPv6";
  }
})();
const unavailable = {
  iptables: sandboxUnavailableReason(["ip", "iptables", "ip6tables", "conntrack", "sysctl"]) ?? noIPv6,
  nftables: sandboxUnavailableReason(["ip", "nft", "conntrack", "sysctl"]) ?? noIPv6,
};
const NODE = "node1";
const SVC = "ds";
const CLUSTER_IP4 = "10.96.0.40";
const CLUSTER_IP6 = "fd00:10:96::40";
const NODE_PORT = 30090;
const PORTS: PortSpec[] = [
  { name: "p", port: 80, nodePort: NODE_PORT },
  { name: "dns", port: 53, protocol: "UDP", nodePort: 30091 },
];

/** Upstream's `portProtoHash` / `servicePortEndpointChainName` hash: base32(sha256(s))[:16]. */
function upstreamHash(s: string): string {
  const digest = createHash("sha256").update(s).digest();
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  let bits = "";
  for (const byte of digest.subarray(0, 10)) bits += byte.toString(2).padStart(8, "0");
  let out = "";
  for (let i = 0; i < 80; i += 5) out += alphabet[parseInt(bits.slice(i, i + 5), 2)];
  return out;
}

/** The nat table as the agent wrote it: whichever of the nft/legacy `save` tools shows KUBE-SERVICES. */
async function natTable(sb: Sandbox, family: "4" | "6"): Promise<string> {
  const base = family === "6" ? "ip6tables" : "iptables";
  for (const save of [`${base}-nft-save`, `${base}-legacy-save`]) {
    const r = await sb.tryExec(sb.node, save, ["-t", "nat"]);
    if (r.code === 0 && r.stdout.includes(":KUBE-SERVICES")) return r.stdout;
  }
  throw new Error(`no ${base} nat table with KUBE-SERVICES in the node namespace`);
}

/** Pod names answering `count` sequential probes (or outcomes like `timeout`). */
async function hits(probe: Probe, op: "tcp" | "udp", host: string, port: number, count: number) {
  return await probe.repeat({ op, host, port, timeoutMs: 1000 }, count);
}

/** What a mode wrote, checked by the steps of that mode only. */
interface ModeChecks {
  /** After start: each family's table holds the Service under the mode's names. */
  rules(sb: Sandbox, ips: Record<string, string>): Promise<void>;
  /** After pod-b's v6 endpoint was removed: gone from v6, kept in v4. */
  endpointRemoved(sb: Sandbox, ips: Record<string, string>): Promise<void>;
}

/** `netlink`: nftables mode with `--nftables-netlink` (changes as the agent's own netlink batches). */
function defineDualStack(mode: "iptables" | "nftables", checks: ModeChecks, netlink = false): void {
  privilegedTest(unavailable[mode], {
    name:
      `packets (${mode}${netlink ? ", --nftables-netlink" : ""}): dual-stack Service over IPv4 and IPv6 ` +
      "(ClusterIPs, NodePort, per-family endpoints)",
    sanitizeResources: false,
    sanitizeOps: false,
    fn: (t) => runDualStack(t, mode, checks, netlink),
  });
}

async function runDualStack(
  t: Deno.TestContext,
  mode: "iptables" | "nftables",
  checks: ModeChecks,
  netlink: boolean,
) {
  {
    const sb = await Sandbox.create({ ipv6: true, pods: ["pod-a", "pod-b", "pod-x"] });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), x = sb.pod("pod-x");
      const [a6, b6, x6, node6, client6] = [a.ip6!, b.ip6!, x.ip6!, sb.nodeIP6!, sb.clientIP6!];
      // `::` serves both families (peers of IPv4 connections show as ::ffff:a.b.c.d).
      await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081], bind: "::" })));
      sim = await SimulatorProcess.start({ netns: sb.node });
      await sim.upsert(dualStackNodeObject(NODE, [sb.nodeIP, node6], [sb.podCIDR, sb.podCIDR6!]));
      await sim.upsert(service({
        name: SVC,
        type: "NodePort",
        clusterIP: CLUSTER_IP4,
        clusterIPs: [CLUSTER_IP4, CLUSTER_IP6],
        ipFamilies: ["IPv4", "IPv6"],
        ipFamilyPolicy: "RequireDualStack",
        ports: PORTS,
      }));
      const local = (ip: string) => ({ ip, node: NODE });
      const v4Slice = (ips: string[]) =>
        endpointSlice(SVC, ips.map(local), PORTS, { addressType: "IPv4", name: `${SVC}-v4` });
      const v6Slice = (ips: string[]) =>
        endpointSlice(SVC, ips.map(local), PORTS, { addressType: "IPv6", name: `${SVC}-v6` });
      await sim.upsert(v4Slice([a.ip, b.ip]));
      await sim.upsert(v6Slice([a6, b6]));

      agent = startSandboxAgent(sb, sim.kubeconfig, {
        nodeName: NODE,
        clusterCIDR: "10.244.0.0/16,fd00:10:244::/56",
        mode,
        ...(netlink ? { extraArgs: ["--nftables-netlink"], extraPermissions: ["--allow-ffi"] } : {}),
      });
      const ips = { a: a.ip, b: b.ip, a6, b6 };
      const [pc, px] = await Promise.all([sb.probe(sb.client), sb.probe(x.ns)]);
      let exited = false;
      agent.status.then(() => exited = true);
      for (const vip of [CLUSTER_IP4, CLUSTER_IP6]) {
        await eventually(
          `the agent to serve ${vip}`,
          async () => {
            if (exited) throw new Error("the agent exited");
            const r = await px.tcp(vip, 80, { timeoutMs: 300 });
            return r.result === "ok" ? r : undefined;
          },
          30_000,
          200,
        ).catch((err) => {
          throw new Error(`${err.message}\nagent output:\n${agent!.tail()}`);
        });
      }

      await t.step("the agent runs a proxier per family", () => {
        assert.match(agent!.output, /Created proxier.*IPv4/, agent!.tail());
        assert.match(agent!.output, /Created proxier.*IPv6/, agent!.tail());
      });

      await t.step("ClusterIP v4 and v6 from a pod reach both endpoints, pod source kept", async () => {
        for (const vip of [CLUSTER_IP4, CLUSTER_IP6]) {
          const got = tally(await hits(px, "tcp", vip, 80, 40));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], `${vip}: ${JSON.stringify(got)}`);
        }
        // In-cluster traffic is not masqueraded: the IPv6 local detector matches fd00:10:244::/56.
        const r = await px.tcp(CLUSTER_IP6, 80);
        assert.match(r.answer ?? "", new RegExp(` ${x6}:\\d+$`), JSON.stringify(r));
        const r4 = await px.tcp(CLUSTER_IP4, 80);
        assert.match(r4.answer ?? "", new RegExp(` (::ffff:)?${x.ip.replaceAll(".", "\\.")}:\\d+$`));
      });

      await t.step("UDP ClusterIP v6 from a pod reaches both endpoints", async () => {
        const got = tally(await hits(px, "udp", CLUSTER_IP6, 53, 30));
        assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
      });

      await t.step("NodePort on the node's IPv6 address from the client reaches both pods", async () => {
        const answers: string[] = [];
        for (let i = 0; i < 40; i++) {
          const r = await pc.tcp(node6, NODE_PORT);
          assert.equal(r.result, "ok", JSON.stringify(r));
          answers.push(r.answer!);
        }
        assert.deepEqual(new Set(answers.map((l) => l.split(" ")[0])), new Set(["pod-a", "pod-b"]));
        // externalTrafficPolicy Cluster: the client's address is masqueraded (to the node's bridge IP).
        for (const l of answers) assert.ok(!l.includes(` ${client6}:`), `client IP not masqueraded: ${l}`);
        // The IPv4 NodePort works alongside.
        const got4 = tally(await hits(pc, "tcp", sb.nodeIP, NODE_PORT, 30));
        assert.deepEqual(Object.keys(got4).sort(), ["pod-a", "pod-b"], JSON.stringify(got4));
      });

      await t.step(
        `${mode} holds the v6 Service in its IPv6 table and the v4 one in its IPv4 table`,
        () => checks.rules(sb, ips),
      );

      /** A UDP flow (fixed source port) from pod-x to `vip` that the Service sent to pod-b. */
      const udpFlowToPodB = async (vip: string, firstPort: number): Promise<number> => {
        for (let port = firstPort; port < firstPort + 40; port++) {
          const r = await px.udp(vip, 53, { localPort: port });
          if (r.answer?.startsWith("pod-b ")) return port;
        }
        throw new Error(`no UDP flow to ${vip} went to pod-b`);
      };

      await t.step("removing an IPv6 endpoint affects IPv6 only", async () => {
        // UDP flows pinned to pod-b in both families: only the IPv6 one may move (conntrack cleanup).
        const port6 = await udpFlowToPodB(CLUSTER_IP6, 40600);
        const port4 = await udpFlowToPodB(CLUSTER_IP4, 40700);
        await sim!.upsert(v6Slice([a6]));
        await eventually(
          "pod-b to leave the v6 Service",
          async () => {
            const got = await hits(px, "tcp", CLUSTER_IP6, 80, 15);
            return got.every((n) => n === "pod-a") ? got : undefined;
          },
          5000,
          100,
        );
        const got6 = tally(await hits(px, "tcp", CLUSTER_IP6, 80, 30));
        assert.deepEqual(got6, { "pod-a": 30 }, "v6 ClusterIP");
        const np6 = tally(await hits(pc, "tcp", node6, NODE_PORT, 20));
        assert.deepEqual(np6, { "pod-a": 20 }, "v6 NodePort");
        const got4 = tally(await hits(px, "tcp", CLUSTER_IP4, 80, 40));
        assert.deepEqual(Object.keys(got4).sort(), ["pod-a", "pod-b"], `v4: ${JSON.stringify(got4)}`);
        await checks.endpointRemoved(sb, ips);
        // pod-b keeps running: only the agent's IPv6 conntrack cleanup can move the v6 flow (same 5-tuple).
        await eventually("the v6 UDP flow to move to pod-a", async () => {
          const r = await px.udp(CLUSTER_IP6, 53, { localPort: port6, timeoutMs: 300 });
          return r.answer?.startsWith("pod-a ") ? r : undefined;
        }, 3000);
        const r4 = await px.udp(CLUSTER_IP4, 53, { localPort: port4 });
        assert.equal(r4.answer?.split(" ")[0], "pod-b", `v4 UDP flow: ${JSON.stringify(r4)}`);
      });
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  }
}

const spn = `${NS}/${SVC}:p`;
const svcChain = `KUBE-SVC-${upstreamHash(spn + "tcp")}`;
const extChain = `KUBE-EXT-${upstreamHash(spn + "tcp")}`;
const sep = (endpoint: string) => `KUBE-SEP-${upstreamHash(spn + "tcp" + endpoint)}`;

defineDualStack("iptables", {
  async rules(sb, ips) {
    // The hash itself, against upstream's proxier_test.go (ns1/svc1:p80 tcp, endpoint 10.180.0.1:80).
    assert.equal(upstreamHash("ns1/svc1:p80tcp"), "XPGD46QRK7WJZT7O");
    assert.equal(upstreamHash("ns1/svc1:p80tcp10.180.0.1:80"), "SXIVWICOYRO3J4NJ");
    const nat6 = await natTable(sb, "6");
    const nat4 = await natTable(sb, "4");
    const lines6 = nat6.split("\n");
    const lines4 = nat4.split("\n");
    for (const chain of [svcChain, extChain, sep(`[${ips.a6}]:8080`), sep(`[${ips.b6}]:8080`)]) {
      assert.ok(lines6.includes(`:${chain} - [0:0]`), `${chain} missing in ip6tables nat:\n${nat6}`);
    }
    // Same KUBE-SVC name in both families (the hash has no IP); each table has only its family's IPs.
    assert.ok(lines4.includes(`:${svcChain} - [0:0]`), `${svcChain} missing in iptables nat:\n${nat4}`);
    for (const ep of [`${ips.a}:8080`, `${ips.b}:8080`]) {
      assert.ok(lines4.includes(`:${sep(ep)} - [0:0]`), `${sep(ep)} missing in iptables nat`);
      assert.ok(!lines6.some((l) => l.includes(sep(ep))), `v4 endpoint chain ${sep(ep)} in ip6tables`);
    }
    const jump6 = lines6.filter((l) => l.startsWith("-A KUBE-SERVICES ") && l.endsWith(`-j ${svcChain}`));
    assert.equal(jump6.length, 1, `KUBE-SERVICES -> ${svcChain} in ip6tables:\n${nat6}`);
    assert.match(jump6[0], new RegExp(` -d ${CLUSTER_IP6}/128 .*--dport 80 `));
    const jump4 = lines4.filter((l) => l.startsWith("-A KUBE-SERVICES ") && l.endsWith(`-j ${svcChain}`));
    assert.equal(jump4.length, 1, `KUBE-SERVICES -> ${svcChain} in iptables:\n${nat4}`);
    assert.match(jump4[0], new RegExp(` -d ${CLUSTER_IP4.replaceAll(".", "\\.")}/32 `));
    const dnat = lines6.find((l) => l.startsWith(`-A ${sep(`[${ips.a6}]:8080`)} `) && l.includes("DNAT"));
    assert.ok(dnat?.endsWith(`--to-destination [${ips.a6}]:8080`), `DNAT of pod-a's v6 endpoint: ${dnat}`);
    assert.ok(!nat6.includes(CLUSTER_IP4) && !nat4.includes(CLUSTER_IP6), "a family's IP in the other table");
  },
  async endpointRemoved(sb, ips) {
    const lines6 = (await natTable(sb, "6")).split("\n");
    const lines4 = (await natTable(sb, "4")).split("\n");
    assert.ok(!lines6.includes(`:${sep(`[${ips.b6}]:8080`)} - [0:0]`), "pod-b's v6 endpoint chain remains");
    assert.ok(lines4.includes(`:${sep(`${ips.b}:8080`)} - [0:0]`), "pod-b's v4 endpoint chain is gone");
  },
});

/** `nft list table <family> kube-proxy` in the node namespace. */
async function nftTable(sb: Sandbox, family: "ip" | "ip6"): Promise<string> {
  return (await sb.exec(sb.node, "nft", ["list", "table", family, "kube-proxy"])).stdout;
}

/**
 * The endpoints the Service's TCP chain DNATs to, in one family's table: the elements of its `numgen` map
 * (`0 : ip . 8080, ...`), or the one `dnat to ip:8080` of a single endpoint (v1.37's layout).
 */
function balancedEndpoints(table: string): string[] {
  const chain = table.match(/\tchain service-[A-Z0-9]{8}-dp\/ds\/tcp\/p \{\n([^]*?)\n\t\}\n/);
  if (!chain) return [];
  const map = chain[1].match(/dnat ip6? to numgen random mod \d+ map \{([^}]*)\}/);
  if (map) return [...map[1].matchAll(/\d+ : (\S+) \. 8080/g)].map((m) => m[1]);
  const one = chain[1].match(/dnat to \[?([0-9a-f.:]+?)\]?:8080/);
  return one ? [one[1]] : [];
}

const nftablesChecks: ModeChecks = {
  async rules(sb, ips) {
    const t4 = await nftTable(sb, "ip"), t6 = await nftTable(sb, "ip6");
    assert.match(t6, new RegExp(`${CLUSTER_IP6} \\. tcp \\. 80 : goto service-[A-Z0-9]{8}-dp/ds/tcp/p`));
    assert.match(t4, new RegExp(`${CLUSTER_IP4.replaceAll(".", "\\.")} \\. tcp \\. 80 : goto service-`));
    assert.deepEqual(balancedEndpoints(t6).sort(), [ips.a6, ips.b6].sort());
    assert.deepEqual(balancedEndpoints(t4).sort(), [ips.a, ips.b].sort());
    assert.match(t6, /dnat ip6 to numgen random mod 2 map /);
    assert.ok(!t6.includes(CLUSTER_IP4) && !t4.includes(CLUSTER_IP6), "a family's IP in the other table");
  },
  async endpointRemoved(sb, ips) {
    const t6 = await nftTable(sb, "ip6");
    assert.deepEqual(balancedEndpoints(t6), [ips.a6]);
    assert.match(t6, new RegExp(`dnat to \\[${ips.a6}\\]:8080`), "one endpoint: a plain dnat");
    assert.deepEqual(balancedEndpoints(await nftTable(sb, "ip")).sort(), [ips.a, ips.b].sort());
  },
};
defineDualStack("nftables", nftablesChecks);
// The same with the IPv6 endpoint's removal (a partial sync) sent as the agent's own netlink batch.
defineDualStack("nftables", nftablesChecks, true);
