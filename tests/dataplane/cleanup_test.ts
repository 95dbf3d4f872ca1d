/**
 * Cleanup across modes: the payload, `--cleanup` in a real netns (iptables both backends, ipset, nft,
 * kube-ipvs0 where the kernel has dummy links), and the other modes' leftovers removed when one mode starts.
 */
import assert from "node:assert/strict";
import { iptablesCleanupPayload, removeIptablesLeftovers } from "../../lib/dataplane/iptables_leftovers.ts";
import { IptablesDataplane } from "../../lib/dataplane/iptables/dataplane.ts";
import { detectLocalByCIDR } from "../../lib/dataplane/iptables/local_detector.ts";
import { isKubeProxyChain } from "../../lib/dataplane/iptables/mode.ts";
import { cleanupAllModes, cleanupOtherModes } from "../../lib/modes.ts";
import { configureLogging, log } from "../../lib/log.ts";
import { overallFixture, snapshot } from "../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../testkit/netns.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

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
    iptablesCleanupPayload(save, { ownsChain: isKubeProxyChain }),
    "*filter\n:KUBE-SERVICES - [0:0]\n" +
      '-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n' +
      "-X KUBE-SERVICES\nCOMMIT\n",
  );
  assert.equal(
    iptablesCleanupPayload("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n", { ownsChain: isKubeProxyChain }),
    "",
  );
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

      assert.equal(await cleanupAllModes(runner, log), false);
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
      assert.equal(await cleanupAllModes(runner, log), false);
      // kubelet's chains stay with --cleanup, as upstream; remove them too to leave the namespace empty.
      const all = await removeIptablesLeftovers(runner, { ownsChain: (c) => c.startsWith("KUBE-") }, log);
      assert.equal(all.failed, false);
      const out = (await runner.run({ cmd: "iptables-legacy-save", args: [] })).stdout;
      assert.ok(!out.includes("KUBE-"), out);
    }),
});

type LogLine = { msg: string; mode?: string; removed?: string[] };

/** Collects the JSON log lines of one call. */
async function logsOf(fn: () => Promise<unknown>): Promise<LogLine[]> {
  const lines: LogLine[] = [];
  configureLogging({ format: "json", sink: (l) => lines.push(JSON.parse(l)) });
  try {
    await fn();
  } finally {
    configureLogging({ format: "text", sink: () => {} });
  }
  return lines;
}

/** Leftovers of all three modes in one namespace, written with the real tools. */
async function plantLeftovers(runner: import("../../lib/exec.ts").CommandRunner): Promise<boolean> {
  // iptables mode (legacy backend), with upstream's corpus.
  await new IptablesDataplane({
    family: "IPv4",
    runner,
    backend: "legacy",
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
  })
    .sync(snapshot(overallFixture()));
  // ipvs mode: its own chains and ipsets, and a set match in the KUBE-SERVICES chain it shares.
  await runner.run({ cmd: "ipset", args: ["create", "KUBE-CLUSTER-IP", "hash:ip,port"] });
  await runner.run({
    cmd: "iptables-legacy-restore",
    args: ["--noflush"],
    stdin: "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n" +
      '-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" ' +
      "-m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n" +
      "-A KUBE-SERVICES -j KUBE-NODE-PORT\nCOMMIT\n*filter\n:KUBE-IPVS-FILTER - [0:0]\n" +
      "-A INPUT -j KUBE-IPVS-FILTER\nCOMMIT\n",
  });
  // nftables mode.
  await runner.run({
    cmd: "nft",
    args: ["-f", "-"],
    stdin: "add table ip kube-proxy\nadd chain ip kube-proxy services\nadd table ip6 kube-proxy\n",
  });
  return (await runner.tryRun({ cmd: "ip", args: ["link", "add", "kube-ipvs0", "type", "dummy"] })).code ===
    0;
}

