/**
 * Smoke test of the API cost harness (scripts/api_cost.ts) at small scale: the real kube-apiserver with
 * 50 Services × 3 endpoints, 2 agents of each kind started at once (this agent with LIST, with watch-list, and
 * upstream kube-proxy when built), 3 s of endpoint churn; then the steady-state form (`together`: this agent and
 * upstream started at once and churned together, requests counted per window), in two rounds on one load. Pins that every agent syncs
 * through the no-op dataplane, that the audit log attributes each agent's requests to it (LIST + WATCH for ours,
 * watch-list for the other two) and that the byte, window and API server figures are measured.
 * @module
 */
import assert from "node:assert/strict";
import {
  type AgentKind,
  type ApiCostOptions,
  roundsTable,
  runApiCost,
  table,
} from "../../scripts/api_cost.ts";
import { upstreamAvailable } from "../../scripts/scale_agents.ts";
import { kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { privilegedTestsRequired } from "../../testkit/privileged.ts";

const withUpstream = await upstreamAvailable();
const unavailable = kubeApiServerUnavailableReason() ??
  (!withUpstream && privilegedTestsRequired() ? "upstream kube-proxy is not built" : undefined);

Deno.test({
  name:
    "api cost harness: N agents per kind sync on the real kube-apiserver, requests and bytes per agent measured",
  ignore: unavailable !== undefined,
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const kinds: AgentKind[] = withUpstream
      ? ["ours", "ours-watchlist", "upstream"]
      : ["ours", "ours-watchlist"];
    const o: ApiCostOptions = {
      services: 50,
      endpoints: 3,
      agents: 2,
      kinds,
      churn: 5,
      duration: 3,
      window: 2,
      together: false,
      settle: 2,
      timeout: 90,
      concurrency: 8,
      rounds: 1,
      // kube-apiserver restarted before every kind (its etcd keeps the load).
      freshApiServer: true,
      verbose: false,
    };
    await check(o);
    // The steady-state form: every kind at once, one churn, requests per window; two rounds on one load (each
    // round's requests are its own agents').
    await check({
      ...o,
      kinds: kinds.filter((k) => k !== "ours-watchlist"),
      together: true,
      rounds: 2,
      freshApiServer: false,
    });
  },
});

async function check(o: ApiCostOptions): Promise<void> {
  const rs = await runApiCost(o);
  console.log(table(o, rs.filter((r) => r.round === 0)));
  assert.equal(rs.length, o.kinds.length * o.rounds);
  if (o.rounds > 1) {
    const t = roundsTable(rs);
    console.log(t);
    assert.equal(t.match(/\| median \|/g)?.length, 3, "three figures per round");
    assert.deepEqual(rs.map((r) => r.round), [0, 1].flatMap((r) => o.kinds.map(() => r)));
  }
  for (const r of rs) {
    assert.equal(r.agentsTogether, o.together ? 2 * o.kinds.length : 2);
    // 3 s of churn in 2 s windows: two windows per agent, every agent's.
    assert.deepEqual(r.churnRequestsPerWindow.map((w) => w.length), [2, 2]);
    assert.deepEqual(r.errors, [], `${r.kind}: no errors`);
    assert.equal(r.firstSyncS.length, 2);
    for (const s of r.firstSyncS) assert(s !== null && s > 0 && s < 90, `${r.kind}: first sync measured`);
    for (const b of r.startBytes) assert(b > 10_000, `${r.kind}: bytes received measured (${b})`);
    assert(r.apiCpuStartS > 0, `${r.kind}: API server CPU measured`);
    assert(r.apiRssPeakMiB > 0 && r.apiRssBeforeMiB > 0, `${r.kind}: API server RSS measured`);
    for (const v of r.startRequests) {
      if (r.kind === "ours") {
        assert(
          (v.list ?? 0) >= 3 && (v.watch ?? 0) >= 3,
          `${r.kind}: LIST then WATCH: ${JSON.stringify(v)}`,
        );
        assert.equal(v.watchlist ?? 0, 0);
      } else {
        assert((v.watchlist ?? 0) >= 3, `${r.kind}: watch-list streams: ${JSON.stringify(v)}`);
        assert.equal(v.list ?? 0, 0, `${r.kind}: no LIST: ${JSON.stringify(v)}`);
      }
    }
  }
}
