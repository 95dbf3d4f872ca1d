/**
 * Real kernel (root): a full sync that writes new ports' chains and affinity sets ahead in runs of
 * `precreatePorts` leaves the same table as one transaction, on a first sync and on a restart, and the runs
 * written ahead hold nothing traffic reaches (no element, no base chain).
 */
import assert from "node:assert/strict";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { configureLogging } from "../../../lib/log.ts";
import type { ServicePortState } from "../../../lib/proxy/types.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";
import { normalizeNftTable } from "../../../testkit/rule_parity.ts";
import { type NetnsRunner, nftKernelUnavailableReason, withNetns } from "./helpers.ts";

configureLogging({ sink: () => {} });

const states: ServicePortState[] = [1, 2, 3, 4, 5, 6, 7].map((i) =>
  makeState({
    ns: "ns1",
    name: `s${i}`,
    clusterIP: `172.30.1.${i}`,
    nodePort: i % 2 ? 31000 + i : 0,
    ...(i === 2 || i === 6 ? { affinity: 60 } : {}),
  }, [{ ip: `10.2.0.${i}` }, { ip: `10.2.1.${i}` }])
);

function dataplane(runner: NetnsRunner, precreatePorts: number): NftablesDataplane {
  return new NftablesDataplane({
    family: "IPv4",
    runner,
    localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
    nodePortAddresses: ["primary"],
    nodeAddresses: ["192.168.0.2"],
    precreatePorts,
    keepLastTransaction: true,
  });
}

/** The table, objects by name (the kernel lists them in creation order, which ahead-written runs change). */
async function listing(runner: NetnsRunner): Promise<string[]> {
  return normalizeNftTable(
    (await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] })).stdout,
  );
}

privilegedTest(nftKernelUnavailableReason(), {
  name: "kernel: chains written ahead in runs of precreatePorts leave the same table as one transaction",
  fn: async () => {
    const want = await withNetns(async (runner) => {
      await dataplane(runner, 0).sync(snapshot(states));
      return await listing(runner);
    });
    await withNetns(async (runner) => {
      const dp = dataplane(runner, 3);
      await dp.sync(snapshot(states));
      const text = dp.lastTransaction!;
      // Two runs of 3 ports ahead (their chains before any element), then the sync's own transaction.
      const firstElement = text.indexOf("add element");
      const firstHook = text.indexOf(" hook ");
      const s1Rule = text.indexOf("add rule ip kube-proxy service-");
      assert.ok(s1Rule >= 0 && s1Rule < firstHook && firstHook < firstElement, "chains ahead, then the rest");
      assert.deepEqual(await listing(runner), want);
      // A restart on the same table: every chain exists, one transaction; the same table.
      await dataplane(runner, 3).sync(snapshot(states));
      assert.deepEqual(await listing(runner), want);
    });
  },
});
