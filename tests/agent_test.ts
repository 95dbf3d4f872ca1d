/**
 * The whole agent (lib/agent.ts: informers, node manager, proxier, iptables dataplane, servers, events)
 * against the API server simulator over real HTTP, with a recording command runner in place of the
 * kernel tools (DESIGN.md testing layer 2).
 */
import assert from "node:assert/strict";
import { DEFAULT_MODE_MESSAGE, runAgent } from "../lib/agent.ts";
import { parseCommandLine } from "../lib/config/command.ts";
import { type RecordedCall, RecordingCommandRunner } from "../lib/exec.ts";
import { configureLogging } from "../lib/log.ts";
import type { EndpointSlice, KubeEvent, Node, Service } from "../lib/kube/types.ts";
import { ApiServerSimulator } from "../testkit/apiserver.ts";

const node: Node = {
  apiVersion: "v1",
  kind: "Node",
  metadata: { name: "node1", labels: { "topology.kubernetes.io/zone": "z1" } },
  status: { addresses: [{ type: "InternalIP", address: "10.250.0.1" }] },
};

function service(name: string, clusterIP: string, protocol = "TCP"): Service {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name, namespace: "demo" },
    spec: {
      type: "ClusterIP",
      clusterIP,
      clusterIPs: [clusterIP],
      ports: [{ name: "p", port: 80, protocol }],
    },
  };
}

function slice(svc: string, ips: string[], protocol = "TCP"): EndpointSlice {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: { name: `${svc}-abc`, namespace: "demo", labels: { "kubernetes.io/service-name": svc } },
    addressType: "IPv4",
    ports: [{ name: "p", port: 8080, protocol }],
    endpoints: ips.map((ip) => ({ addresses: [ip], conditions: { ready: true }, nodeName: "node1" })),
  };
}

function responder(call: RecordedCall) {
  if (call.cmd === "ip") return { stdout: "[]" };
  if (call.cmd === "sysctl" && call.args[0] === "-n") return { stdout: "0\n" };
  return undefined;
}

const isRestore = (c: RecordedCall) => /^ip(6)?tables(-nft|-legacy)?-restore$/.test(c.cmd);

async function until(what: string, cond: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

interface AgentHarness {
  sim: ApiServerSimulator;
  runner: RecordingCommandRunner;
  /** Exit codes the agent asked for. */
  exits: number[];
}

/**
 * Starts the simulator holding `objects`, runs the whole agent against it with a recording runner (health
 * and metrics on free loopback ports), runs `body`, and tears everything down.
 */
async function withAgent(
  objects: { services?: Service[]; slices?: EndpointSlice[] },
  body: (h: AgentHarness) => Promise<void>,
  extraArgs: string[] = [],
): Promise<void> {
  configureLogging({ sink: () => {} });
  const sim = await ApiServerSimulator.start();
  sim.upsert("nodes", node);
  for (const svc of objects.services ?? []) sim.upsert("services", svc);
  for (const sl of objects.slices ?? []) sim.upsert("endpointslices", sl);
  const kubeconfig = await sim.writeKubeconfig();
  const runner = new RecordingCommandRunner(responder);
  const exits: number[] = [];
  const parsed = await parseCommandLine([
    "--kubeconfig",
    kubeconfig,
    "--hostname-override",
    "node1",
    "--cluster-cidr",
    "10.244.0.0/16",
    "--iptables-min-sync-period",
    "0s",
    ...extraArgs,
  ], { stdout: () => {}, stderr: () => {} });
  assert.ok("options" in parsed);
  const opts = parsed.options;
  opts.config.healthzBindAddress = "127.0.0.1:0";
  opts.config.metricsBindAddress = "127.0.0.1:0";
  const agent = await runAgent(opts, { runner, exit: (code) => void exits.push(code) });
  try {
    await body({ sim, runner, exits });
  } finally {
    await agent.stop();
    await sim.close();
    await Deno.remove(kubeconfig);
    configureLogging({ sink: (l) => console.error(l) });
  }
}

Deno.test({
  name:
    "agent: syncs after both informers, follows a slice change with a partial restore and no other iptables call",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    await withAgent({
      services: [service("web", "10.96.0.10")],
      slices: [slice("web", ["10.244.0.11", "10.244.0.12"])],
    }, async ({ sim, runner, exits }) => {
      await until(
        "the first restore",
        () => runner.calls.some((c) => isRestore(c) && c.stdin.includes("10.244.0.12:8080")),
      );
      const first = runner.calls.find(isRestore)!;
      assert.match(first.stdin, /-A KUBE-SERVICES -m comment --comment "demo\/web:p cluster IP"/);
      assert.match(first.stdin, /^\*nat$/m);

      const before = runner.calls.length;
      sim.upsert("endpointslices", slice("web", ["10.244.0.11", "10.244.0.13"]));
      await until(
        "the partial restore",
        () => runner.calls.slice(before).some((c) => isRestore(c) && c.stdin.includes("10.244.0.13:8080")),
      );
      const after = runner.calls.slice(before);
      const iptablesCalls = after.filter((c) => c.cmd.includes("iptables"));
      assert.ok(
        iptablesCalls.every(isRestore),
        `only restores: ${iptablesCalls.map((c) => c.cmd).join(", ")}`,
      );
      const partial = iptablesCalls.find((c) => c.stdin.includes("10.244.0.13:8080"))!;
      assert.ok(
        !partial.stdin.includes("-X KUBE-PROXY-CANARY"),
        "partial restore does not touch static chains",
      );
      assert.ok(partial.stdin.includes("-X KUBE-SEP-"), "the removed endpoint's chain is deleted");
      assert.deepEqual(exits, []);
    });
  },
});

