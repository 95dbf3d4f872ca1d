/**
 * Measures how long a new Service takes to reach the kernel after the API server fails some requests,
 * for this agent and for upstream kube-proxy v1.35.4 (built by scripts/build_k8s.sh), against the same
 * simulator with the same injected faults, each in its own network-namespace sandbox (root).
 *
 *     deno run -A scripts/retry_timing.ts ours|upstream [runs=3] [faults=watch500,list500,list500 | any8]
 *
 * After the first sync (and 2 s of quiet), the faults are armed on the services resource (`watch500`,
 * `list500`, ... one failure each, in order of kind) or on the next 8 requests of any kind (`any8`), every
 * watch is dropped and a Service "late" is created; the time until `iptables-save` shows it is printed with
 * the simulator's list/watch counts. Upstream runs with `--feature-gates=WatchListClient=false`: client-go
 * 1.35 streams its initial lists (`sendInitialEvents`), which the simulator does not serve.
 * @module
 */
import { Sandbox } from "../testkit/sandbox.ts";
import { SimulatorProcess } from "../testkit/apiserver_process.ts";
import { agentCommand } from "../testkit/agent_command.ts";
import { k8sBinary } from "../testkit/kube_apiserver.ts";
import { endpointSlice, nodeObject, service } from "../tests/packets/helpers.ts";

const UPSTREAM = k8sBinary("kube-proxy");

const which = Deno.args[0];
if (which !== "ours" && which !== "upstream") {
  console.error("usage: retry_timing.ts ours|upstream [runs] [faults]");
  Deno.exit(2);
}
const runs = Number(Deno.args[1] ?? 3);
const faults = (Deno.args[2] ?? "watch500,list500,list500").split(",");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const results: number[] = [];

for (let i = 0; i < runs; i++) {
  const sb = await Sandbox.create();
  const sim = await SimulatorProcess.start({ netns: sb.node });
  try {
    await sim.upsert(nodeObject("node1", sb.nodeIP, sb.podCIDR));
    await sim.upsert(service({ name: "web", clusterIP: "10.96.0.10" }));
    await sim.upsert(endpointSlice("web", [{ ip: "10.244.0.5", node: "node1" }]));
    const flags = [
      "--kubeconfig",
      sim.kubeconfig,
      "--hostname-override",
      "node1",
      "--cluster-cidr=10.244.0.0/16",
      "--iptables-min-sync-period=0s",
      "--conntrack-max-per-core=0",
      "--conntrack-tcp-timeout-established=0",
      "--conntrack-tcp-timeout-close-wait=0",
    ];
    const [cmd, ...args] = which === "ours"
      ? agentCommand(flags)
      : [UPSTREAM, ...flags, "--feature-gates=WatchListClient=false"];
    const agent = sb.spawn(sb.node, cmd, args);
    const has = async (name: string) =>
      (await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout.includes(`"dp/${name}:p cluster IP"`);
    const start = performance.now();
    while (!(await has("web"))) {
      if (performance.now() - start > 30_000) throw new Error(`no first sync:\n${agent.tail()}`);
      await sleep(50);
    }
    await sleep(2000);
    for (const f of faults) {
      if (f === "any8") await sim.failNext(8, 500);
      else {
        const m = /^(watch|list)(\d{3})$/.exec(f);
        if (!m) throw new Error(`unknown fault ${f}`);
        await sim.failNext(1, Number(m[2]), { kind: m[1] as "watch" | "list", resource: "services" });
      }
    }
    const t0 = performance.now();
    await sim.dropWatches();
    await sim.upsert(service({ name: "late", clusterIP: "10.96.0.30" }));
    await sim.upsert(endpointSlice("late", [{ ip: "10.244.0.6", node: "node1" }]));
    while (!(await has("late"))) {
      if (performance.now() - t0 > 300_000) throw new Error(`"late" never programmed:\n${agent.tail()}`);
      await sleep(25);
    }
    results.push((performance.now() - t0) / 1000);
    const st = await sim.stats();
    console.log(
      `${which} run ${i + 1}: ${results.at(-1)!.toFixed(2)} s (lists ${st.lists}, watches ${st.watches})`,
    );
    await agent.stop();
  } finally {
    await sim.close();
    await sb.destroy();
  }
}
console.log(`${which}: ${results.map((x) => x.toFixed(2)).join(" ")} s`);
