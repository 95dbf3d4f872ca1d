/** The nftables mode's start-up checks and family probe, as upstream's, with a recording runner. */
import assert from "node:assert/strict";
import type { ProxyOptions } from "../../../lib/config/command.ts";
import { defaultConfiguration } from "../../../lib/config/defaults.ts";
import { type ModeContext, ModeUnavailableError } from "../../../lib/dataplane/mode.ts";
import { newNftablesMode } from "../../../lib/dataplane/nftables/mode.ts";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { RecordingCommandRunner } from "../../../lib/exec.ts";
import { configureLogging, log } from "../../../lib/log.ts";
import { registry } from "../../../lib/metrics.ts";

configureLogging({ sink: () => {} });

function context(r: RecordingCommandRunner): ModeContext {
  return {
    runner: r,
    options: {
      config: defaultConfiguration(),
      mode: "nftables",
      detectLocalMode: "ClusterCIDR",
      clusterCIDRs: ["10.0.0.0/8", "fd00::/48"],
      nodePortAddresses: ["primary"],
      masqueradeBit: 14,
      masqueradeAll: false,
      featureGates: {},
    } as unknown as ProxyOptions,
    nodeIPs: ["192.168.0.2", "fd00::2"],
    podCIDRs: [],
    primaryFamily: "IPv4",
    logger: log,
    warningEvent: () => {},
  };
}

const nft = (version: string, check: (stdin: string) => boolean = () => true) =>
  new RecordingCommandRunner((c) => {
    if (c.args[0] === "--version") return { stdout: `nftables v${version} (Lester Gooch #5)\n` };
    if (c.args[0] === "--check") {
      return check(c.stdin) ? undefined : { code: 1, stderr: "Error: Protocol not supported" };
    }
    return undefined;
  });

Deno.test("checkHost accepts nft >= 1.0.1 on kernel >= 5.13", async () => {
  await newNftablesMode({ kernelRelease: () => "6.1.0-28-amd64" }).checkHost(context(nft("1.0.6")));
});

Deno.test("checkHost refuses an old nft, a missing nft and an old kernel with upstream's reasons", async () => {
  await assert.rejects(
    () => newNftablesMode({ kernelRelease: () => "6.1.0" }).checkHost(context(nft("0.9.8"))),
    (e: Error) =>
      e instanceof ModeUnavailableError && /nft version must be v1\.0\.1 or later/.test(e.message),
  );
  const missing = new RecordingCommandRunner(() => ({ code: 127, stderr: "nft: not found" }));
  await assert.rejects(
    () => newNftablesMode({ kernelRelease: () => "6.1.0" }).checkHost(context(missing)),
    /nftables mode needs nft >= 1\.0\.1: could not run nftables command/,
  );
  await assert.rejects(
    () =>
      newNftablesMode({ kernelRelease: () => "5.10.0-21-amd64", env: () => undefined }).checkHost(
        context(nft("1.0.6")),
      ),
    /requires kernel 5\.13 or later \(this is 5\.10\.0-21-amd64; set KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK/,
  );
  // The override upstream documents.
  await newNftablesMode({
    kernelRelease: () => "5.10.0-21-amd64",
    env: (k) => k === "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK" ? "1" : undefined,
  }).checkHost(context(nft("1.0.6")));
});

Deno.test("probeFamilies checks each family's table with nft --check and leaves out a family that fails", async () => {
  const both = nft("1.0.6");
  assert.deepEqual(await newNftablesMode().probeFamilies(context(both)), ["IPv4", "IPv6"]);
  assert.deepEqual(both.calls.map((c) => c.stdin), [
    "add table ip kube-proxy\n",
    "add table ip6 kube-proxy\n",
  ]);
  const v4only = nft("1.0.6", (stdin) => !stdin.includes("ip6"));
  assert.deepEqual(await newNftablesMode().probeFamilies(context(v4only)), ["IPv4"]);
  const none = nft("1.0.6", () => false);
  await assert.rejects(
    () => newNftablesMode().probeFamilies(context(none)),
    /nftables is not usable for IPv4/,
  );
});

Deno.test("createDataplanes makes one NftablesDataplane per family", async () => {
  const dps = await newNftablesMode().createDataplanes(context(nft("1.0.6")), ["IPv4", "IPv6"]);
  assert.deepEqual([...dps.keys()], ["IPv4", "IPv6"]);
  for (const [family, dp] of dps) {
    assert.ok(dp instanceof NftablesDataplane);
    assert.equal(dp.family, family);
  }
});

Deno.test("createDataplanes registers the localhost NodePort metrics only with KubeProxyNFTablesLocalhostNodePorts", async () => {
  const names = [
    "kubeproxy_nftables_localhost_nodeport_listeners",
    "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
    "kubeproxy_nftables_localhost_nodeport_rejected_packets_total",
  ];
  const served = () => names.filter((n) => registry.getSingleMetric(n) !== undefined);
  await newNftablesMode().createDataplanes(context(nft("1.0.6")), ["IPv4"]);
  assert.deepEqual(served(), [], "gate off");
  const ctx = context(nft("1.0.6"));
  ctx.options.featureGates["KubeProxyNFTablesLocalhostNodePorts"] = true;
  await newNftablesMode().createDataplanes(ctx, ["IPv4"]);
  assert.deepEqual(served(), names, "gate on");
});

Deno.test("--nftables-netlink: the dataplanes start with a netlink socket and serve the transactions metric", async () => {
  const metric = "denokubeproxy_nftables_transactions_total";
  assert.equal(registry.getSingleMetric(metric), undefined, "not served without the flag");
  const ctx = context(new RecordingCommandRunner(() => undefined));
  ctx.options.nftablesNetlink = true;
  const dps = await newNftablesMode().createDataplanes(ctx, ["IPv4", "IPv6"]);
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
      new URL("netlink/no_ffi_probe.ts", import.meta.url).pathname,
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
