/** `--cleanup`: payload unit test and a real netns run (iptables both backends, ipset, nft, kube-ipvs0). */
import assert from "node:assert/strict";
import { cleanupLeftovers, iptablesCleanupPayload } from "../../../lib/cleanup.ts";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables/local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { overallFixture, snapshot } from "../../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";

configureLogging({ sink: () => {} });

Deno.test("cleanup payload: jumps deleted, KUBE chains flushed and removed, kubelet chains kept", () => {
  const save = [
    "*filter",
    ":INPUT ACCEPT [0:0]",
    ":KUBE-FIREWALL - [0:0]",
    ":KUBE-SERVICES - [0:0]",
    '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    "-A INPUT -j KUBE-FIREWALL",
    "-A KUBE-SERVICES -j REJECT",
    "COMMIT",
    "*raw",
    ":KUBE-X - [0:0]",
    "COMMIT",
  ].join("\n");
  assert.equal(
    iptablesCleanupPayload(save),
    "*filter\n:KUBE-SERVICES - [0:0]\n" +
      '-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n' +
      "-X KUBE-SERVICES\nCOMMIT\n",
  );
  assert.equal(iptablesCleanupPayload("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"), "");
});

privilegedTest(netnsUnavailableReason(), {
  name:
    "netns: --cleanup removes every kube-proxy chain (both backends, both families), ipsets, nft tables; idempotent",

  fn: () =>
    withNetns(async (runner) => {
      for (const backend of ["legacy", "nft"] as const) {
        const dp = new IptablesDataplane({
          family: "IPv4",
          runner,
          backend,
          localDetector: detectLocalByCIDR("10.0.0.0/8"),
        });
        await dp.sync(snapshot(overallFixture()));
      }
      await runner.run({
        cmd: "ip6tables-nft-restore",
        args: ["--noflush"],
        stdin: "*nat\n:KUBE-SERVICES - [0:0]\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n",
      });
      await runner.run({
        cmd: "nft",
        args: ["-f", "-"],
        stdin:
          "add table ip kube-proxy\nadd chain ip kube-proxy services\nadd table ip6 kube-proxy\nadd table ip other\n",
      });
      await runner.tryRun({ cmd: "ipset", args: ["create", "KUBE-CLUSTER-IP", "hash:ip,port"] });
      // The dummy module may be missing here: then only the "no kube-ipvs0" path runs.
      const dummy =
        (await runner.tryRun({ cmd: "ip", args: ["link", "add", "kube-ipvs0", "type", "dummy"] })).code === 0;

      assert.equal(await cleanupLeftovers(runner), false);
      for (
        const tool of [
          "iptables-legacy-save",
          "iptables-nft-save",
          "ip6tables-nft-save",
          "ip6tables-legacy-save",
        ]
      ) {
        const out = (await runner.run({ cmd: tool, args: [] })).stdout;
        const left = out.split("\n").filter((l) => /KUBE-/.test(l) && !/KUBE-FIREWALL/.test(l));
        assert.deepEqual(left, [], tool);
      }
      const tables = (await runner.run({ cmd: "nft", args: ["list", "tables"] })).stdout;
      assert.ok(!tables.includes("kube-proxy"), tables);
      assert.ok(tables.includes("table ip other"));
      const sets = await runner.tryRun({ cmd: "ipset", args: ["list", "-n"] });
      assert.ok(!sets.stdout.includes("KUBE-"));
      if (dummy) {
        assert.notEqual((await runner.tryRun({ cmd: "ip", args: ["link", "show", "kube-ipvs0"] })).code, 0);
      }
      // Idempotent.
      assert.equal(await cleanupLeftovers(runner), false);
      assert.equal(await cleanupLeftovers(runner, { includeKubeletChains: true }), false);
      const out = (await runner.run({ cmd: "iptables-legacy-save", args: [] })).stdout;
      assert.ok(!out.includes("KUBE-"), out);
    }),
});
