/**
 * `explain --live` in the ipvs mode on a real IPVS kernel (inside the IPVS VM): the corpus's first-sync
 * batches applied by the real ipset, ipvsadm, ip and iptables-nft-restore in a network namespace; no drift on a
 * faithful kernel and the packet traced through the kernel's objects ends as through the agent's; a real
 * server, a kube-ipvs0 address and an ipset entry removed by hand are found, and the live trace then differs.
 *
 * Standalone: `bash scripts/ipvs_vm.sh test tests/cli/explain_live_ipvs_vmtest.ts`.
 */
import assert from "node:assert/strict";
import { parseRenderOutput } from "../../lib/cli/render_output.ts";
import { configureLogging } from "../../lib/log.ts";
import { ipvsKernelUnavailableReason } from "../../testkit/ipvs_vm.ts";
import { type NetnsRunner, withNetns } from "../../testkit/netns.ts";
import { CORPUS_FLAGS, corpusYaml, POD, runCli, SHAPES } from "./helpers.ts";

configureLogging({ sink: () => {} });
const unavailable = ipvsKernelUnavailableReason([]);

const CLUSTER_IP = SHAPES.find((s) => s.name === "clusterip")!.svc.clusterIP!;
const PACKET = ["--source", POD.x, "--destination", `${CLUSTER_IP}:80`, "--from", "pod"];

/** Applies the corpus's IPv4 ipvs batches in the namespace as the agent's first sync would. */
async function programCorpus(runner: NetnsRunner): Promise<void> {
  const r = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=ipvs"], corpusYaml());
  assert.equal(r.code, 0, r.stderr);
  for (const c of parseRenderOutput(r.stdout).filter((c) => c.family === "IPv4")) {
    if (c.cmd === "ipset" || c.cmd === "ipvsadm" || c.cmd === "ip" || c.cmd === "iptables-nft-restore") {
      await runner.run({ cmd: c.cmd, args: [...c.args], stdin: c.stdin });
    }
  }
}

function explainLive(runner: NetnsRunner) {
  return runCli(
    ["explain", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=ipvs", "--live", ...PACKET],
    corpusYaml(),
    runner,
  );
}

Deno.test({
  name:
    "explain --live (ipvs): no drift on a faithful kernel; a real server, the kube-ipvs0 address and an ipset entry removed by hand are found",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (runner) => {
      await programCorpus(runner);
      const clean = await explainLive(runner);
      assert.equal(clean.code, 0, clean.stderr);
      const before = clean.stdout.slice(clean.stdout.indexOf("Live:"));
      assert.match(before, new RegExp(`-A -t ${CLUSTER_IP.replaceAll(".", "\\.")}:80 -s rr`), before);
      assert.match(before, /Drift: {6}none on this packet's path/, before);
      // Traced through the kernel's own objects (iptables-nft-save, ipset save, ipvsadm -S -n, ip addr).
      assert.ok(before.includes(`50%: DNAT to ${POD.a}:8080`), before);
      assert.ok(before.includes("  as the agent's objects would."), before);

      await runner.run({ cmd: "ipvsadm", args: ["-d", "-t", `${CLUSTER_IP}:80`, "-r", `${POD.a}:8080`] });
      await runner.run({ cmd: "ip", args: ["addr", "del", `${CLUSTER_IP}/32`, "dev", "kube-ipvs0"] });
      await runner.run({ cmd: "ipset", args: ["del", "KUBE-CLUSTER-IP", `${CLUSTER_IP},tcp:80`] });
      const drifted = await explainLive(runner);
      assert.equal(drifted.code, 0, drifted.stderr);
      const live = drifted.stdout.slice(drifted.stdout.indexOf("Live:"));
      assert.ok(
        live.includes(
          `missing from the kernel: virtual server -t ${CLUSTER_IP}:80: -a -t ${CLUSTER_IP}:80 -r ${POD.a}:8080 -m -w 1`,
        ),
        live,
      );
      assert.ok(live.includes(`missing from the kernel: kube-ipvs0: ${CLUSTER_IP}/32`), live);
      assert.ok(
        live.includes(`missing from the kernel: ipset: add KUBE-CLUSTER-IP ${CLUSTER_IP},tcp:80`),
        live,
      );
      assert.doesNotMatch(live, /in the kernel, not the agent's/, live);
      // Without its kube-ipvs0 address and set entry the Cluster IP is not the node's: nothing takes the packet.
      const traced = live.slice(live.indexOf("Traced:"));
      assert.ok(traced.includes("100%: not handled by kube-proxy"), traced);
      assert.ok(traced.includes("the agent's objects would take it to:"), traced);
    }),
});