Deno.test({
  name: "agent: a malformed Service is skipped with an Event and the other services' rules stay",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    await withAgent(
      { services: [service("web", "10.96.0.10")], slices: [slice("web", ["10.244.0.11"])] },
      async ({ sim, runner }) => {
        await until("the first restore", () => runner.calls.some(isRestore));
        sim.upsert("services", service("broken", "10.96.0.999"));
        sim.upsert("services", service("api", "10.96.0.20"));
        await until(
          "the api service",
          () => runner.calls.some((c) => isRestore(c) && c.stdin.includes("demo/api:p")),
        );
        const last = runner.calls.filter(isRestore).at(-1)!;
        assert.ok(!last.stdin.includes("demo/broken"), "the broken service has no rules");
        await until(
          "the InvalidService event",
          () =>
            sim.list<KubeEvent>("events").some((e) =>
              e.reason === "InvalidService" && e.regarding?.name === "broken"
            ),
        );
        const invalid = sim.list<KubeEvent>("events").find((e) => e.reason === "InvalidService");
        assert.equal(invalid?.note, "Service has an invalid cluster IP; skipping it (spec.clusterIPs[0])");
        const starting = sim.list<KubeEvent>("events").find((e) => e.reason === "Starting");
        assert.equal(starting?.regarding?.kind, "Node");
        assert.equal(starting?.regarding?.name, "node1");
        // The web service is still served: every restore since the first keeps its dispatch rule and none
        // deletes its chain.
        const webChain = runner.calls.find(isRestore)!.stdin.match(
          /"demo\/web:p cluster IP".* -j (KUBE-SVC-\w+)/,
        )?.[1];
        assert.ok(webChain);
        for (const c of runner.calls.filter((c) => isRestore(c) && c.cmd.startsWith("iptables"))) {
          assert.ok(c.stdin.includes(`-j ${webChain}`), "web dispatch rule present in every restore");
          assert.ok(!c.stdin.includes(`-X ${webChain}`), "web chain never deleted");
        }
      },
    );
  },
});

