import { NftablesDataplane } from "./lib/dataplane/nftables/dataplane.ts";
import { NetnsRunner } from "./testkit/netns.ts";
import { makeState, snapshot } from "./testkit/fixtures.ts";
import { configureLogging } from "./lib/log.ts";
configureLogging({ sink: () => {} });
const n = Number(Deno.args[0] ?? 10000);
const states = Array.from(
  { length: n },
  (_, i) =>
    makeState(
      { ns: "s", name: `svc${i}`, clusterIP: `10.96.${i >> 8}.${i & 255}` },
      Array.from(
        { length: 10 },
        (_, j) => ({ ip: `10.${100 + (i >> 12)}.${(i >> 4) & 255}.${((i & 15) << 4) | j}`, port: 8080 }),
      ),
    ),
);
const dp = new NftablesDataplane({
  family: "IPv4",
  runner: new NetnsRunner("nlbig"),
  nodeAddresses: ["192.168.0.2"],
  nodePortAddresses: ["primary"],
});
const t = performance.now();
await dp.sync(snapshot(states));
console.log("synced", ((performance.now() - t) / 1000).toFixed(1), "s");
