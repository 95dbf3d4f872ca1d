import assert from "node:assert/strict";
import { defaultConfiguration } from "../../lib/config/defaults.ts";
import type { KubeProxyConfiguration } from "../../lib/config/types.ts";
import { aggregateMessage, validateConfiguration } from "../../lib/config/validate.ts";

function errorsFor(mutate: (c: KubeProxyConfiguration) => void): string[] {
  const c = defaultConfiguration();
  mutate(c);
  return validateConfiguration(c).map((e) => e.toString());
}

Deno.test("the defaulted configuration is valid", () => {
  assert.deepEqual(errorsFor(() => {}), []);
  for (const mode of ["iptables", "ipvs", "nftables"]) assert.deepEqual(errorsFor((c) => c.mode = mode), []);
});

Deno.test("each class of bad value gives upstream's error with its field path", () => {
  const cases: [string, (c: KubeProxyConfiguration) => void, string[]][] = [
    ["masqueradeBit out of range", (c) => c.iptables.masqueradeBit = 40, [
      "iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]",
    ]],
    ["nftables masqueradeBit only checked in nftables mode", (c) => {
      c.mode = "nftables";
      c.nftables.masqueradeBit = -1;
    }, ["nftables.masqueradeBit: Invalid value: -1: must be within the range [0, 31]"]],
    ["bad CIDR in clusterCIDR", (c) => c.clusterCIDR = "10.0.0.0/33", [
      'clusterCIDR: Invalid value: "10.0.0.0/33": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)',
    ]],
    ["single-stack clusterCIDR pair", (c) => c.clusterCIDR = "192.168.0.0/16,10.0.0.0/8", [
      'clusterCIDR: Invalid value: []string{"192.168.0.0/16", "10.0.0.0/8"}: must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]',
    ]],
    ["bad IP:port in healthzBindAddress", (c) => c.healthzBindAddress = "0.0.0.0", [
      'healthzBindAddress: Invalid value: "0.0.0.0": must be IP:port',
    ]],
    ["bad IP and port in metricsBindAddress", (c) => c.metricsBindAddress = "localhost:99999", [
      'metricsBindAddress: Invalid value: "localhost": must be a valid IP',
      'metricsBindAddress: Invalid value: "99999": must be a valid port',
    ]],
    ["bindAddress must be an IP", (c) => c.bindAddress = "10.10.12.11:2000", [
      'bindAddress: Invalid value: "10.10.12.11:2000": not a valid textual representation of an IP address',
    ]],
    ["syncPeriod must be > 0", (c) => c.iptables.syncPeriod = -1000, [
      "iptables.syncPeriod: Invalid value: -1s: must be greater than 0",
      "iptables.syncPeriod: Invalid value: 1s: must be greater than or equal to iptables.minSyncPeriod",
    ]],
    ["negative minSyncPeriod (nftables mode)", (c) => {
      c.mode = "nftables";
      c.nftables.minSyncPeriod = -1000;
    }, ["nftables.minSyncPeriod: Invalid value: -1s: must be greater than or equal to 0"]],
    ["ipvs syncPeriod below minSyncPeriod", (c) => {
      c.mode = "ipvs";
      c.ipvs.minSyncPeriod = 60_000;
    }, ["ipvs.syncPeriod: Invalid value: 1m0s: must be greater than or equal to ipvs.minSyncPeriod"]],
    ["configSyncPeriod must be > 0", (c) => c.configSyncPeriod = -1, [
      "configSyncPeriod: Invalid value: -1ms: must be greater than 0",
    ]],
    ["unknown mode", (c) => c.mode = "userspace", [
      'mode: Invalid value: "userspace": must be iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])',
    ]],
    ["bad nodePortAddresses entry", (c) => c.nodePortAddresses = ["192.168.0.0/16", "invalid"], [
      `nodePortAddresses[1]: Invalid value: "invalid": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'`,
    ]],
    // v1.37 (#138427): keywords combine with CIDRs; a keyword given twice is a Duplicate value.
    [
      "a nodePortAddresses keyword twice",
      (c) => c.nodePortAddresses = ["primary", "10.0.0.0/8", "all", "primary"],
      [
        'nodePortAddresses[3]: Duplicate value: "primary"',
      ],
    ],
    ["unknown detectLocalMode", (c) => c.detectLocalMode = "Magic", [
      'detectLocalMode: Unsupported value: "Magic": supported values: "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""',
    ]],
    ["BridgeInterface requires bridgeInterface", (c) => c.detectLocalMode = "BridgeInterface", [
      'detectLocal.bridgeInterface: Invalid value: "": must not be empty',
    ]],
    ["InterfaceNamePrefix requires interfaceNamePrefix", (c) => c.detectLocalMode = "InterfaceNamePrefix", [
      'detectLocal.interfaceNamePrefix: Invalid value: "": must not be empty',
    ]],
    ["negative conntrack values", (c) => {
      c.conntrack.maxPerCore = -1;
      c.conntrack.min = -1;
      c.conntrack.tcpEstablishedTimeout = -1000;
      c.conntrack.tcpCloseWaitTimeout = -1000;
      c.conntrack.udpTimeout = -1000;
      c.conntrack.udpStreamTimeout = -1000;
    }, [
      "conntrack.maxPerCore: Invalid value: -1: must be greater than or equal to 0",
      "conntrack.min: Invalid value: -1: must be greater than or equal to 0",
      "conntrack.tcpEstablishedTimeout: Invalid value: -1s: must be greater than or equal to 0",
      "conntrack.tcpCloseWaitTimeout: Invalid value: -1s: must be greater than or equal to 0",
      "conntrack.udpTimeout: Invalid value: -1s: must be greater than or equal to 0",
      "conntrack.udpStreamTimeout: Invalid value: -1s: must be greater than or equal to 0",
    ]],
    ["oomScoreAdj range", (c) => c.oomScoreAdj = 1001, [
      "oomScoreAdj: Invalid value: 1001: must be within the range [-1000, 1000]",
    ]],
    ["logging format text|json", (c) => c.logging.format = "xml", [
      'logging.format: Invalid value: "xml": Unsupported log format',
    ]],
    ["qps and burst must not be negative", (c) => {
      c.clientConnection.burst = -1;
      c.clientConnection.qps = -1;
    }, [
      "clientConnection.burst: Invalid value: -1: must be greater than or equal to 0",
      "clientConnection.qps: Invalid value: -1: must be greater than or equal to 0",
    ]],
    ["ipvs fields checked in ipvs mode", (c) => {
      c.mode = "ipvs";
      c.ipvs.tcpTimeout = -1000;
      c.ipvs.excludeCIDRs = ["10.0.0.0/8", "nope"];
    }, [
      "ipvs.tcpTimeout: Invalid value: -1s: must be greater than or equal to 0",
      'ipvs.excludeCIDRs[1]: Invalid value: "nope": must be a valid CIDR',
    ]],
    [
      "showHiddenMetricsForVersion must be the previous minor",
      (c) => c.showHiddenMetricsForVersion = "1.10",
      [
        `showHiddenMetricsForVersion: Invalid value: "1.10": --show-hidden-metrics-for-version must be omitted or have the value '1.36'. Only the previous minor version is allowed`,
      ],
    ],
  ];
  for (const [name, mutate, want] of cases) assert.deepEqual(errorsFor(mutate), want, name);
});

Deno.test("a dual-stack clusterCIDR pair and nodePortAddresses keywords (alone or with CIDRs, as v1.37) are valid", () => {
  assert.deepEqual(errorsFor((c) => c.clusterCIDR = "10.0.0.0/8,fd00::/48"), []);
  assert.deepEqual(errorsFor((c) => c.nodePortAddresses = ["primary"]), []);
  assert.deepEqual(errorsFor((c) => c.nodePortAddresses = ["10.0.0.0/8", "primary", "localhost", "all"]), []);
});

Deno.test("clusterCIDR is only validated for ClusterCIDR local detection", () => {
  assert.deepEqual(
    errorsFor((c) => {
      c.detectLocalMode = "NodeCIDR";
      c.clusterCIDR = "junk";
    }),
    [],
  );
});

Deno.test("every error is reported, aggregated as upstream's [a, b]", () => {
  const c = defaultConfiguration();
  c.iptables.masqueradeBit = 40;
  c.oomScoreAdj = -1001;
  const errs = validateConfiguration(c);
  assert.equal(errs.length, 2);
  assert.equal(
    aggregateMessage(errs),
    "[iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31], oomScoreAdj: Invalid value: -1001: must be within the range [-1000, 1000]]",
  );
});