async function natChains(runner: import("../../lib/exec.ts").CommandRunner): Promise<string[]> {
  const out = (await runner.run({ cmd: "iptables-legacy-save", args: ["-t", "nat"] })).stdout;
  return out.split("\n").filter((l) => l.startsWith(":KUBE-")).map((l) => l.slice(1, l.indexOf(" ")));
}

privilegedTest(netnsUnavailableReason(), {
  name:
    "netns: starting in iptables mode removes the nftables table and ipvs leftovers, keeps its own chains",
  fn: () =>
    withNetns(async (runner) => {
      const dummy = await plantLeftovers(runner);
      const logs = await logsOf(() => cleanupOtherModes(runner, "iptables", log));
      const tables = (await runner.run({ cmd: "nft", args: ["list", "tables"] })).stdout;
      assert.ok(!tables.includes("kube-proxy"), tables);
      assert.ok(!(await runner.run({ cmd: "ipset", args: ["list", "-n"] })).stdout.includes("KUBE-"));
      const chains = await natChains(runner);
      assert.ok(
        !chains.includes("KUBE-NODE-PORT") && !chains.includes("KUBE-LOAD-BALANCER"),
        chains.join(" "),
      );
      assert.ok(
        chains.includes("KUBE-SERVICES") && chains.some((c) => c.startsWith("KUBE-SVC-")),
        "own chains stay",
      );
      const nat = (await runner.run({ cmd: "iptables-legacy-save", args: ["-t", "nat"] })).stdout;
      assert.ok(!nat.includes("--match-set"), "the set match in the shared chain is gone");
      assert.ok(nat.includes("-j KUBE-SVC-"), "the iptables mode's dispatch rules stay");
      if (dummy) {
        assert.notEqual((await runner.tryRun({ cmd: "ip", args: ["link", "show", "kube-ipvs0"] })).code, 0);
      }
      const byMode = new Map(
        logs.filter((l) => l.msg === "Removed leftovers of another proxy mode").map((
          l,
        ) => [l.mode, l.removed]),
      );
      assert.deepEqual([...byMode.keys()].sort(), ["ipvs", "nftables"]);
      assert.deepEqual(byMode.get("nftables"), [
        "nftables table ip kube-proxy",
        "nftables table ip6 kube-proxy",
      ]);
      assert.ok(byMode.get("ipvs")!.includes("ipset KUBE-CLUSTER-IP"));
      // Nothing left: a second start logs no removal.
      const again = await logsOf(() => cleanupOtherModes(runner, "iptables", log));
      assert.ok(!again.some((l) => l.msg === "Removed leftovers of another proxy mode"));
    }),
});

privilegedTest(netnsUnavailableReason(), {
  name: "netns: starting in ipvs mode removes only the iptables mode's own chains; nftables mode removes all",
  fn: () =>
    withNetns(async (runner) => {
      await plantLeftovers(runner);
      await logsOf(() => cleanupOtherModes(runner, "ipvs", log));
      let chains = await natChains(runner);
      assert.ok(
        !chains.some((c) => /^KUBE-(SVC|SEP|EXT|FW|SVL)-/.test(c) || c === "KUBE-NODEPORTS"),
        chains.join(" "),
      );
      assert.ok(chains.includes("KUBE-SERVICES") && chains.includes("KUBE-NODE-PORT"), "ipvs chains stay");
      assert.ok(
        (await runner.run({ cmd: "ipset", args: ["list", "-n"] })).stdout.includes("KUBE-CLUSTER-IP"),
      );
      assert.ok(!(await runner.run({ cmd: "nft", args: ["list", "tables"] })).stdout.includes("kube-proxy"));

      await logsOf(() => cleanupOtherModes(runner, "nftables", log));
      chains = await natChains(runner);
      assert.deepEqual(chains, []);
      assert.ok(!(await runner.run({ cmd: "ipset", args: ["list", "-n"] })).stdout.includes("KUBE-"));
    }),
});
