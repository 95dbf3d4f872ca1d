/**
 * The real-packet suite every proxy mode runs: `main.ts`, started with exactly the `start` task's permission
 * flags and `--proxy-mode=<mode>`, runs in the sandbox's node namespace against the API server simulator (a
 * child process in the same namespace); real TCP/UDP traffic from the client, the node and pods checks
 * reachability, balance, affinity, source IPs, REJECT/DROP, conntrack cleanup, self-repair, restarts and
 * `--cleanup`. What differs between modes (tools, how rules are wiped, what `--cleanup` must leave, steps
 * of one mode only) comes from a {@linkcode PacketMode}.
 *
 * One sandbox and one agent serve all steps (start-up costs seconds); each step uses its own Service.
 * @module
 */

import assert from "node:assert/strict";
import { agentCommand } from "../../testkit/agent_command.ts";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe, ProbeResult } from "../../testkit/probe.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import {
  endpointSlice,
  eventually,
  nodeObject,
  refusingToolWrappers,
  service,
  sleep,
  startSandboxAgent,
  tally,
} from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import type { KubeEvent } from "../../lib/kube/types.ts";

export const NODE = "node1";
const OTHER_NODE = "node2";
const SYNC_PERIOD_S = 5;
/**
 * Rules repaired "within syncPeriod": the syncPeriod poll finds the damage (at most one period) and a full sync
 * writes the repair; the bound allows that sync almost a whole period (it took ~5 s in the IPVS VM beside a CPU
 * hog, ~0.1 s on a host), so a repair that waited for a second poll still fails.
 */
const REPAIR_BOUND_MS = SYNC_PERIOD_S * 2 * 1000 - 100;
/**
 * How long to wait for an agent from its spawn to a synced state (first sync, a restart's sync). A bound on
 * waiting, not a performance check: Deno's start alone took ~30 s in the IPVS VM beside a CPU hog on the host.
 */
const AGENT_START_MS = 120_000;
/**
 * How long to wait for an API change to reach the rules (the agent runs with min-sync-period 0: well under a
 * second on a quiet host). A bound on waiting; the steps assert what the rules do, not how fast.
 */
const CHANGE_MS = 30_000;
/** A namespace and Service names as long as the API allows (63 characters), and a 15-character port name. */
const LIMITS_NS = "packets-at-the-api-name-limits-" + "n".repeat(32);
const LIMITS_SERVED = "served-at-the-api-name-limits-" + "s".repeat(33);
const LIMITS_EMPTY = "empty-at-the-api-name-limits-" + "e".repeat(34);
const LIMITS_PORT = "port-name-limit";

/** A Service or EndpointSlice of the helpers moved into {@linkcode LIMITS_NS}. */
function atLimits<T extends { metadata?: { namespace?: string } }>(obj: T): T {
  return { ...obj, metadata: { ...obj.metadata, namespace: LIMITS_NS } };
}

/** What the steps of one mode need. */
export interface StepContext {
  sb: Sandbox;
  /** The API server simulator the agent watches. */
  sim: SimulatorProcess;
  /** The running agent. */
  agent: SandboxProcess;
  /** Probes in the client, the node and a pod that is no endpoint. */
  pc: Probe;
  pn: Probe;
  px: Probe;
}

