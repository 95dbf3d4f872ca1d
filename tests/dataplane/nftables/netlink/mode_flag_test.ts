/** `--nftables-netlink` in the nftables mode's factory: the wrapper per family, its metric, and no FFI. */
import assert from "node:assert/strict";
import type { ProxyOptions } from "../../../../lib/config/command.ts";
import { defaultConfiguration } from "../../../../lib/config/defaults.ts";
import { newNftablesMode } from "../../../../lib/dataplane/nftables/mode.ts";
import { RecordingCommandRunner } from "../../../../lib/exec.ts";
import { configureLogging, log } from "../../../../lib/log.ts";
import { registry } from "../../../../lib/metrics.ts";

configureLogging({ sink: () => {} });

Deno.test("--nftables-netlink: the dataplanes start with a netlink socket and serve the transactions metric", async () => {
  const metric = "denokubeproxy_nftables_transactions_total";
  assert.equal(registry.getSingleMetric(metric), undefined, "not served without the flag");
  const dps = await newNftablesMode().createDataplanes({
    runner: new RecordingCommandRunner(() => undefined),
    options: {
      config: defaultConfiguration(),
      mode: "nftables",
      nodePortAddresses: ["primary"],
      masqueradeBit: 14,
      masqueradeAll: false,
      featureGates: {},
      nftablesNetlink: true,
    } as unknown as ProxyOptions,
    nodeIPs: ["192.168.0.2", "fd00::2"],
    podCIDRs: [],
    primaryFamily: "IPv4",
    logger: log,
    warningEvent: () => {},
  }, ["IPv4", "IPv6"]);
  assert.deepEqual([...dps.keys()], ["IPv4", "IPv6"]);
  assert.notEqual(registry.getSingleMetric(metric), undefined);
});

Deno.test("--nftables-netlink without --allow-ffi stops the start and names the permission", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-read",
      "--allow-env",
      "--allow-run",
      new URL("no_ffi_probe.ts", import.meta.url).pathname,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.match(
    text,
    /--nftables-netlink: cannot open a netlink socket: .*DKP_EXTRA_PERMISSIONS=--allow-ffi/,
    text,
  );
});
