/**
 * The packet suite in nftables mode with `--nftables-netlink`: partial syncs are the agent's own netlink batches
 * (full syncs still go through nft), and real traffic follows every change as in the nft-only run.
 */
import assert from "node:assert/strict";
import { endpointSlice, eventually, NS, service } from "./helpers.ts";
import { definePacketSuite, metricLine, NODE, type StepContext } from "./suite.ts";

/** A Service added, served and removed: two partial syncs, both over netlink, and the change in the kernel. */
async function changesOverNetlink({ sb, sim, pn }: StepContext): Promise<void> {
  const metric = 'denokubeproxy_nftables_transactions_total{ip_family="IPv4",path="netlink"}';
  const before = await metricLine(sb, metric);
  const pod = sb.pod("pod-a");
  await sim.upsert(service({ name: "netlink", clusterIP: "10.96.0.50" }));
  await sim.upsert(endpointSlice("netlink", [{ ip: pod.ip, node: NODE }]));
  await eventually(
    "the added Service to be served",
    async () => {
      const r = await pn.tcp("10.96.0.50", 80, { timeoutMs: 1000 });
      return r.answer?.startsWith("pod-a ") ? r : undefined;
    },
    30_000,
    200,
  ); // a change's sync: milliseconds; the bound is for a loaded machine
  await sim.delete("services", NS, "netlink");
  await sim.delete("endpointslices", NS, "netlink-1");
  await eventually(
    "the removed Service to be gone",
    async () => {
      const r = await pn.tcp("10.96.0.50", 80, { timeoutMs: 500 });
      return r.result !== "ok" ? r : undefined;
    },
    30_000,
    200,
  );
  const after = await metricLine(sb, metric);
  assert.ok(after >= before + 2, `transactions over netlink: ${before} before, ${after} after`);
}

definePacketSuite({
  mode: "nftables",
  tools: ["nft"],
  extraArgs: ["--nftables-netlink"],
  extraPermissions: ["--allow-ffi"],
  changesBypassTools: true,
  extraSteps: [["an added and a removed Service reach the kernel over netlink", changesOverNetlink]],
  wipe: async (sb) => void await sb.exec(sb.node, "nft", ["flush", "ruleset"]),
  leftovers: async (sb) => {
    const tables = (await sb.exec(sb.node, "nft", ["list", "tables"])).stdout;
    return tables.split("\n").filter((l) => l.includes("kube-proxy"));
  },
});
