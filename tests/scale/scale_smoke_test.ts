/**
 * Smoke test of the side-by-side scale harness (scripts/scale.ts) at small scale: 100 Services × 3 endpoints,
 * 3 s of churn (20 endpoint updates and 1 added Service per second), this agent and upstream kube-proxy on the
 * same generated state in throwaway namespaces: with real iptables-legacy, and with real nftables (`nft`).
 * Upstream runs when scripts/build_k8s.sh has built it; skipped (explicitly) when not root.
 * @module
 */
import assert from "node:assert/strict";
import { runScale, type ScaleOptions, sideBySide } from "../../scripts/scale.ts";
import { type AgentName, type ScaleMode, upstreamAvailable } from "../../scripts/scale_agents.ts";
import { privilegedTest, privilegedTestsRequired } from "../../testkit/privileged.ts";

const withUpstream = await upstreamAvailable();
// Where privileged tests are required (CI), upstream must be there too: a run without it must not look green.
const unavailable = Deno.uid() !== 0
  ? "the scale harness needs root"
  : !withUpstream && privilegedTestsRequired()
  ? "upstream kube-proxy is not built (run scripts/build_k8s.sh)"
  : undefined;
const agents: AgentName[] = withUpstream ? ["ours", "upstream"] : ["ours"];
const who = withUpstream ? "ours and upstream" : "ours only (upstream kube-proxy not built)";

function options(mode: ScaleMode, list: AgentName[] = agents, monitor = false): ScaleOptions {
  return {
    services: 100,
    endpoints: 3,
    mode,
    backend: "legacy",
    agents: list,
    runs: 1,
    churn: 20,
    serviceAdds: 1,
    duration: 3,
    minSync: 1,
    settle: 2,
    timeout: 60,
    bareRestore: true,
    seed: 1,
    keep: false,
    monitor,
    verbose: false,
  };
}

/** Runs the harness in `mode` and checks what every mode must measure. */
async function smoke(mode: ScaleMode, list: AgentName[] = agents, monitor = false): Promise<void> {
  const o = options(mode, list, monitor);
  const runs = await runScale(o);
  const table = sideBySide(o, runs);
  console.log(table);
  assert.equal(runs.length, list.length);
  for (const r of runs) {
    const who = `${r.agent}: `;
    assert.deepEqual(r.errors, [], who + "no errors");
    assert(r.firstSyncS !== null && r.firstSyncS > 0 && r.firstSyncS < 60, who + "first sync measured");
    assert(
      r.bareRestoreS !== null && r.bareRestoreS > 0,
      who + "bare apply of the same payload measured",
    );
    assert.equal(r.programmed, 103, who + "every Service (100 + 3 added) is in the kernel");
    assert.equal(r.endpointEvents, 60);
    assert.equal(r.endpointResolved, 60, who + "every EndpointSlice update reached a payload");
    assert.equal(r.serviceEvents, 3);
    assert.equal(r.serviceResolved, 3, who + "every added Service reached a payload");
    assert(
      r.endpointInKernelMs.every((ms) => ms >= 0 && ms < 20_000),
      `${who}latencies ${r.endpointInKernelMs}`,
    );
    assert(
      r.serviceOverheadInKernelMs.every((ms, k) =>
        ms >= r.serviceOverheadMs[k] && ms <= r.serviceInKernelMs[k]
      ),
      `${who}in kernel beyond minSync lies between handed beyond minSync and in kernel`,
    );
    assert(r.partialRestores.length > 0, who + "churn applied by restores / transactions");
    assert(r.rssSettledMiB !== null && r.hwmMiB !== null && r.hwmMiB >= r.rssSettledMiB, who + "memory");
    assert.equal(r.restoreFailures, 0);
  }
  const ours = runs.find((r) => r.agent.startsWith("ours"))!;
  assert.deepEqual(
    ours.oursCallsDuringPartial,
    [],
    "no call besides the restore / transactions in a partial sync",
  );
  assert(ours.oursFullGenerateMs !== null, "generation time logged");
  if (withUpstream && list.length === 2) {
    assert.match(table, new RegExp(`\\| ${list[0]} \\| upstream \\| ${list[0]} \\/ upstream \\|`));
  }
}

privilegedTest(unavailable, {
  name: `scale harness side by side, iptables: 100 services, 3 s churn — ${who}: ` +
    "every service programmed, every change seen in the kernel, figures measured",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: () => smoke("iptables"),
});

privilegedTest(unavailable, {
  name: `scale harness side by side, nftables: 100 services, 3 s churn — ${who}: ` +
    "every service's element in the kernel, every change seen in an nft -f transaction, figures measured",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: () => smoke("nftables"),
});

privilegedTest(unavailable, {
  name: `scale harness, nftables timed by nft monitor: 100 services, 3 s churn — ours-netlink${
    withUpstream ? " and upstream" : ""
  }: every change seen committed, its netlink batches included`,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: () => smoke("nftables", withUpstream ? ["ours-netlink", "upstream"] : ["ours-netlink"], true),
});
