import assert from "node:assert/strict";
import { decodeConfiguration } from "../../lib/config/load.ts";
import { run, runOK, tempDir } from "./helpers.ts";

const FIXTURE = new URL("./testdata/upstream_defaults_v1alpha1.yaml", import.meta.url);
const HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

Deno.test("--help prints the long description and pflag's flag table on stdout, exit 0", async () => {
  for (const argv of [["--help"], ["-h"]]) {
    const r = await run(argv);
    assert.deepEqual(r.result, { exit: 0 });
    assert.equal(r.stderr, "");
    assert.ok(r.stdout.startsWith("The Kubernetes network proxy runs on each node."));
    assert.ok(r.stdout.includes("\n\nUsage:\n  kube-proxy [flags]\n\nFlags:\n"));
    const lines = r.stdout.split("\n");
    const line = (prefix: string) => lines.find((l) => l.startsWith(prefix + " ")) ?? "";
    assert.match(
      line("      --iptables-sync-period duration"),
      / {3,}An interval .* Must be greater than 0\. \(default 30s\)$/,
    );
    assert.match(line("  -v, --v Level"), / number for the log level verbosity$/);
    assert.match(
      line("      --kube-api-content-type string"),
      /\(default "application\/vnd\.kubernetes\.protobuf"\)$/,
    );
    assert.match(line("      --healthz-bind-address ipport"), /\(default 0\.0\.0\.0:10256\)$/);
    assert.match(line("      --version version[=true]"), /prints version information and quits/);
    assert.match(line("  -h, --help"), /help for kube-proxy$/);
    assert.ok(!r.stdout.includes("--healthz-port"), "deprecated flags are hidden");
    // Usage text starts at the same column on every flag line.
    const cols = new Set(
      lines.filter((l) => /^ {2}(-\w, | {4})--/.test(l)).map((l) => l.search(/ {3}\S/) + 3),
    );
    assert.ok(cols.size <= 2, `aligned usage column, got ${[...cols]}`);
  }
});

