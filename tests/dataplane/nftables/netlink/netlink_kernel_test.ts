/**
 * Real kernel (root): the opt-in netlink path (`--nftables-netlink`) leaves the table nft leaves. Two namespaces
 * run the same sequence of syncs (a full sync with runs written ahead, then partial syncs that change endpoints,
 * add, remove and re-time Services of every shape the renderer writes, both families), one through nft only, one
 * through {@linkcode NetlinkNftables}; after each sync `nft list table` is the same in both, and the runs ahead and
 * the partial syncs went over netlink. Also: a failing batch reports the failing line and ENOENT like nft, and applies nothing.
 */
import assert from "node:assert/strict";
import { isNotFound, NftablesError } from "../../../../lib/dataplane/nftables/errors.ts";
import { NetlinkNftables } from "../../../../lib/dataplane/nftables/netlink/nftables.ts";
import { NftablesRunner } from "../../../../lib/dataplane/nftables/nft_runner.ts";
import type { IPFamily } from "../../../../lib/proxy/types.ts";
import { configureLogging } from "../../../../lib/log.ts";
import { privilegedTest } from "../../../../testkit/privileged.ts";
import { normalizeNftTable } from "../../../../testkit/rule_parity.ts";
import { type NetnsRunner, nftKernelUnavailableReason, withNetns } from "../helpers.ts";
import { dataplane, ROUNDS, roundSnapshot } from "./scenario.ts";

configureLogging({ sink: () => {} });

async function listing(runner: NetnsRunner, family: IPFamily): Promise<string> {
  const fam = family === "IPv6" ? "ip6" : "ip";
  return normalizeNftTable(
    (await runner.run({ cmd: "nft", args: ["list", "table", fam, "kube-proxy"] })).stdout,
  )
    .join("\n");
}

for (const family of ["IPv4", "IPv6"] as const) {
  privilegedTest(nftKernelUnavailableReason(), {
    name: `kernel (${family}): partial syncs over netlink leave the table nft leaves`,
    fn: async () => {
      const want: string[] = [];
      await withNetns(async (runner) => {
        const dp = dataplane(runner, family);
        for (const k of ROUNDS.keys()) {
          await dp.sync(roundSnapshot(family, k));
          want.push(await listing(runner, family));
        }
      });
      await withNetns(async (runner, ns) => {
        const fam = family === "IPv6" ? "ip6" : "ip";
        const nl = new NetlinkNftables(new NftablesRunner({ family: fam, table: "kube-proxy", runner }), ns);
        try {
          const dp = dataplane(runner, family, nl);
          for (const k of ROUNDS.keys()) {
            await dp.sync(roundSnapshot(family, k));
            assert.equal(await listing(runner, family), want[k], `table after sync ${k}`);
          }
          // Three runs ahead of the first full sync, and the three partial syncs.
          assert.ok(nl.counts.netlink >= 6, `batches over netlink: ${JSON.stringify(nl.counts)}`);
        } finally {
          nl.close();
        }
      });
    },
  });
}

privilegedTest(nftKernelUnavailableReason(), {
  name: "kernel: a failing netlink batch names the failing line, is ENOENT like nft's, and applies nothing",
  fn: async () => {
    await withNetns(async (runner, ns) => {
      await runner.run({ cmd: "nft", args: ["add table ip kube-proxy ; add chain ip kube-proxy a"] });
      const nl = new NetlinkNftables(new NftablesRunner({ family: "ip", table: "kube-proxy", runner }), ns);
      try {
        const tx = nl.newTransaction();
        tx.add({ kind: "chain", name: "b" });
        tx.add({ kind: "rule", chain: "b", rule: "goto a" });
        tx.add({ kind: "rule", chain: "missing", rule: "goto a" });
        const err = await nl.run(tx).then(() => undefined, (e) => e);
        assert.ok(err instanceof NftablesError && isNotFound(err), String(err));
        assert.equal(err.line, 3);
        assert.equal(err.inputLine, "add rule ip kube-proxy missing goto a");
        assert.equal(nl.counts.netlink, 1);
        const table = (await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] })).stdout;
        assert.ok(!table.includes("chain b"), "nothing applied:\n" + table);
      } finally {
        nl.close();
      }
    });
  },
});
