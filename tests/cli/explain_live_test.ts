/**
 * `explain --live` on a real kernel: the corpus's rules applied in a network namespace by the real
 * iptables-nft-restore (or nft), then the packet traced through what iptables-save (or nft list table) reads
 * back. No drift when the kernel holds what the agent writes; a rule or element removed by hand is reported
 * missing and the packet's live fate changes; another tool's rule in the way is reported and its DNAT shown.
 */
import assert from "node:assert/strict";
import { parseRenderOutput } from "../../lib/cli/render_output.ts";
import { splitWords } from "../../lib/dataplane/iptables/model.ts";
import { type CommandRunner, DenoCommandRunner } from "../../lib/exec.ts";
import { configureLogging } from "../../lib/log.ts";
import { type NetnsRunner, netnsUnavailableReason, withNetns } from "../../testkit/netns.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { CORPUS_FLAGS, corpusYaml, POD, runCli, SHAPES } from "./helpers.ts";

configureLogging({ sink: () => {} });

const CLUSTER_IP = SHAPES.find((s) => s.name === "clusterip")!.svc.clusterIP!;
const PACKET = ["--source", POD.x, "--destination", `${CLUSTER_IP}:80`, "--from", "pod"];

/** Programs the corpus's IPv4 iptables rules into the namespace as the agent's first sync would. */
async function programCorpus(runner: NetnsRunner): Promise<string> {
  const r = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=iptables"], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  const commands = parseRenderOutput(r.stdout);
  for (const c of commands.filter((c) => c.cmd === "nfacct")) {
    await runner.run({ cmd: c.cmd, args: [...c.args] });
  }
  const restore = commands.find((c) => c.family === "IPv4" && c.cmd === "iptables-nft-restore")!;
  await runner.run({ cmd: "iptables-nft-restore", args: ["--noflush"], stdin: restore.stdin });
  return restore.stdin;
}

