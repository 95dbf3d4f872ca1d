/**
 * Switching iptables → ipvs → iptables → ipvs on one node, inside the IPVS VM, as an operator does by
 * changing `mode` and restarting. After each switch ClusterIP and NodePort traffic flows and only the running
 * mode's state exists: the agent removes the other mode's leftovers before its first sync (beyond upstream,
 * whose platformCleanup leaves the ipvs mode's virtual servers, kube-ipvs0 and ipsets behind when switching
 * to iptables; see lib/modes.ts).
 */
import assert from "node:assert/strict";
import { ipvsKernelUnavailableReason } from "../../testkit/ipvs_vm.ts";
import type { Sandbox } from "../../testkit/sandbox.ts";
import { iptablesServiceChains, switchModes } from "./mode_switch.ts";

const unavailable = ipvsKernelUnavailableReason(["iptables", "iptables-save", "conntrack"]);
if (unavailable) console.log(`ipvs mode switch test skipped: ${unavailable}`);

/** What of the ipvs mode is on the node: virtual servers, kube-ipvs0, KUBE- ipsets. */
async function ipvsState(sb: Sandbox): Promise<string[]> {
  const out: string[] = [];
  const vs = (await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout.trim();
  if (vs) out.push(...vs.split("\n"));
  if ((await sb.tryExec(sb.node, "ip", ["link", "show", "kube-ipvs0"])).code === 0) out.push("kube-ipvs0");
  const sets = (await sb.exec(sb.node, "ipset", ["list", "-n"])).stdout.split("\n");
  out.push(...sets.filter((s) => s.startsWith("KUBE-")));
  return out;
}

Deno.test({
  name: "packets: switching iptables -> ipvs -> iptables -> ipvs keeps Services working, one mode's state",
  ignore: unavailable !== undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: (t) =>
    switchModes(t, ["iptables", "ipvs", "iptables", "ipvs"] as const, async (mode, sb, agent) => {
      const ipvs = await ipvsState(sb);
      if (mode === "ipvs") {
        assert.equal(await iptablesServiceChains(sb), 0, "the iptables mode's chains were removed");
        assert.ok(ipvs.includes("kube-ipvs0") && ipvs.includes("KUBE-CLUSTER-IP"), ipvs.join("\n"));
        assert.ok(ipvs.includes("-A -t 10.96.0.10:80 -s rr"), ipvs.join("\n"));
      } else {
        assert.ok((await iptablesServiceChains(sb)) > 0);
        assert.deepEqual(ipvs, [], `the ipvs mode's state was removed:\n${agent.tail()}`);
      }
    }),
});