/** The parts of the suite that differ between modes. */
export interface PacketMode {
  mode: "iptables" | "nftables" | "ipvs";
  /** Programs the mode (and the suite) needs in the node namespace. */
  tools: string[];
  /** Why the mode cannot run here beyond missing tools (e.g. no IPVS in the kernel); undefined if it can. */
  unavailable?: string;
  /** More agent flags. */
  extraArgs?: string[];
  /** What `$DKP_EXTRA_PERMISSIONS` expands to for the agent. */
  extraPermissions?: string[];
  /**
   * Changes reach the kernel past the wrapped tool (`--nftables-netlink`: partial syncs are the agent's own
   * netlink batches), so a tool wrapper cannot refuse a Service added later: the hostile step adds no refused
   * Service, and the restart step (whose subject it is) does not run. Isolation is the same code above the seam
   * and runs in the mode's own suite.
   */
  changesBypassTools?: boolean;
  /** Steps of this mode only, run after the LoadBalancer step: `[name, fn]`. */
  extraSteps?: [string, (ctx: StepContext) => Promise<void>][];
  /** A partial external flush the agent must repair within syncPeriod (beyond upstream); none if absent. */
  partialFlush?: {
    name: string;
    run: (sb: Sandbox) => Promise<void>;
    /** True while the flush's damage shows; default: the "web" ClusterIP does not answer the node. */
    inEffect?: (ctx: StepContext) => Promise<boolean>;
  };
  /** What a firewall reload does to this mode's rules. */
  wipe: (sb: Sandbox) => Promise<void>;
  /**
   * What a Service with externalTrafficPolicy Local and no local endpoint does with outside traffic: `drop`
   * (iptables, nftables), or `clusterEndpoints` (upstream's ipvs mode, kubernetes#97081: its virtual servers
   * fall back to the cluster endpoints, unmasqueraded). Default `drop`.
   */
  externalLocalWithoutLocalEndpoints?: "drop" | "clusterEndpoints";
  /** What `--cleanup` must have removed and is still there (empty when clean). */
  leftovers: (sb: Sandbox) => Promise<string[]>;
}

/** A ClusterIP whose rules the wrapped kernel tools refuse (isolation step); no other Service uses it. */
const REFUSED_IP = "10.96.0.66";

/** The tools whose input carries a Service's ClusterIP in each mode (wrapped to refuse REFUSED_IP). */
const REFUSING_TOOLS: Record<PacketMode["mode"], string[]> = {
  iptables: ["iptables", "iptables-nft", "iptables-legacy"].map((t) => `${t}-restore`),
  nftables: ["nft"],
  ipvs: ["ipvsadm"],
};

/** Registers the suite for one mode. */
export function definePacketSuite(m: PacketMode): void {
  const unavailable = sandboxUnavailableReason(["ip", "conntrack", "sysctl", ...m.tools]) ?? m.unavailable;
  privilegedTest(unavailable, {
    name: `packets (${m.mode}): the agent's rules carry real traffic`,
    sanitizeResources: false,
    sanitizeOps: false,
    fn: async (t) => {
      const wrappers = await refusingToolWrappers(REFUSING_TOOLS[m.mode], REFUSED_IP);
      const startAgent = (sb: Sandbox, kubeconfig: string): SandboxProcess =>
        startSandboxAgent(sb, kubeconfig, {
          nodeName: NODE,
          syncPeriodS: SYNC_PERIOD_S,
          mode: m.mode,
          extraArgs: m.extraArgs,
          pathPrefix: wrappers,
          ...(m.extraPermissions ? { extraPermissions: m.extraPermissions } : {}),
        });
      try {
        await runSuite(t, m, startAgent);
      } finally {
        await Deno.remove(wrappers, { recursive: true });
      }
    },
  });
}

/** Waits until the agent's rules carry the "web" ClusterIP; fails at once if the agent exits. */
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
    AGENT_START_MS,
    200,
  ).catch((err) => {
    throw new Error(`${err.message}\nagent output:\n${agent.tail()}`);
  });
}

/** The value of one metric line (name with labels) of the agent's /metrics, read in the node namespace; 0 if absent. */
export async function metricLine(sb: Sandbox, name: string): Promise<number> {
  const r = await sb.tryExec(sb.node, Deno.execPath(), [
    "eval",
    "const r = await fetch('http://127.0.0.1:10249/metrics'); console.log(await r.text())",
  ]);
  const line = r.stdout.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.split(" ")[1]);
}

/**
 * Probes that timed out once and answered when retried at once, as `host:port`: an emulated CPU (the IPVS VM)
 * or a loaded machine loses the odd SYN. Logged as they happen, so a run's output shows every retry.
 */
export const retriedProbes: string[] = [];

/**
 * Pod names answering `count` sequential TCP probes (or outcomes like `timeout`). A probe that times out is
 * retried once and recorded; two timeouts in a row count as a `timeout` (a real loss is not hidden).
 */
