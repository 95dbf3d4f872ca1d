/**
 * The family probe of the iptables-based modes (iptables, ipvs), as upstream's `Present()`:
 * `iptables -t nat -S POSTROUTING` per family, the primary first; a secondary family that fails is left out
 * and logged, a primary that fails makes the mode unavailable with the mode's own advice. With a recording
 * runner (the probe's command and outcome are the subject; the real programs run in the agent's tests).
 */
import assert from "node:assert/strict";
import type { ProxyOptions } from "../../lib/config/command.ts";
import { defaultConfiguration } from "../../lib/config/defaults.ts";
import { newIptablesMode } from "../../lib/dataplane/iptables/mode.ts";
import { newIpvsMode } from "../../lib/dataplane/ipvs/mode.ts";
import { type ModeContext, ModeUnavailableError } from "../../lib/dataplane/mode.ts";
import type { IPFamily } from "../../lib/proxy/types.ts";
import { RecordingCommandRunner } from "../../lib/exec.ts";
import { configureLogging, log } from "../../lib/log.ts";

const logged: string[] = [];
configureLogging({ sink: (line) => logged.push(line) });

function context(r: RecordingCommandRunner, primaryFamily: IPFamily = "IPv4"): ModeContext {
  return {
    runner: r,
    options: { config: defaultConfiguration() } as unknown as ProxyOptions,
    nodeIPs: ["192.168.0.2", "fd00::2"],
    podCIDRs: [],
    primaryFamily,
    logger: log,
    warningEvent: () => {},
  };
}

/** A host where `works(cmd)` says which of iptables / ip6tables run. */
const host = (works: (cmd: string) => boolean) =>
  new RecordingCommandRunner((c) =>
    works(c.cmd)
      ? undefined
      : { code: 3, stderr: `${c.cmd} v1.8.9 (legacy): can't initialize iptables table \`nat'` }
  );

for (const [name, make] of [["iptables", newIptablesMode], ["ipvs", () => newIpvsMode()]] as const) {
  Deno.test(`${name} mode: probeFamilies lists the primary first, and both families where iptables runs for both`, async () => {
    const r = host(() => true);
    assert.deepEqual(await make().probeFamilies(context(r, "IPv6")), ["IPv6", "IPv4"]);
    assert.deepEqual(r.calls.map((c) => [c.cmd, ...c.args].join(" ")), [
      "ip6tables -w 5 -t nat -S POSTROUTING",
      "iptables -w 5 -t nat -S POSTROUTING",
    ]);
  });

  Deno.test(`${name} mode: probeFamilies leaves out a secondary family iptables cannot serve, and logs why`, async () => {
    logged.length = 0;
    assert.deepEqual(await make().probeFamilies(context(host((cmd) => cmd === "iptables"))), ["IPv4"]);
    const line = logged.find((l) => l.includes("No iptables support for family"));
    assert.ok(line, logged.join("\n"));
    assert.match(line, /ipFamily="IPv6".*can't initialize iptables table/);
  });

  Deno.test(`${name} mode: probeFamilies makes the mode unavailable when the primary family fails`, async () => {
    await assert.rejects(
      () => make().probeFamilies(context(host((cmd) => cmd === "ip6tables"))),
      (e: Error) =>
        e instanceof ModeUnavailableError && e.mode === name &&
        /^iptables is not available on this host for IPv4: iptables v1\.8\.9 \(legacy\): can't initialize/
          .test(
            e.message,
          ) &&
        e.message.endsWith(
          name === "iptables"
            ? "(install iptables, or choose --proxy-mode=nftables)"
            : "(the ipvs mode needs iptables)",
        ),
    );
  });
}
