/**
 * Real kernel: `IptablesDataplane.check` (`iptables-restore --test`) with both backends inside a throwaway
 * network namespace leaves the kernel's rules as the last sync wrote them, whether the tool accepts the checked
 * payload (a subset without some Services) or refuses it.
 */
import assert from "node:assert/strict";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import { type IptablesBackend, iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables/local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";

configureLogging({ sink: () => {} });
const unavailable = netnsUnavailableReason();

/** iptables-save without its comment lines and counters (which carry times and packet counts). */
function saved(text: string): string {
  return text.split("\n").filter((l) => !l.startsWith("#")).map((l) => l.replace(/\[\d+:\d+\]/g, "")).join(
    "\n",
  );
}

for (const backend of ["legacy", "nft"] as IptablesBackend[]) {
  privilegedTest(unavailable, {
    name: `netns ${backend}: a check, accepted or refused, leaves the rules of the last sync in the kernel`,
    fn: () =>
      withNetns(async (runner) => {
        const tools = iptablesTools(backend, "IPv4");
        const dp = new IptablesDataplane({
          family: "IPv4",
          runner,
          backend,
          localDetector: detectLocalByCIDR("10.0.0.0/8"),
          nfacct: null,
        });
        const a = makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1" }]);
        const b = makeState({ ns: "ns2", name: "b", clusterIP: "172.30.0.42", nodePort: 30042 }, [
          { ip: "10.180.0.2" },
        ]);
        await dp.sync(snapshot([a, b]));
        const save = async () => saved((await runner.run({ cmd: tools.save, args: [] })).stdout);
        const before = await save();
        assert.match(before, /-A KUBE-SERVICES -d 172\.30\.0\.42\/32/);

        // Accepted: the full sync of `a` alone (it would delete b's chains) is only checked.
        await dp.check(snapshot([a]));
        assert.equal(await save(), before);

        // Refused by the kernel tool: a port out of range (the model never lets one through; the tool is the judge).
        const bad = makeState({ ns: "ns3", name: "bad", clusterIP: "172.30.0.43", portNum: 70000 }, [
          { ip: "10.180.0.3" },
        ]);
        await assert.rejects(
          dp.check(snapshot([a, b, bad])),
          /restore --test [^]*invalid port\/service `70000/,
        );
        assert.equal(await save(), before);

        // The dataplane's bookkeeping is untouched: a partial sync of a new Service applies on top.
        const c = makeState({ ns: "ns4", name: "c", clusterIP: "172.30.0.44" }, [{ ip: "10.180.0.4" }]);
        const r = await dp.sync(snapshot([a, b, c], { changed: ["ns4/c"] }));
        assert.equal(r.full, false);
        const after = await save();
        assert.match(after, /-A KUBE-SERVICES -d 172\.30\.0\.42\/32/);
        assert.match(after, /-A KUBE-SERVICES -d 172\.30\.0\.44\/32/);
      }),
  });
}