function explainLive(runner: NetnsRunner) {
  return runCli(
    ["explain", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=iptables", "--live", ...PACKET],
    corpusYaml(),
    runner,
  );
}

privilegedTest(netnsUnavailableReason(), {
  name:
    "explain --live (iptables): no drift on a faithful kernel; a rule removed by hand is found and the packet's live fate changes",
  fn: () =>
    withNetns(async (runner) => {
      const payload = await programCorpus(runner);
      const clean = await explainLive(runner);
      assert.equal(clean.code, 0, clean.stderr);
      assert.match(clean.stdout, /Live: {7}the kernel's rules \(iptables-nft-save\)/);
      assert.match(clean.stdout, /Drift: {6}none on this packet's path/);
      assert.match(clean.stdout, /50%: DNAT to 10\.244\.0\.2:8080\n/);
      assert.match(clean.stdout, /50%: DNAT to 10\.244\.1\.2:8080\n/);

      // Remove by hand the KUBE-SERVICES rule that sends the ClusterIP to its service chain.
      const line = payload.split("\n").find((l) =>
        l.startsWith("-A KUBE-SERVICES ") && l.includes('"dp/clusterip:p cluster IP"')
      )!;
      assert.ok(line, "the ClusterIP's rule is in the payload");
      await runner.run({ cmd: "iptables-nft", args: ["-t", "nat", "-D", ...splitWords(line).slice(1)] });
      const removed = await explainLive(runner);
      assert.equal(removed.code, 0, removed.stderr);
      const live = removed.stdout.slice(removed.stdout.indexOf("Live:"));
      assert.match(live, /100%: not handled by kube-proxy/, live);
      assert.ok(
        live.includes(
          `missing from the kernel: nat KUBE-SERVICES: ${line.slice("-A KUBE-SERVICES ".length)}`,
        ),
        live,
      );
      assert.match(live, /the agent's rules would take it to:\n {4}50%: DNAT to 10\.244\.0\.2:8080/, live);
    }),
});

privilegedTest(netnsUnavailableReason(), {
  name: "explain --live (iptables): another tool's DNAT ahead of the agent's jump is reported and traced",
  fn: () =>
    withNetns(async (runner) => {
      await programCorpus(runner);
      await runner.run({
        cmd: "iptables-nft",
        args: [
          "-t",
          "nat",
          "-I",
          "PREROUTING",
          "1",
          "-d",
          CLUSTER_IP,
          "-p",
          "tcp",
          "--dport",
          "80",
          "-j",
          "DNAT",
          "--to-destination",
          "10.244.9.9:80",
        ],
      });
      const r = await explainLive(runner);
      assert.equal(r.code, 0, r.stderr);
      const live = r.stdout.slice(r.stdout.indexOf("Live:"));
      assert.match(live, /100%: DNAT to 10\.244\.9\.9:80\n/, live);
      assert.match(
        live,
        /in the kernel, not the agent's: nat PREROUTING: -d 10\.96\.1\.1\/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10\.244\.9\.9:80/,
        live,
      );
    }),
});

/** Programs the corpus's IPv4 nftables transaction into the namespace as the agent's first sync would. */
async function programCorpusNft(runner: NetnsRunner): Promise<void> {
  const r = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables"], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  const tx = parseRenderOutput(r.stdout).find((c) => c.family === "IPv4" && c.cmd === "nft")!;
  await runner.run({ cmd: "nft", args: ["-f", "-"], stdin: tx.stdin });
}

/**
 * Runs explain as on the node whose kernel is the test's namespace: its `nft` runs there, while its own
 * `ip netns` commands (the scratch namespace it lists its rules in) run as on a node, from the host.
 */
function explainLiveNft(runner: NetnsRunner) {
  const host = new DenoCommandRunner();
  const node: CommandRunner = {
    run: (spec) => (spec.cmd === "ip" && spec.args[0] === "netns" ? host : runner).run(spec),
    tryRun: (spec) => (spec.cmd === "ip" && spec.args[0] === "netns" ? host : runner).tryRun(spec),
  };
  return runCli(
    ["explain", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables", "--live", ...PACKET],
    corpusYaml(),
    node,
  );
}

privilegedTest(netnsUnavailableReason(), {
  name:
    "explain --live (nftables): no drift on a faithful kernel; a map element and a rule removed by hand are found",
  fn: () =>
    withNetns(async (runner) => {
      await programCorpusNft(runner);
      const clean = await explainLiveNft(runner);
      assert.equal(clean.code, 0, clean.stderr);
      const before = clean.stdout.slice(clean.stdout.indexOf("Live:"));
      assert.match(before, /Drift: {6}none on this packet's path/, before);
      assert.match(before, /service-ips/, before);
      // Traced through the kernel's own listing, it ends as through the agent's table.
      assert.match(
        before,
        /Traced: {5}the kernel's table ip kube-proxy takes this packet to:\n {2}50%: DNAT to /,
        before,
      );
      assert.ok(before.includes("  as the agent's table would."), before);

      const element = `${CLUSTER_IP} . tcp . 80`;
      await runner.run({
        cmd: "nft",
        args: ["delete", "element", "ip", "kube-proxy", "service-ips", `{ ${element} }`],
      });
      const noElement = await explainLiveNft(runner);
      assert.equal(noElement.code, 0, noElement.stderr);
      const live = noElement.stdout.slice(noElement.stdout.indexOf("Live:"));
      assert.match(
        live,
        new RegExp(
          `missing from the kernel: set/map service-ips: ${element.replaceAll(".", "\\.")} : goto service-`,
        ),
        live,
      );
      // Without its service-ips element the ClusterIP's port is not a Service port: rejected.
      const traced = live.slice(live.indexOf("Traced:"));
      assert.match(traced, /takes this packet to:\n {2}100%: rejected\n/, traced);
      assert.match(traced, /cluster-ips-check #1: ip daddr @cluster-ips reject/, traced);
      assert.ok(traced.includes("the agent's table would take it to:"), traced);

      // The service chain's DNAT rule, removed by hand.
      const chain = live.match(/goto (service-[^\s,]+)/)![1];
      await runner.run({ cmd: "nft", args: ["flush", "chain", "ip", "kube-proxy", chain] });
      const noRule = await explainLiveNft(runner);
      const live2 = noRule.stdout.slice(noRule.stdout.indexOf("Live:"));
      assert.match(live2, new RegExp(`missing from the kernel: chain ${chain}: .*dnat`), live2);
      // The scratch namespaces explain used to list its own rules are gone.
      const left = await new Deno.Command("ip", { args: ["netns", "list"] }).output();
      assert.doesNotMatch(new TextDecoder().decode(left.stdout), /dkp-explain-/);
    }),
});
