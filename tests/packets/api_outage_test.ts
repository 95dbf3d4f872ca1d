/**
 * Packet-level test of the design rule "an API outage leaves the last rules in place": the real agent
 * (`main.ts` with the `start` task's permissions) runs in the sandbox's node namespace against the API
 * server simulator (a child process in the same namespace); the simulator goes away, and real TCP traffic
 * from a pod plus `iptables-save` show that the agent keeps serving the last state it knew. Then a new,
 * empty-history simulator comes back on the same address with changed state, and the agent must notice.
 */

import assert from "node:assert/strict";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import type { Probe } from "../../testkit/probe.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import type { KubeObject } from "../../lib/kube/types.ts";
import {
  endpointSlice,
  eventually,
  nodeObject,
  service,
  serviceChainLines,
  sleep,
  startSandboxAgent,
  tally,
} from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason(["ip", "iptables", "iptables-save", "conntrack", "sysctl"]);
const NODE = "node1";
const OTHER_NODE = "node2";
/** Short, so that the periodic dataplane checks (canary, every syncPeriod) run during the outage. */
const SYNC_PERIOD_S = 1;
/** How long the API server stays away. */
const OUTAGE_MS = 3000;
/**
 * The reflector re-watches at once when the stream breaks, then (connection refused) backs off from 800 ms,
 * doubling, times [1, 2) jitter (lib/kube/reflector.ts, as client-go): retry k happens
 * 0.8*(2^k-1) .. 1.6*(2^k-1) s after the connection broke, i.e.
 * retries 1-3 within [0.8, 1.6], [2.4, 4.8], [5.6, 11.2] s. A server back before 5.6 s is therefore
 * contacted again at the latest 11.2 s after the outage began, i.e. under ~8 s after it is back. The
 * replacement server refuses the agent's resourceVersion ("Too large resource version"), and the relist after
 * that waits out the next backoff step, 6.4 s times [1, 2) jitter: up to 12.8 s more (seen: 10.2 and 12.1 s in
 * a run beside a CPU hog, where the 15 s this bound used to be ran out). 30 s after the server's return covers
 * both and the relist and a sync.
 */
const SERVER_BACK_BEFORE_MS = 5600;
const CONVERGE_MS = 30_000;

function startAgent(sb: Sandbox, kubeconfig: string): SandboxProcess {
  return startSandboxAgent(sb, kubeconfig, { nodeName: NODE, syncPeriodS: SYNC_PERIOD_S });
}

/** Pod names answering `count` sequential TCP probes (or outcomes like `timeout`). */
async function hits(probe: Probe, host: string, port: number, count: number): Promise<string[]> {
  return await probe.repeat({ op: "tcp", host, port, timeoutMs: 1000 }, count);
}