Deno.test({
  name: "agent: exits with status 1 when its Node is deleted, as upstream",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    await withAgent({}, async ({ sim, runner, exits }) => {
      await until("the first restore", () => runner.calls.some(isRestore));
      sim.delete("nodes", undefined, "node1");
      await until("exit", () => exits.length > 0);
      assert.deepEqual(exits, [1]);
    });
  },
});

Deno.test({
  name:
    "agent: after a watch 500 and two list 500s a new Service is programmed after client-go's three backoff steps (each in its window)",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    await withAgent({ services: [service("web", "10.96.0.10")] }, async ({ sim, runner }) => {
      await until("the first restore", () => runner.calls.some(isRestore));
      await until("the services watch", () => sim.openWatches("services") === 1);
      // Let the watch last over a second so that its end is not a "very short watch".
      await new Promise((r) => setTimeout(r, 1100));
      sim.faults.failNext(1, 500, { kind: "watch", resource: "services" });
      sim.faults.failNext(2, 500, { kind: "list", resource: "services" });
      const t0 = performance.now();
      sim.faults.dropWatches();
      sim.upsert("services", service("late", "10.96.0.30"));
      await until(
        "the late service",
        () => runner.calls.some((c) => isRestore(c) && c.stdin.includes("demo/late:p")),
        20_000,
      );
      const s = (performance.now() - t0) / 1000;
      // client-go: re-watch at once (500) -> wait 0.8-1.6 s -> list (500) -> wait 1.6-3.2 s -> list (500)
      // -> wait 3.2-6.4 s -> list (ok, has "late") -> sync. The old loop re-watched after one step (~1 s).
      // A wait never ends early, so the sum of the three lower bounds holds on any machine.
      assert.ok(s >= 5.6, `programmed after ${s.toFixed(2)} s, before client-go's third retry`);
      // Each step measured where the requests arrive, not end to end (a loaded machine delays the sync after
      // the last list by seconds): the gap before each relist lies in its backoff window. The 0.5 s over
      // the upper end is the latency of one timer and one request on a busy machine; a slower schedule (one
      // step further, double the waits) would exceed the windows by seconds.
      const after = sim.stats.arrivals.filter((r) => r.resource === "services" && r.at >= t0);
      const rewatch = after.find((r) => r.kind === "watch")!;
      const lists = after.filter((r) => r.kind === "list").map((r) => r.at);
      assert.equal(lists.length, 3, "two failed relists and one good one");
      const gaps = [lists[0] - rewatch.at, lists[1] - lists[0], lists[2] - lists[1]].map((g) => g / 1000);
      for (const [i, [lo, hi]] of [[0.8, 1.6], [1.6, 3.2], [3.2, 6.4]].entries()) {
        assert.ok(
          gaps[i] >= lo - 0.05 && gaps[i] < hi + 0.5,
          `backoff step ${i + 1}: ${gaps[i].toFixed(2)} s`,
        );
      }
      assert.equal(sim.stats.lists("services"), 4, "initial list, two failed relists, one good relist");
    });
  },
});

Deno.test({
  name:
    "agent: a defaulted proxy mode is logged and recorded as a KubeProxyDefaultMode Warning Event, a set one is not (v1.37)",
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const defaultModeEvents = (sim: ApiServerSimulator) =>
      sim.list<KubeEvent>("events").filter((e) => e.reason === "KubeProxyDefaultMode");
    await withAgent({}, async ({ sim }) => {
      await until("the KubeProxyDefaultMode event", () => defaultModeEvents(sim).length > 0);
      const e = defaultModeEvents(sim)[0];
      assert.equal(e.type, "Warning");
      assert.equal(e.note, DEFAULT_MODE_MESSAGE);
      assert.equal(e.regarding?.name, "node1");
    });
    await withAgent({}, async ({ sim }) => {
      // The Starting event is recorded after the mode's start-up: once it is there, a warning would be too.
      await until(
        "the Starting event",
        () => sim.list<KubeEvent>("events").some((e) => e.reason === "Starting"),
      );
      assert.deepEqual(defaultModeEvents(sim), []);
    }, ["--proxy-mode=iptables"]);
  },
});