async function hits(probe: Probe, host: string, port: number, count: number, opts = {}): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < count; i++) {
    let r = await probe.tcp(host, port, { timeoutMs: 1000, ...opts });
    if (r.result === "timeout") {
      r = await probe.tcp(host, port, { timeoutMs: 1000, ...opts });
      if (r.result !== "timeout") {
        retriedProbes.push(`${host}:${port}`);
        console.log(`  probe ${host}:${port} timed out once; the retry answered ${r.result}`);
      }
    }
    out.push(r.result === "ok" ? r.answer!.split(" ")[0] : r.result);
  }
  return out;
}

/**
 * One UDP probe from a fixed source port, retried once on a timeout with the same port (so the flow keeps its
 * 5-tuple and conntrack entry) and recorded as `hits` records a TCP retry: an emulated CPU loses the odd datagram.
 * Two timeouts in a row are returned as they are (a real loss is not hidden).
 */
async function udpFlow(
  probe: Probe,
  host: string,
  port: number,
  opts: { localPort: number; timeoutMs?: number },
): Promise<ProbeResult> {
  const r = await probe.udp(host, port, opts);
  if (r.result !== "timeout") return r;
  const again = await probe.udp(host, port, opts);
  if (again.result !== "timeout") {
    retriedProbes.push(`udp ${host}:${port}`);
    console.log(`  probe udp ${host}:${port} timed out once; the retry answered ${again.result}`);
  }
  return again;
}

