/**
 * Switching proxy modes on one node, as an operator does by changing `mode` and restarting: iptables →
 * nftables → iptables, with the same Services. After each switch traffic flows, and the previous mode's
 * rules are gone (the agent removes other modes' leftovers before its first sync). The scenario is
 * tests/packets/mode_switch.ts.
 */
import assert from "node:assert/strict";
import { type Sandbox, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { iptablesServiceChains, switchModes } from "./mode_switch.ts";

const unavailable = sandboxUnavailableReason([
  "ip",
  "iptables",
  "iptables-save",
  "nft",
  "conntrack",
  "sysctl",
]);

async function hasNftTable(sb: Sandbox): Promise<boolean> {
  return (await sb.exec(sb.node, "nft", ["list", "tables"])).stdout.includes("kube-proxy");
}

privilegedTest(unavailable, {
  name:
    "packets: switching iptables -> nftables -> iptables keeps Services working and leaves one mode's rules",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: (t) =>
    switchModes(t, ["iptables", "nftables", "iptables"] as const, async (mode, sb) => {
      if (mode === "nftables") {
        assert.equal(await iptablesServiceChains(sb), 0, "iptables mode's chains were removed");
        assert.ok(await hasNftTable(sb));
      } else {
        assert.ok((await iptablesServiceChains(sb)) > 0);
        assert.equal(await hasNftTable(sb), false, "the nftables table was removed");
      }
    }),
});
