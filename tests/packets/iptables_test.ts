/**
 * The packet suite in iptables mode (default backend), plus what only this mode has: upstream's nfacct
 * counters and the repair of a flushed nat KUBE-SERVICES chain (beyond upstream's canary check).
 */
import assert from "node:assert/strict";
import type { Sandbox } from "../../testkit/sandbox.ts";
import { definePacketSuite, type StepContext } from "./suite.ts";

/** Reads one un-labelled metric from the agent's /metrics inside the node namespace; null when absent. */
async function metricValue(sb: Sandbox, name: string): Promise<number | null> {
  const r = await sb.tryExec(sb.node, Deno.execPath(), [
    "eval",
    "const r = await fetch('http://127.0.0.1:10249/metrics'); console.log(await r.text())",
  ]);
  const line = r.stdout.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? null : Number(line.split(" ")[1]);
}

async function localhostNodePortCounted({ sb, pn }: StepContext): Promise<void> {
  const name = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
  const before = await metricValue(sb, name);
  assert.notEqual(before, null, "the metric is exposed");
  for (let i = 0; i < 3; i++) assert.equal((await pn.tcp("127.0.0.1", 30080)).result, "ok");
  const after = await metricValue(sb, name);
  assert.ok(after! >= before! + 3, `${before} -> ${after}`);
  const invalid = (await sb.exec(sb.node, "nfacct", ["get", "ct_state_invalid_dropped_pkts"])).stdout;
  assert.match(invalid, /= ct_state_invalid_dropped_pkts;/);
}

definePacketSuite({
  mode: "iptables",
  tools: ["iptables", "iptables-save", "nfacct"],
  extraSteps: [
    [
      "a localhost NodePort from the node works and is counted by upstream's nfacct metric",
      localhostNodePortCounted,
    ],
  ],
  partialFlush: {
    // The canary chains survive this flush, so the agent must notice the empty chain itself.
    name: "iptables -t nat -F KUBE-SERVICES",
    run: async (sb) =>
      void await sb.exec(sb.node, "iptables", ["-w", "5", "-t", "nat", "-F", "KUBE-SERVICES"]),
  },
  wipe: async (sb) => {
    // What a firewall reload does: flush every chain, then delete every user chain (canaries included).
    for (const table of ["nat", "filter", "mangle"]) {
      await sb.exec(sb.node, "iptables", ["-w", "5", "-t", table, "-F"]);
      await sb.exec(sb.node, "iptables", ["-w", "5", "-t", table, "-X"]);
    }
  },
  leftovers: async (sb) => {
    const left: string[] = [];
    for (const save of ["iptables-save", "iptables-legacy-save", "iptables-nft-save"]) {
      const out = await sb.tryExec(sb.node, save, []);
      if (out.code === 127) continue;
      // As upstream's CleanupLeftovers, kubelet's KUBE-FIREWALL (which kube-proxy only duplicates) stays.
      left.push(
        ...out.stdout.split("\n").filter((l) => l.includes("KUBE-") && !l.includes("KUBE-FIREWALL")).map((
          l,
        ) => `${save}: ${l}`),
      );
    }
    return left;
  },
});
