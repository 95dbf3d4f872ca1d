/**
 * Run by ../mode_test.ts without `--allow-ffi`: creates the nftables dataplanes with `--nftables-netlink` and
 * prints the error the start stops with.
 * @module
 */
import type { ProxyOptions } from "../../../../lib/config/command.ts";
import { newNftablesMode } from "../../../../lib/dataplane/nftables/mode.ts";
import { RecordingCommandRunner } from "../../../../lib/exec.ts";
import { configureLogging, log } from "../../../../lib/log.ts";

configureLogging({ sink: () => {} });
try {
  await newNftablesMode().createDataplanes({
    runner: new RecordingCommandRunner(() => undefined),
    options: {
      mode: "nftables",
      nodePortAddresses: ["primary"],
      featureGates: {},
      nftablesNetlink: true,
      config: {},
    } as unknown as ProxyOptions,
    nodeIPs: ["192.168.0.2"],
    podCIDRs: [],
    primaryFamily: "IPv4",
    logger: log,
    warningEvent: () => {},
  }, ["IPv4"]);
  console.log("created");
} catch (err) {
  console.log((err as Error).message);
}