async function runSuite(
  t: Deno.TestContext,
  m: PacketMode,
  startAgent: (sb: Sandbox, kubeconfig: string) => SandboxProcess,
): Promise<void> {
  {
    const sb = await Sandbox.create({
      pods: ["pod-a", "pod-b", "pod-c", "pod-x"],
      extraClientIPs: ["192.168.77.3"],
    });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    /** Ports quarantined after the hostile-objects step. */
    let quarantinedBefore = 0;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), c = sb.pod("pod-c");
      await Promise.all([a, b, c].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081] })));
      sim = await SimulatorProcess.start({ netns: sb.node });
      await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      await sim.upsert(nodeObject(OTHER_NODE, "192.168.78.1", "10.244.1.0/24"));
      const local = (ip: string) => ({ ip, node: NODE });
      const remote = (ip: string) => ({ ip, node: OTHER_NODE });

      // Services used by the steps below, all created before the agent starts.
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
      await sim.upsert(service({
        name: "etp",
        clusterIP: "10.96.0.15",
        type: "NodePort",
        ports: [{ port: 80, nodePort: 30085 }],
        eTPLocal: true,
      }));
      await sim.upsert(endpointSlice("etp", [local(a.ip), remote(c.ip)]));
      await sim.upsert(service({ name: "itp", clusterIP: "10.96.0.16", iTPLocal: true }));
      await sim.upsert(endpointSlice("itp", [local(b.ip), remote(c.ip)]));
      await sim.upsert(service({ name: "empty", clusterIP: "10.96.0.17" }));
      const udpPorts = [{ port: 53, protocol: "UDP" as const }];
      await sim.upsert(service({ name: "dns", clusterIP: "10.96.0.18", ports: udpPorts }));
      await sim.upsert(endpointSlice("dns", [local(a.ip)], udpPorts));
      // At the API's name limits: "namespace/name:port" is 143 bytes, longer than an nftables comment may be.
      // Their ClusterIPs are used by no other Service of any mode's extra steps (ipvs's drain step has 10.96.0.19).
      const limitsPort = (nodePort: number) => [{ name: LIMITS_PORT, port: 80, nodePort }];
      const limitsSvc = (name: string, clusterIP: string, nodePort: number) =>
        atLimits(service({ name, clusterIP, type: "NodePort", ports: limitsPort(nodePort) }));
      await sim.upsert(limitsSvc(LIMITS_SERVED, "10.96.0.23", 30087));
      await sim.upsert(atLimits(endpointSlice(LIMITS_SERVED, [local(a.ip)], limitsPort(30087))));
      await sim.upsert(limitsSvc(LIMITS_EMPTY, "10.96.0.24", 30088));
      await sim.upsert(atLimits(endpointSlice(LIMITS_EMPTY, [], limitsPort(30088))));

      agent = startAgent(sb, sim.kubeconfig);
      const x = sb.pod("pod-x");
      const [pc, pn, px] = await Promise.all([sb.probe(sb.client), sb.probe(sb.node), sb.probe(x.ns)]);
      await waitServing(agent, pn);

      await t.step("ClusterIP from the node and from a pod reaches every endpoint", async () => {
        for (const probe of [pn, px]) {
          const got = tally(await hits(probe, "10.96.0.10", 80, 60));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b", "pod-c"], JSON.stringify(got));
        }
        // Pod-to-Service traffic keeps the pod's IP (no masquerade inside the cluster CIDR).
        const r = await px.tcp("10.96.0.10", 80);
        assert.match(r.answer ?? "", new RegExp(` ${x.ip.replaceAll(".", "\\.")}:\\d+$`), JSON.stringify(r));
      });

      await t.step("NodePort from the client reaches every endpoint, masqueraded", async () => {
        const answers: string[] = [];
        for (let i = 0; i < 40; i++) {
          const r = await pc.tcp(sb.nodeIP, 30080);
          assert.equal(r.result, "ok");
          answers.push(r.answer!);
        }
        assert.deepEqual(new Set(answers.map((x) => x.split(" ")[0])), new Set(["pod-a", "pod-b"]));
        for (const x of answers) {
          assert.ok(!x.includes(` ${sb.clientIP}:`), `client IP not masqueraded: ${x}`);
        }
      });

      await t.step("LoadBalancer IP and externalIP from the client", async () => {
        for (const ip of ["172.30.0.10", "172.30.0.20"]) {
          const got = tally(await hits(pc, ip, 80, 40));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-c"], `${ip}: ${JSON.stringify(got)}`);
        }
      });

      for (const [name, fn] of m.extraSteps ?? []) {
        await t.step(name, () => fn({ sb, sim: sim!, agent: agent!, pc, pn, px }));
      }

      await t.step(
        "Services at the API's name limits, with and without endpoints, are served and rejected beside the " +
          "others; a Service added afterwards is served",
        async () => {
          for (const probe of [pn, px]) {
            assert.equal((await probe.tcp("10.96.0.23", 80)).answer?.split(" ")[0], "pod-a");
            assert.equal((await probe.tcp("10.96.0.24", 80, { timeoutMs: 2000 })).result, "refused");
          }
          assert.equal((await pc.tcp(sb.nodeIP, 30087)).answer?.split(" ")[0], "pod-a");
          assert.equal((await pc.tcp(sb.nodeIP, 30088, { timeoutMs: 2000 })).result, "refused");
          assert.equal((await pn.tcp("10.96.0.10", 80)).result, "ok", "an ordinary Service beside them");
          await sim!.upsert(service({ name: "late", clusterIP: "10.96.0.21" }));
          await sim!.upsert(endpointSlice("late", [local(b.ip)]));
          // Waits for one partial sync after the two events (the agent runs with --iptables-min-sync-period=0s).
          await eventually("the Service added afterwards to be served", async () => {
            const r = await pn.tcp("10.96.0.21", 80, { timeoutMs: 300 });
            return r.answer?.startsWith("pod-b ") ? r : undefined;
          }, CHANGE_MS);
          assert.equal((await px.tcp("10.96.0.24", 80, { timeoutMs: 2000 })).result, "refused");
        },
      );

      await t.step("loadBalancerSourceRanges allow the listed client and drop others", async () => {
        assert.equal((await pc.tcp("172.30.0.11", 80)).answer?.split(" ")[0], "pod-a");
        const denied = await pc.tcp("172.30.0.11", 80, { localAddress: "192.168.77.3", timeoutMs: 700 });
        assert.equal(denied.result, "timeout", JSON.stringify(denied));
      });

      await t.step("ClientIP session affinity keeps one endpoint per client", async () => {
        const fromClient = new Set(await hits(pc, "10.96.0.14", 80, 25));
        assert.equal(fromClient.size, 1, [...fromClient].join(","));
        const fromNode = new Set(await hits(pn, "10.96.0.14", 80, 25));
        assert.equal(fromNode.size, 1, [...fromNode].join(","));
      });

      const fallback = m.externalLocalWithoutLocalEndpoints === "clusterEndpoints";
      await t.step(
        `externalTrafficPolicy Local keeps the client IP and ${
          fallback ? "falls back to cluster endpoints (upstream ipvs)" : "drops"
        } without local endpoints`,
        async () => {
          const clientIP = sb.clientIP.replaceAll(".", "\\.");
          for (let i = 0; i < 20; i++) {
            const r = await pc.tcp(sb.nodeIP, 30085);
            assert.equal(r.result, "ok");
            assert.match(r.answer!, new RegExp(`^pod-a ${clientIP}:\\d+$`));
          }
          await sim!.upsert(endpointSlice("etp", [remote(c.ip)]));
          if (fallback) {
            // The remote endpoint sees the client's own address: no masquerade (in a real cluster its reply
            // would leave from the other node and be dropped by the client, as upstream's comment says).
            await eventually("NodePort 30085 to reach pod-c", async () => {
              const r = await pc.tcp(sb.nodeIP, 30085, { timeoutMs: 500 });
              return r.answer?.startsWith("pod-c ") ? r : undefined;
            }, CHANGE_MS);
            for (let i = 0; i < 5; i++) {
              const r = await pc.tcp(sb.nodeIP, 30085);
              assert.match(r.answer ?? JSON.stringify(r), new RegExp(`^pod-c ${clientIP}:\\d+$`));
            }
          } else {
            await eventually("NodePort 30085 to drop", async () => {
              const r = await pc.tcp(sb.nodeIP, 30085, { timeoutMs: 500 });
              return r.result === "timeout" ? r : undefined;
            }, CHANGE_MS);
          }
          // Still reachable inside the cluster through the ClusterIP (Cluster policy for internal traffic).
          assert.equal((await pn.tcp("10.96.0.15", 80)).answer?.split(" ")[0], "pod-c");
        },
      );

      await t.step("internalTrafficPolicy Local uses only this node's endpoints", async () => {
        assert.deepEqual(new Set(await hits(pn, "10.96.0.16", 80, 30)), new Set(["pod-b"]));
        assert.deepEqual(new Set(await hits(px, "10.96.0.16", 80, 30)), new Set(["pod-b"]));
      });

      await t.step("no endpoints: connections are refused at once", async () => {
        const r = await pc.tcp("10.96.0.17", 80, { timeoutMs: 2000 });
        // "refused" (not "timeout") is the REJECT. The time, measured inside the probe process (so not the
        // test's own scheduling), shows it answered the first SYN: a reply only to a retransmitted SYN would
        // come after Linux's first retransmission, 1 s in.
        assert.equal(r.result, "refused", JSON.stringify(r));
        assert.ok(r.elapsedMs! < 1000, `refused after ${r.elapsedMs} ms`);
        assert.equal((await pn.tcp("10.96.0.17", 80, { timeoutMs: 2000 })).result, "refused");
      });

      await t.step("a removed endpoint is never chosen again once the change is programmed", async () => {
        await sim!.upsert(endpointSlice("web", [local(a.ip), remote(c.ip)]));
        // Waits for the condition (20 answers in a row without pod-b: the new rules are in) instead of a fixed
        // 2 s; CHANGE_MS bounds the propagation.
        await eventually(
          "the removed endpoint to leave the rules",
          async () => {
            const seen = await hits(pn, "10.96.0.10", 80, 20);
            return seen.includes("pod-b") ? undefined : seen;
          },
          CHANGE_MS,
          100,
        );
        const got = tally(await hits(pn, "10.96.0.10", 80, 60));
        assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-c"], JSON.stringify(got));
      });

      await t.step("a UDP flow moves to the new endpoint once the old one is deleted", async () => {
        const pb = await sb.probe(b.ns);
        const first = await udpFlow(pb, "10.96.0.18", 53, { localPort: 40500 });
        assert.equal(first.answer?.split(" ")[0], "pod-a", JSON.stringify(first));
        // pod-a keeps running: only conntrack cleanup can move the flow (same 5-tuple) to pod-c.
        await sim!.upsert(endpointSlice("dns", [local(c.ip)], udpPorts));
        await eventually("the UDP flow to reach pod-c", async () => {
          const r = await pb.udp("10.96.0.18", 53, { localPort: 40500, timeoutMs: 300 });
          return r.answer?.startsWith("pod-c ") ? r : undefined;
        }, CHANGE_MS);
      });

      await t.step(
        "an agent restart keeps established TCP connections and never blackholes new ones",
        async () => {
          const held = await pc.open(sb.nodeIP, 30080);
          assert.equal(held.result, "ok");
          // New connections all along, from the stop to the new agent's first sync and beyond.
          let probing = true;
          const outcomes: string[] = [];
          const prober = (async () => {
            while (probing) {
              const r = await pc.tcp(sb.nodeIP, 30080, { timeoutMs: 1000 });
              outcomes.push(r.result);
              await sleep(50);
            }
          })();
          const status = await agent!.stop(10_000);
          assert.equal(status.code, 0, agent!.tail());
          assert.equal((await pc.send(held.conn!)).result, "ok", "after stop");
          agent = startAgent(sb, sim!.kubeconfig);
          // The old rules stayed in place; wait for the new agent's own first (full) sync to be written.
          await agent.waitForOutput("SyncProxyRules complete", AGENT_START_MS);
          // Not a wait for a condition: the probes go on for half a second of traffic through the rules the new
          // agent wrote, so the window checked covers both sides of its first sync.
          await sleep(500);
          probing = false;
          await prober;
          assert.equal((await pc.send(held.conn!)).result, "ok", "after restart");
          assert.equal((await pc.tcp(sb.nodeIP, 30080)).result, "ok", "new connections after restart");
          const failed = outcomes.filter((o) => o !== "ok");
          assert.ok(outcomes.length >= 5, `only ${outcomes.length} probes during the restart`);
          assert.deepEqual(
            failed,
            [],
            `${failed.length} of ${outcomes.length} connections failed during the restart`,
          );
          await pc.closeConn(held.conn!);
        },
      );

      if (m.partialFlush) {
        const flush = m.partialFlush;
        const ctx = { sb, sim: sim!, agent: agent!, pc, pn, px };
        const inEffect = flush.inEffect ??
          (async () => (await pn.tcp("10.96.0.10", 80, { timeoutMs: 300 })).result !== "ok");
        await t.step(`${flush.name} is repaired within syncPeriod (${SYNC_PERIOD_S}s)`, async () => {
          // No API change happens meanwhile that would cause a sync anyway.
          await flush.run(sb);
          assert.ok(await inEffect(ctx), "flush had no effect");
          await eventually(
            "the flushed rules to be repaired",
            async () => (await inEffect(ctx)) ? undefined : true,
            REPAIR_BOUND_MS,
            200,
          );
        });
      }

      await t.step(
        `rules wiped by a firewall reload are restored within syncPeriod (${SYNC_PERIOD_S}s)`,
        async () => {
          await m.wipe(sb);
          assert.notEqual(
            (await pn.tcp("10.96.0.10", 80, { timeoutMs: 300 })).result,
            "ok",
            "wipe had no effect",
          );
          await eventually(
            "the rules to be restored",
            async () => {
              const r = await pn.tcp("10.96.0.10", 80, { timeoutMs: 300 });
              return r.result === "ok" ? r : undefined;
            },
            REPAIR_BOUND_MS,
            200,
          );
          assert.equal((await pc.tcp(sb.nodeIP, 30080)).result, "ok", "NodePort after the restore");
        },
      );

      await t.step(
        "hostile objects beside good ones: skipped or quarantined with an Event each, the rest and a later Service served",
        async () => {
          // Names the API server would refuse (the simulator serves them as they are), each with endpoints.
          const hostile = ['bad"quote', "bad\nnewline", "b".repeat(300)];
          for (const [i, name] of hostile.entries()) {
            await sim!.upsert(service({ name, clusterIP: `10.96.0.${40 + i}` }));
            await sim!.upsert(endpointSlice(name, [local(a.ip)], undefined, { name: `hostile-${i}` }));
          }
          // A valid Service whose slice holds a hostile address beside a good endpoint.
          await sim!.upsert(service({ name: "mixed", clusterIP: "10.96.0.45" }));
          const mixed = endpointSlice("mixed", [local(b.ip)]);
          mixed.endpoints!.push({ addresses: [`${c.ip} -j ACCEPT`], conditions: { ready: true } });
          await sim!.upsert(mixed);
          // The ClusterIP and port of "web" again (an API server's allocator prevents it): a tool that refuses
          // duplicate keys (nft) gets it quarantined, one that accepts them (iptables) serves it.
          await sim!.upsert(service({ name: "web-dup", clusterIP: "10.96.0.10" }));
          await sim!.upsert(endpointSlice("web-dup", [local(a.ip), remote(c.ip)]));
          // A valid Service whose rules the (wrapped) kernel tool refuses: found by bisection and quarantined.
          if (!m.changesBypassTools) {
            await sim!.upsert(service({ name: "refused", clusterIP: REFUSED_IP }));
            await sim!.upsert(endpointSlice("refused", [local(a.ip)]));
          }
          await sim!.upsert(service({ name: "later", clusterIP: "10.96.0.46" }));
          await sim!.upsert(endpointSlice("later", [local(c.ip)]));
          await eventually(
            "the Service added afterwards to be served",
            async () => {
              const r = await pn.tcp("10.96.0.46", 80, { timeoutMs: 1000 });
              return r.answer?.startsWith("pod-c ") ? r : undefined;
            },
            CHANGE_MS,
            200,
          );
          assert.deepEqual(
            new Set(await hits(pn, "10.96.0.45", 80, 20)),
            new Set(["pod-b"]),
            "mixed: good endpoint only",
          );
          const web = tally(await hits(pn, "10.96.0.10", 80, 40));
          assert.deepEqual(Object.keys(web).sort(), ["pod-a", "pod-c"], JSON.stringify(web));
          for (const [i] of hostile.entries()) {
            const r = await pn.tcp(`10.96.0.${40 + i}`, 80, { timeoutMs: 500 });
            assert.notEqual(r.result, "ok", `hostile Service ${i} is not programmed`);
          }

          const refusedPorts = m.changesBypassTools ? 0 : 1;
          const quarantined = await metricLine(
            sb,
            'denokubeproxy_quarantined_service_ports{ip_family="IPv4"}',
          );
          const events = await eventually(
            "an Event per skipped or quarantined object",
            async () => {
              const evs = (await sim!.list("events")) as KubeEvent[];
              const about = (reason: string, name: string) =>
                evs.filter((e) => e.reason === reason && e.regarding?.name === name);
              const want = [
                ...hostile.map((n) => about("InvalidService", n)),
                ...hostile.map((_, i) => about("InvalidEndpointSlice", `hostile-${i}`)),
                about("InvalidEndpointSlice", "mixed-1"),
                ...(m.changesBypassTools ? [] : [about("ServicePortQuarantined", "refused")]),
              ];
              const dup = about("ServicePortQuarantined", "web-dup");
              return want.every((l) => l.length > 0) && dup.length === quarantined - refusedPorts
                ? { want, dup }
                : undefined;
            },
            CHANGE_MS,
            200,
          );
          assert.match(events.want[0][0].note ?? "", /metadata\.name: Invalid value: "bad\\"quote"/);
          assert.match(events.want[6][0].note ?? "", /endpoints\[1\]\.addresses\[0\]/);
          if (!m.changesBypassTools) {
            assert.match(events.want[7][0].note ?? "", /dp\/refused:p \(IPv4\).*injected refusal/);
          }
          console.log(
            `  ${m.mode}: web-dup ${
              quarantined === refusedPorts + 1 ? "quarantined (the tool refused it)" : "accepted by the tool"
            }`,
          );
          assert.ok(
            quarantined === refusedPorts || quarantined === refusedPorts + 1,
            `quarantined ports: ${quarantined}`,
          );
          quarantinedBefore = quarantined;
          if (!m.changesBypassTools) {
            const refused = await pn.tcp(REFUSED_IP, 80, { timeoutMs: 500 });
            assert.notEqual(refused.result, "ok", "the refused Service is left out");
          }
        },
      );

      if (m.mode !== "ipvs" && !m.changesBypassTools) {
        // ipvs mode has no check mode (ipvsadm, ipset): its isolation syncs subsets for real (docs/robustness.md).
        await t.step(
          "an agent restart with a refused Service present: existing Services stay reachable while it isolates",
          async () => {
            // Every port is a suspect on the first sync after a restart; the search runs in the tool's check
            // mode, so the previous agent's rules serve until the one real sync of the accepted ports.
            let probing = true;
            const outcomes: string[] = [];
            let slowAnswers = 0;
            // Each failure and each step of the restart with its wall-clock time, to tell apart on a failure
            // the old agent's last moments, the gap between agents and the new agent's isolation.
            const timeline: string[] = [];
            const mark = (what: string) => timeline.push(`${new Date().toISOString()} ${what}`);
            const prober = (async () => {
              while (probing) {
                for (const ip of ["10.96.0.10", "10.96.0.46"]) {
                  const r = await pn.tcp(ip, 80, { timeoutMs: 1000 });
                  // A timeout after the handshake is a server slow to answer on a loaded machine: the rules
                  // carried the connection. Only a connection never established counts as a failure.
                  if (r.result === "timeout" && r.connected) slowAnswers++;
                  const outcome = r.result === "ok" || r.connected ? "ok" : `${ip} ${r.result}`;
                  if (outcome !== "ok") {
                    const late = r.timerLateMs === undefined ? "" : `, its timer ${r.timerLateMs} ms late`;
                    mark(`probe failed: ${outcome} after ${r.elapsedMs} ms${late}`);
                  }
                  outcomes.push(outcome);
                }
                await sleep(20);
              }
            })();
            const old = agent!;
            mark("old agent: SIGTERM");
            const status = await old.stop(10_000);
            mark("old agent: exited");
            assert.equal(status.code, 0, old.tail());
            agent = startAgent(sb, sim!.kubeconfig);
            mark("new agent: started");
            await agent.waitForOutput("Programmed every service port but the refused ones", AGENT_START_MS);
            mark("new agent: isolation done");
            // The probes go on until ten more have gone through the rules of the isolating sync.
            const seen = outcomes.length;
            await eventually(
              "probes after the isolation",
              () => Promise.resolve(outcomes.length >= seen + 10 ? true : undefined),
              CHANGE_MS, // ten probes of at most 1 s each
              50,
            );
            probing = false;
            await prober;
            if (slowAnswers > 0) {
              console.log(`  ${m.mode}: ${slowAnswers} connection(s) established but answered late`);
            }
            const failed = outcomes.filter((o) => o !== "ok");
            if (failed.length > 0) {
              const rules = m.mode === "nftables"
                ? await sb.tryExec(sb.node, "nft", ["list", "table", "ip", "kube-proxy"])
                : await sb.tryExec(sb.node, "iptables-save", []);
              console.log(
                `  ${m.mode}: restart timeline\n${timeline.join("\n")}\n--- old agent ---\n${
                  old.tail(6000)
                }` +
                  `\n--- new agent ---\n${agent.tail(8000)}\n--- rules now ---\n${rules.stdout}`,
              );
            }
            assert.deepEqual(
              failed,
              [],
              `${failed.length} of ${outcomes.length} connections failed while the restarted agent isolated`,
            );
            assert.ok(outcomes.length >= 20, `only ${outcomes.length} probes`);
            const isolated = await agent.waitForOutput(
              /Programmed every service port but the refused ones.*/,
            );
            console.log(`  ${m.mode}: ${isolated.replace(/^.*?Programmed/, "Programmed")}`);
            assert.match(isolated, / realSyncs=1 /, "the search ran in check mode: one real sync");
            assert.equal(
              await metricLine(sb, 'denokubeproxy_quarantined_service_ports{ip_family="IPv4"}'),
              quarantinedBefore,
              "the same ports are quarantined again",
            );
            assert.notEqual((await pn.tcp(REFUSED_IP, 80, { timeoutMs: 500 })).result, "ok");
          },
        );
      }

      await t.step("--cleanup leaves nothing of the mode behind", async () => {
        await agent!.stop(10_000);
        const [cmd, ...args] = agentCommand(["--cleanup"]);
        const r = await sb.tryExec(sb.node, cmd, args, undefined, 60_000);
        assert.equal(r.code, 0, r.stderr);
        assert.deepEqual(await m.leftovers(sb), []);
      });
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  }
}
