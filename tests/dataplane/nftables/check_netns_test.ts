/**
 * Real kernel: `NftablesDataplane.check` (`nft --check -f -`) inside a throwaway network namespace leaves the
 * kube-proxy table as the last sync wrote it, whether nft accepts the checked full sync (a subset without some
 * Services) or refuses it.
 */
import assert from "node:assert/strict";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { configureLogging } from "../../../lib/log.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";
import { nftKernelUnavailableReason, normalizeListing, withNetns } from "./helpers.ts";

configureLogging({ sink: () => {} });
const unavailable = nftKernelUnavailableReason();

privilegedTest(unavailable, {
  name: "netns: an nft check, accepted or refused, leaves the table of the last sync in the kernel",
  fn: () =>
    withNetns(async (runner) => {
      const dp = new NftablesDataplane({
        family: "IPv4",
        runner,
        localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
      });
      const a = makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1" }]);
      const b = makeState(
        { ns: "ns2", name: "b", clusterIP: "172.30.0.42", nodePort: 30042, affinity: 300 },
        [
          { ip: "10.180.0.2" },
        ],
      );
      await dp.sync(snapshot([a, b]));
      const list = async () =>
        normalizeListing(
          (await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] })).stdout,
        );
      const before = await list();
      assert.match(before, /172\.30\.0\.42 \. tcp \. 80 : goto service-/);

      // Accepted: the full sync of `a` alone (it would drop b's chains, set and elements) is only checked.
      await dp.check(snapshot([a]));
      assert.equal(await list(), before);

      // Refused by nft: a port out of range (the model never lets one through; the tool is the judge).
      const bad = makeState({ ns: "ns3", name: "bad", clusterIP: "172.30.0.43", portNum: 70000 }, [
        { ip: "10.180.0.3" },
      ]);
      await assert.rejects(dp.check(snapshot([a, b, bad])), /nft: Service out of range .*70000/);
      assert.equal(await list(), before);

      // The dataplane's bookkeeping is untouched: a partial sync of a new Service applies on top.
      const c = makeState({ ns: "ns4", name: "c", clusterIP: "172.30.0.44" }, [{ ip: "10.180.0.4" }]);
      const r = await dp.sync(snapshot([a, b, c], { changed: ["ns4/c"] }));
      assert.equal(r.full, false);
      const after = await list();
      assert.match(after, /172\.30\.0\.42 \. tcp \. 80 : goto service-/);
      assert.match(after, /172\.30\.0\.44 \. tcp \. 80 : goto service-/);
    }),
});
