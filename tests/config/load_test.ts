import assert from "node:assert/strict";
import { defaultConfiguration } from "../../lib/config/defaults.ts";
import {
  ConfigLoadError,
  decodeConfiguration,
  encodeConfiguration,
  loadConfigFile,
  strictDecodingMessage,
} from "../../lib/config/load.ts";
import { configureLogging } from "../../lib/log.ts";
import { tempDir } from "./helpers.ts";

const HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
const FIXTURE = new URL("./testdata/upstream_defaults_v1alpha1.yaml", import.meta.url);

Deno.test("encoding the default configuration reproduces upstream's defaulted v1alpha1 YAML byte for byte", () => {
  assert.equal(encodeConfiguration(defaultConfiguration()), Deno.readTextFileSync(FIXTURE));
});

Deno.test("decoding upstream's defaulted YAML gives the default configuration", () => {
  const { config, strictErrors } = decodeConfiguration(Deno.readTextFileSync(FIXTURE));
  assert.deepEqual(strictErrors, []);
  assert.deepEqual(config, defaultConfiguration());
});

Deno.test("a minimal file is defaulted as upstream (zero syncPeriod → 30s, explicit null pointer → default)", () => {
  const { config } = decodeConfiguration(
    HEAD + "mode: nftables\niptables:\n  syncPeriod: 0s\n  masqueradeBit: null\nconntrack:\n  min: 0\n" +
      "metricsBindAddress: 0.0.0.0\nbindAddress: '::'\nclusterCIDR: 10.0.0.0/8\n",
  );
  assert.equal(config.mode, "nftables");
  assert.equal(config.iptables.syncPeriod, 30_000);
  assert.equal(config.iptables.masqueradeBit, 14);
  assert.equal(config.conntrack.min, 0);
  assert.equal(config.metricsBindAddress, "0.0.0.0:10249");
  assert.equal(config.healthzBindAddress, "[::]:10256");
  assert.equal(config.clusterCIDR, "10.0.0.0/8");
});

Deno.test("JSON files are accepted", () => {
  const { config } = decodeConfiguration(JSON.stringify({
    apiVersion: "kubeproxy.config.k8s.io/v1alpha1",
    kind: "KubeProxyConfiguration",
    mode: "ipvs",
    ipvs: { scheduler: "lc", syncPeriod: "1m" },
    featureGates: { AllAlpha: true },
  }));
  assert.equal(config.mode, "ipvs");
  assert.equal(config.ipvs.scheduler, "lc");
  assert.equal(config.ipvs.syncPeriod, 60_000);
  assert.deepEqual(config.featureGates, { AllAlpha: true });
});

Deno.test("strict decoding: unknown and duplicate fields are named and decoding continues leniently", () => {
  const { config, strictErrors } = decodeConfiguration(
    HEAD + "mode: iptables\nbogus: 1\niptables:\n  fancy: true\n  masqueradeBit: 3\nmode: nftables\n",
  );
  assert.deepEqual(strictErrors, [
    'duplicate field "mode"',
    'unknown field "bogus"',
    'unknown field "iptables.fancy"',
  ]);
  assert.equal(config.mode, "nftables"); // the last duplicate wins, as lenient JSON decoding
  assert.equal(config.iptables.masqueradeBit, 3);
  assert.equal(
    strictDecodingMessage(strictErrors),
    'strict decoding error: duplicate field "mode", unknown field "bogus", unknown field "iptables.fancy"',
  );
});

Deno.test("loadConfigFile logs a warning naming unknown and duplicate fields", async () => {
  const dir = tempDir();
  const path = `${dir}/c.yaml`;
  Deno.writeTextFileSync(path, HEAD + "oomScoreAdj: -10\nnotAField: x\noomScoreAdj: -20\n");
  const logs: string[] = [];
  configureLogging({ sink: (l) => logs.push(l) });
  try {
    const c = await loadConfigFile(path);
    assert.equal(c.oomScoreAdj, -20);
  } finally {
    configureLogging({ sink: (l) => console.error(l) });
    Deno.removeSync(dir, { recursive: true });
  }
  assert.equal(logs.length, 1);
  assert.match(logs[0], /^W\d{4} /);
  assert.ok(logs[0].includes('"Using lenient decoding as strict decoding failed"'));
  assert.ok(logs[0].includes('duplicate field \\"oomScoreAdj\\"'), logs[0]);
  assert.ok(logs[0].includes('unknown field \\"notAField\\"'), logs[0]);
});

Deno.test("wrong kind, wrong version and missing kind are fatal with clear errors", () => {
  const cases: [string, RegExp][] = [
    [
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
      /^failed to decode: no kind "KubeletConfiguration" is registered for version "kubeproxy.config.k8s.io\/v1alpha1"/,
    ],
    [
      "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
      /^failed to decode: no kind "KubeProxyConfiguration" is registered for version "kubeproxy.config.k8s.io\/v1beta1"/,
    ],
    ["mode: iptables\n", /^failed to decode: Object 'Kind' is missing in 'mode: iptables/],
    ["kind: KubeProxyConfiguration\n", /^failed to decode: Object 'apiVersion' is missing/],
    [
      HEAD + "iptables:\n  masqueradeBit: abc\n",
      /cannot unmarshal string into Go struct field KubeProxyConfiguration\.iptables\.masqueradeBit of type int32/,
    ],
    [HEAD + "iptables:\n  syncPeriod: soon\n", /^failed to decode: time: invalid duration "soon"$/],
    [HEAD + "mode: [a\n", /^failed to decode: yaml: /],
  ];
  for (const [text, re] of cases) {
    assert.throws(
      () => decodeConfiguration(text),
      (e: unknown) => e instanceof ConfigLoadError && re.test(e.message),
      text,
    );
  }
});

Deno.test("a non-default configuration survives encode → decode unchanged", () => {
  const c = defaultConfiguration();
  c.mode = "ipvs";
  c.featureGates = { AllBeta: false };
  c.ipvs.excludeCIDRs = ["10.0.0.0/8", "fd00::/8"];
  c.ipvs.minSyncPeriod = 1_500;
  c.nodePortAddresses = ["primary"];
  c.logging.vmodule = [{ filePattern: "proxier*", verbosity: 4 }];
  c.logging.options.json.splitStream = true;
  c.hostnameOverride = "yes";
  c.clientConnection.qps = 7.5;
  const again = decodeConfiguration(encodeConfiguration(c));
  assert.deepEqual(again.strictErrors, []);
  assert.deepEqual(again.config, c);
});
