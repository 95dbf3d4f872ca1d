/**
 * `explain --live` (iptables mode) on a real kernel: the corpus's rules applied in a network namespace by the
 * real iptables-nft-restore, then the packet traced through what iptables-save reads back. No drift when the
 * kernel holds what the agent writes; a rule removed by hand is reported missing and the packet's live fate
 * changes; another tool's rule in the way is reported and its DNAT shown.
 */
import assert from "node:assert/strict";
import { parseRenderOutput } from "../../lib/cli/render_output.ts";
import { splitWords } from "../../lib/dataplane/iptables/model.ts";
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

Deno.test("explain --live: refused for the modes it does not trace yet", async () => {
  const r = await runCli(
    ["explain", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=ipvs", "--live", ...PACKET],
    corpusYaml(),
  );
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--live traces the iptables mode's rules; the ipvs mode is not traced live yet/);
});