/** The KUBE-SVC-/KUBE-SEP- lines of the node's nat table, counters removed. */
async function serviceRules(sb: Sandbox): Promise<string[]> {
  return serviceChainLines((await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout);
}

privilegedTest(unavailable, {
  name: "dataplane: an API server outage leaves the agent's last rules in place",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const sb = await Sandbox.create({ pods: ["pod-a", "pod-b", "pod-c", "pod-x"] });
    let sim: SimulatorProcess | undefined;
    let agent: SandboxProcess | undefined;
    let manifest: string | undefined;
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), c = sb.pod("pod-c"), x = sb.pod("pod-x");
      await Promise.all([a, b, c].map((p) => sb.startServer(p.ns, { tcp: [8080] })));
      const local = (ip: string) => ({ ip, node: NODE });
      const nodes = [
        nodeObject(NODE, sb.nodeIP, sb.podCIDR),
        nodeObject(OTHER_NODE, "192.168.78.1", "10.244.1.0/24"),
      ];

      sim = await SimulatorProcess.start({ netns: sb.node });
      for (const n of nodes) await sim.upsert(n);
      await sim.upsert(service({ name: "web", clusterIP: "10.96.0.10" }));
      await sim.upsert(endpointSlice("web", [local(a.ip), local(b.ip)]));
      // History the replacement server will not have: this server's resourceVersions run well past
      // everything the replacement holds, as after a restore or a fresh control plane.
      for (let i = 0; i < 30; i++) await sim.upsert(nodes[1]);
      const port = Number(new URL(sim.url).port);

      agent = startAgent(sb, sim.kubeconfig);
      let agentExit: Deno.CommandStatus | undefined;
      agent.status.then((s) => agentExit = s);
      const px = await sb.probe(x.ns);

      let before: string[] = [];
      await t.step("synced: the ClusterIP reaches both endpoints from a pod", async () => {
        await eventually(
          "the agent's first sync",
          async () => {
            if (agentExit) throw new Error(`the agent exited (${agentExit.code})`);
            const r = await px.tcp("10.96.0.10", 80, { timeoutMs: 300 });
            return r.result === "ok" ? r : undefined;
          },
          30_000,
          200,
        ).catch((err) => {
          throw new Error(`${err.message}\nagent output:\n${agent!.tail()}`);
        });
        const got = tally(await hits(px, "10.96.0.10", 80, 40));
        assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
        before = await serviceRules(sb);
        assert.ok(before.some((l) => l.startsWith(":KUBE-SVC-")), before.join("\n"));
        assert.equal(before.filter((l) => l.startsWith(":KUBE-SEP-")).length, 2, before.join("\n"));
      });

      let outageStart = 0;
      let oldRv = 0;
      await t.step(
        `API server away for ${OUTAGE_MS / 1000} s: agent alive, traffic and rules unchanged`,
        async () => {
          oldRv = (await sim!.stats()).rv;
          const logBefore = agent!.output.length;
          outageStart = performance.now();
          await sim!.close();
          sim = undefined;
          let rounds = 0;
          while (performance.now() - outageStart < OUTAGE_MS) {
            assert.equal(agentExit, undefined, `the agent exited during the outage:\n${agent!.tail()}`);
            const got = tally(await hits(px, "10.96.0.10", 80, 20));
            assert.deepEqual(
              Object.keys(got).sort(),
              ["pod-a", "pod-b"],
              `round ${rounds}: ${JSON.stringify(got)}`,
            );
            rounds++;
            await sleep(100);
          }
          assert.equal(agentExit, undefined, `the agent exited during the outage:\n${agent!.tail()}`);
          assert.deepEqual(
            await serviceRules(sb),
            before,
            "KUBE-SVC/KUBE-SEP rules changed during the outage",
          );
          // The outage was real for the agent: its watches broke and it kept retrying.
          const during = agent!.output.slice(logBefore);
          assert.match(during, /Watch failed - backing off|Failed to watch/, during.slice(-3000));
          assert.match(during, /connection refused 127\.0\.0\.1:\d+/, "the log names the cause");
        },
      );

      await t.step({
        name: `a new API server on the same address with changed state is picked up within ${
          CONVERGE_MS / 1000
        } s`,
        // The replacement server's resourceVersions started over below the agent's: it answers the agent's
        // watch with 504 "Too large resource version" (as kube-apiserver does after an etcd restore), and
        // the reflector relists with no resourceVersion, as client-go.
        fn: async () => {
          // Changed state: pod-b left "web", and a new Service "extra" (pod-c) exists.
          const objs: KubeObject[] = [
            ...nodes,
            service({ name: "web", clusterIP: "10.96.0.10" }),
            endpointSlice("web", [local(a.ip)]),
            service({ name: "extra", clusterIP: "10.96.0.20" }),
            endpointSlice("extra", [local(c.ip)]),
          ];
          manifest = await Deno.makeTempFile({ prefix: "dkp-outage-", suffix: ".json" });
          await Deno.writeTextFile(manifest, JSON.stringify({ kind: "List", items: objs }));
          // Loaded before the first request is served: the agent never sees an empty server.
          sim = await SimulatorProcess.start({ netns: sb.node, port, load: [manifest] });
          const back = performance.now() - outageStart;
          assert.equal(new URL(sim.url).port, String(port));
          const newRv = (await sim.stats()).rv;
          // The scenario: resourceVersions started over below what the agent last saw.
          assert.ok(newRv < oldRv, `new server rv ${newRv} is not below the old ${oldRv}`);
          assert.ok(
            back < SERVER_BACK_BEFORE_MS,
            `the new server took ${
              Math.round(back)
            } ms to come back; the ${CONVERGE_MS} ms bound assumes < ${SERVER_BACK_BEFORE_MS}`,
          );
          const logBefore = agent!.output.length;
          try {
            await eventually(
              "pod-b to leave web and extra to answer",
              async () => {
                if (agentExit) throw new Error(`the agent exited (${agentExit.code})`);
                const extra = await px.tcp("10.96.0.20", 80, { timeoutMs: 300 });
                if (extra.answer?.split(" ")[0] !== "pod-c") return undefined;
                const got = tally(await hits(px, "10.96.0.10", 80, 30));
                return Object.keys(got).join() === "pod-a" ? got : undefined;
              },
              CONVERGE_MS,
              250,
            );
          } catch (err) {
            const st = await sim.stats().catch((e) => String(e));
            throw new Error(
              `${(err as Error).message}\nnew server: rv ${newRv} (old ${oldRv}), stats ${
                JSON.stringify(st)
              }\nrules:\n${(await serviceRules(sb)).join("\n")}\nagent output since the server came back:\n${
                agent!.output.slice(logBefore).slice(-4000)
              }`,
            );
          }
          // Stable: 60 more connections never reach pod-b.
          const got = tally(await hits(px, "10.96.0.10", 80, 60));
          assert.deepEqual(Object.keys(got), ["pod-a"], JSON.stringify(got));
          assert.equal(agentExit, undefined, agent!.tail());
        },
      });
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sim?.close().catch(() => {});
      if (manifest) await Deno.remove(manifest).catch(() => {});
      await sb.destroy();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  },
});
