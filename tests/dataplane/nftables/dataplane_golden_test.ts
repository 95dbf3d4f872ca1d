/**
 * The nftables mode against upstream's own expectations: upstream v1.37.2's TestOverallNFTablesRules corpus
 * (the shared fixture, its endpoints on this node as v1.37's test has them) is rendered by NftablesDataplane; both our transaction and upstream's expected ruleset are
 * loaded into a fresh network namespace each, and the kernel's `nft list table` of the two must be equal.
 */
import assert from "node:assert/strict";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { RecordingCommandRunner } from "../../../lib/exec.ts";
import { configureLogging } from "../../../lib/log.ts";
import { overallFixture, snapshot } from "../../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";
import { canonicalListing } from "../../../testkit/rule_listings.ts";

configureLogging({ sink: () => {} });

const UPSTREAM = new URL("./testdata/upstream_overall.nft", import.meta.url);

/**
 * The upstream fake proxier's settings: node 192.168.0.2, pods in 10.0.0.0/8, nodePortAddresses primary,
 * KubeProxyNFTablesLocalhostNodePorts on.
 */
async function ourTransaction(): Promise<string> {
  const r = new RecordingCommandRunner((c) =>
    c.cmd === "nft" && c.args[0] === "-j" ? { stdout: '{"nftables":[]}' } : undefined
  );
  const dp = new NftablesDataplane({
    family: "IPv4",
    runner: r,
    localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
    nodePortAddresses: ["primary"],
    nodeAddresses: ["192.168.0.2"],
    keepLastTransaction: true,
    // As upstream's test: the gate on, loopback not in nodePortAddresses (every protocol rejected and counted).
    localhostNodePorts: true,
  });
  await dp.sync(snapshot(overallFixture({ localEndpoints: true }), { serviceCIDRs: ["172.30.0.0/16"] }));
  return dp.lastTransaction;
}

/** Upstream's dump lists a chain's rules before later chains are declared: load declarations first. */
function declarationsFirst(dump: string): string {
  const lines = dump.split("\n").filter((l) => l !== "" && !l.startsWith("#"));
  const rank = (l: string) => l.startsWith("add rule ") ? 1 : l.startsWith("add element ") ? 2 : 0;
  return lines.sort((a, b) => rank(a) - rank(b)).join("\n") + "\n";
}

/** `nft list table ip kube-proxy` after loading `text` into a fresh namespace. */
async function kernelListing(text: string): Promise<string> {
  return await withNetns(async (runner) => {
    await runner.run({ cmd: "nft", args: ["-f", "-"], stdin: text });
    return (await runner.run({ cmd: "nft", args: ["list", "table", "ip", "kube-proxy"] })).stdout;
  });
}

privilegedTest(netnsUnavailableReason(), {
  name: "nftables golden: upstream's TestOverallNFTablesRules, compared through the kernel",
  fn: async () => {
    const ours = await kernelListing(await ourTransaction());
    const theirs = await kernelListing(declarationsFirst(await Deno.readTextFile(UPSTREAM)));
    assert.deepEqual(canonicalListing(ours), canonicalListing(theirs));
  },
});
