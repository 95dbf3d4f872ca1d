/** The packet suite in nftables mode, plus a look at the table it wrote. */
import assert from "node:assert/strict";
import { definePacketSuite, type StepContext } from "./suite.ts";

async function servedByNftables({ sb }: StepContext): Promise<void> {
  const table = (await sb.exec(sb.node, "nft", ["list", "table", "ip", "kube-proxy"])).stdout;
  assert.match(table, /10\.96\.0\.10 \. tcp \. 80 : goto service-[A-Z0-9]{8}-dp\/web\/tcp\/p/);
  assert.match(table, /chain nat-prerouting \{\n\s+type nat hook prerouting priority dstnat; policy accept;/);
  const save = await sb.tryExec(sb.node, "iptables-save", []);
  assert.ok(!/KUBE-SVC-/.test(save.stdout), "no iptables service chains");
}

definePacketSuite({
  mode: "nftables",
  tools: ["nft"],
  extraSteps: [["the Services are in nftables (ip kube-proxy), not in iptables", servedByNftables]],
  // What a firewall reload does to nftables: every table goes.
  wipe: async (sb) => void await sb.exec(sb.node, "nft", ["flush", "ruleset"]),
  leftovers: async (sb) => {
    const tables = (await sb.exec(sb.node, "nft", ["list", "tables"])).stdout;
    return tables.split("\n").filter((l) => l.includes("kube-proxy"));
  },
});