Deno.test("--version prints the version and exits 0", async () => {
  const r = await run(["--version"]);
  assert.deepEqual(r.result, { exit: 0 });
  assert.equal(r.stdout, "Kubernetes v1.37.2-deno-kube-proxy-0.1.0\n");
  const raw = await run(["--version=raw"]);
  assert.match(
    raw.stdout,
    /^version\.Info\{Major:"1", Minor:"37", GitVersion:"v1\.37\.2-deno-kube-proxy-0\.1\.0"/,
  );
});

Deno.test("an unknown flag prints usage then cobra's Error line on stderr and exits 2", async () => {
  const r = await run(["--bogus"]);
  assert.deepEqual(r.result, { exit: 2 });
  assert.equal(r.stdout, "");
  assert.ok(r.stderr.startsWith("Usage:\n  kube-proxy [flags]\n"));
  assert.ok(r.stderr.endsWith("\nError: unknown flag: --bogus\n"));
});

Deno.test("a bad flag value exits 2 with pflag's invalid-argument message", async () => {
  const cases: [string[], string][] = [
    [
      ["--iptables-sync-period=x"],
      'Error: invalid argument "x" for "--iptables-sync-period" flag: time: invalid duration "x"\n',
    ],
    [
      ["--bind-address=nope"],
      'Error: invalid argument "nope" for "--bind-address" flag: "nope" is not a valid IP address\n',
    ],
    [
      ["--healthz-bind-address", "1.2.3.4:x"],
      'Error: invalid argument "1.2.3.4:x" for "--healthz-bind-address" flag: "x" is not a valid number\n',
    ],
    [
      ["-v=high"],
      'Error: invalid argument "high" for "-v, --v" flag: strconv.ParseUint: parsing "high": invalid syntax\n',
    ],
    [["--kubeconfig"], "Error: flag needs an argument: --kubeconfig\n"],
    [["-x"], "Error: unknown shorthand flag: 'x' in -x\n"],
  ];
  for (const [argv, tail] of cases) {
    const r = await run(argv);
    assert.deepEqual(r.result, { exit: 2 }, argv.join(" "));
    assert.ok(r.stderr.endsWith(tail), `${argv.join(" ")}: ${r.stderr.slice(-200)}`);
  }
});

Deno.test("positional arguments are rejected as upstream", async () => {
  const r = await run(["extra"]);
  assert.deepEqual(r.result, { exit: 2 });
  assert.equal(r.stderr, 'Error: "kube-proxy" does not take any arguments, got ["extra"]\n');
});

Deno.test("validation errors exit 1 and print every error", async () => {
  const r = await run(["--iptables-masquerade-bit=40", "--oom-score-adj=2000", "--proxy-mode=bogus"]);
  assert.deepEqual(r.result, { exit: 1 });
  assert.equal(
    r.stderr,
    "Error: failed validate: [iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31], " +
      "oomScoreAdj: Invalid value: 2000: must be within the range [-1000, 1000], " +
      'mode: Invalid value: "bogus": must be iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])]\n',
  );
});

Deno.test("a config file with the wrong kind or a missing file exits 1", async () => {
  const dir = tempDir();
  try {
    Deno.writeTextFileSync(
      `${dir}/k.yaml`,
      "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    );
    const r = await run(["--config", `${dir}/k.yaml`]);
    assert.deepEqual(r.result, { exit: 1 });
    assert.match(
      r.stderr,
      /^Error: failed complete: failed to decode: no kind "KubeletConfiguration" is registered/,
    );
    const missing = await run(["--config", `${dir}/none.yaml`]);
    assert.deepEqual(missing.result, { exit: 1 });
    assert.match(missing.stderr, /^Error: failed complete: open .*none\.yaml: no such file or directory\n$/);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("--write-config-to with no other flag writes upstream's defaulted v1alpha1 configuration", async () => {
  const dir = tempDir();
  try {
    const r = await run(["--write-config-to", `${dir}/out.yaml`]);
    assert.deepEqual(r.result, { exit: 0 });
    assert.ok(r.logs.some((l) => l.includes('"Wrote configuration"') && l.includes("out.yaml")));
    const written = Deno.readTextFileSync(`${dir}/out.yaml`);
    const expected = Deno.readTextFileSync(FIXTURE);
    // Field by field first (clear diffs), then byte for byte.
    const w = decodeConfiguration(written).config as unknown as Record<string, unknown>;
    const e = decodeConfiguration(expected).config as unknown as Record<string, unknown>;
    for (const k of Object.keys(e)) assert.deepEqual(w[k], e[k], k);
    assert.equal(written, expected);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("round trip: --write-config-to then --config of that file gives an identical configuration", async () => {
  const dir = tempDir();
  try {
    for (
      const flags of [
        [],
        [
          "--proxy-mode=nftables",
          "--masquerade-all",
          "--iptables-sync-period=10s",
          "--cluster-cidr=10.0.0.0/8",
        ],
        ["--proxy-mode=ipvs", "--ipvs-scheduler=wrr", "--ipvs-exclude-cidrs=10.1.0.0/16,10.2.0.0/16", "-v=3"],
        [
          "--feature-gates=AllAlpha=false",
          "--nodeport-addresses=primary",
          "--kubeconfig=/k",
          "--oom-score-adj=0",
        ],
      ]
    ) {
      const file = `${dir}/c.yaml`;
      const direct = await runOK(flags);
      const w = await run([...flags, "--write-config-to", file]);
      assert.deepEqual(w.result, { exit: 0 }, flags.join(" "));
      const loaded = await runOK(["--config", file]);
      assert.deepEqual(loaded.config, direct.config, flags.join(" "));
      assert.equal(loaded.mode, direct.mode);
      assert.equal(loaded.syncPeriod, direct.syncPeriod);
      assert.equal(loaded.minSyncPeriod, direct.minSyncPeriod);
      assert.equal(loaded.masqueradeAll, direct.masqueradeAll);
    }
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("with --config most flags are ignored; logging flags and --hostname-override still apply", async () => {
  const dir = tempDir();
  try {
    const file = `${dir}/c.yaml`;
    Deno.writeTextFileSync(
      file,
      HEAD +
        "mode: nftables\nhostnameOverride: from-file\nlogging:\n  verbosity: 1\n  vmodule:\n  - filePattern: a\n    verbosity: 2\n",
    );
    const r = await run([
      "--config",
      file,
      "--proxy-mode=ipvs",
      "--kubeconfig=/ignored",
      "--masquerade-all",
      "--hostname-override= Flag-Host ",
      "-v=5",
      "--vmodule=b=3",
      "--master=https://api:6443",
      "--cleanup",
    ]);
    assert.ok("options" in r.result, r.stderr);
    const o = r.result.options;
    assert.equal(o.config.mode, "nftables");
    assert.equal(o.kubeconfig, "");
    assert.equal(o.masqueradeAll, false);
    assert.equal(o.config.hostnameOverride, "flag-host");
    assert.equal(o.hostname, "flag-host");
    assert.equal(o.config.logging.verbosity, 5);
    assert.deepEqual(o.config.logging.vmodule, [{ filePattern: "b", verbosity: 3 }, {
      filePattern: "a",
      verbosity: 2,
    }]);
    assert.equal(o.master, "https://api:6443");
    assert.equal(o.cleanup, true);
    assert.deepEqual(o.apiSource, { kind: "kubeconfig", path: "", server: "https://api:6443" });
    for (const f of ["--proxy-mode", "--kubeconfig", "--masquerade-all"]) {
      assert.ok(r.logs.some((l) => l.includes("Flag is ignored") && l.includes(f)), f);
    }
    const noOverride = await runOK(["--config", file]);
    assert.equal(noOverride.hostname, "from-file");
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("an empty --hostname-override is an error; no override uses the lowercased machine hostname", async () => {
  const r = await run(["--hostname-override=  "]);
  assert.deepEqual(r.result, { exit: 1 });
  assert.equal(r.stderr, "Error: failed complete: empty hostname-override is invalid\n");
  const o = await runOK([]);
  assert.equal(o.hostname, "node-a.example");
  assert.deepEqual(o.apiSource, { kind: "in-cluster" });
});

Deno.test("per-mode settings collapse as upstream's internal config", async () => {
  const ipt = await runOK([
    "--iptables-sync-period=10s",
    "--iptables-min-sync-period=0",
    "--ipvs-sync-period=5s",
  ]);
  assert.deepEqual([ipt.mode, ipt.syncPeriod, ipt.minSyncPeriod], ["iptables", 10_000, 0]);
  assert.equal(ipt.config.ipvs.syncPeriod, 30_000, "ipvs flags ignored outside ipvs mode");

  const nft = await runOK(["--proxy-mode=nftables", "--iptables-sync-period=10s", "--masquerade-all"]);
  assert.deepEqual([nft.mode, nft.syncPeriod, nft.minSyncPeriod, nft.masqueradeAll], [
    "nftables",
    10_000,
    1_000,
    true,
  ]);
  assert.equal(nft.config.nftables.syncPeriod, 10_000);
  assert.equal(nft.config.iptables.masqueradeAll, false);
  assert.deepEqual(nft.nodePortAddresses, ["primary"], "nftables defaults nodePortAddresses to primary");
  assert.deepEqual(nft.config.nodePortAddresses, []);

  const ipvs = await runOK(["--proxy-mode=ipvs", "--iptables-sync-period=10s", "--ipvs-min-sync-period=2s"]);
  assert.deepEqual([ipvs.mode, ipvs.syncPeriod, ipvs.minSyncPeriod], ["ipvs", 30_000, 2_000]);
  assert.equal(ipvs.config.iptables.syncPeriod, 30_000, "iptables flags ignored in ipvs mode");

  const bit = await runOK(["--proxy-mode=ipvs", "--iptables-masquerade-bit=7"]);
  assert.equal(bit.masqueradeBit, 7, "ipvs takes its mark bit from iptables.masqueradeBit");

  const dflt = await runOK([]);
  assert.deepEqual(
    [
      dflt.mode,
      dflt.detectLocalMode,
      dflt.syncPeriod,
      dflt.minSyncPeriod,
      dflt.masqueradeAll,
      dflt.masqueradeBit,
    ],
    ["iptables", "ClusterCIDR", 30_000, 1_000, false, 14],
  );
  assert.equal(dflt.config.mode, "", 'mode "" stays "" in the configuration');
});

Deno.test("deprecated --healthz-port / --metrics-port apply only without --config", async () => {
  const o = await runOK(["--healthz-bind-address=1.2.3.4", "--healthz-port=1234", "--metrics-port=0"]);
  assert.equal(o.config.healthzBindAddress, "1.2.3.4:1234");
  assert.equal(o.config.metricsBindAddress, "");
  const r = await run(["--healthz-port=1"]);
  assert.ok(
    r.stderr.includes("Flag --healthz-port has been deprecated, This flag is deprecated and will be removed"),
  );
});

Deno.test("-v and --logging-format configure the logger", async () => {
  const r = await run(["-v=2", "--logging-format=json"]);
  assert.ok("options" in r.result);
  const line = r.logs.find((l) => l.includes("Effective proxy settings"));
  assert.ok(line, r.logs.join("\n"));
  const rec = JSON.parse(line);
  assert.equal(rec.mode, "iptables");
  assert.equal(rec.v, 2);
  assert.ok(r.logs.some((l) => l.includes("FLAG: --v=")), "flags are logged at -v=1 and above");
});

Deno.test("feature gates as upstream v1.37.2: any component's gate is known, unknown ones refused, GA ones warned about", async () => {
  // A kube-apiserver gate: upstream's binary knows the shared list of every component.
  const r = await run([
    "--feature-gates=APIServerIdentity=false,AllAlpha=true,MultiCIDRServiceAllocator=true",
  ]);
  assert.ok("options" in r.result, r.stderr);
  assert.equal(r.result.options.featureGates.APIServerIdentity, false);
  assert.equal(r.result.options.featureGates.LoggingAlphaOptions, true, "AllAlpha turns alpha gates on");
  assert.equal(r.result.options.featureGates.ComponentStatusz, true, "BETA and on by default");
  assert.ok(
    r.logs.some((l) =>
      l.includes("Warning: setting GA feature gate. It will be removed in a future release.") &&
      l.includes("MultiCIDRServiceAllocator")
    ),
    r.logs.join("\n"),
  );
  const bad = await run(["--feature-gates=Bogus=true"]);
  assert.deepEqual(bad.result, { exit: 1 });
  assert.equal(bad.stderr, "Error: failed complete: unrecognized feature gate: Bogus\n");
  const locked = await run(["--feature-gates=MultiCIDRServiceAllocator=false"]);
  assert.deepEqual(locked.result, { exit: 1 });
  assert.equal(
    locked.stderr,
    "Error: failed complete: cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true\n",
  );
});
