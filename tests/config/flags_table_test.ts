import assert from "node:assert/strict";
import type { ProxyOptions } from "../../lib/config/command.ts";
import { Options } from "../../lib/config/options.ts";
import { run, tempDir } from "./helpers.ts";

type Check = (o: ProxyOptions) => unknown;

/** Every upstream flag (and the agent's own): an argv using it and where its value must land. `exit` rows stop the command. */
const TABLE: Record<
  string,
  { argv: string[]; get: Check; want: unknown } | { argv: string[]; exit: number }
> = {
  "bind-address": { argv: ["--bind-address=10.1.2.3"], get: (o) => o.config.bindAddress, want: "10.1.2.3" },
  "bind-address-hard-fail": {
    argv: ["--bind-address-hard-fail"],
    get: (o) => o.config.bindAddressHardFail,
    want: true,
  },
  "cleanup": { argv: ["--cleanup"], get: (o) => o.cleanup, want: true },
  "cluster-cidr": {
    argv: ["--cluster-cidr=10.0.0.0/8,fd00::/48"],
    get: (o) => [o.config.clusterCIDR, o.clusterCIDRs],
    want: ["10.0.0.0/8,fd00::/48", ["10.0.0.0/8", "fd00::/48"]],
  },
  "config": {
    argv: ["--config=@CONFIG@"],
    get: (o) => [o.configFile.endsWith("c.yaml"), o.config.mode],
    want: [true, "ipvs"],
  },
  "config-sync-period": {
    argv: ["--config-sync-period=1m"],
    get: (o) => o.config.configSyncPeriod,
    want: 60_000,
  },
  "conntrack-max-per-core": {
    argv: ["--conntrack-max-per-core=0"],
    get: (o) => o.config.conntrack.maxPerCore,
    want: 0,
  },
  "conntrack-min": { argv: ["--conntrack-min=1000"], get: (o) => o.config.conntrack.min, want: 1000 },
  "conntrack-tcp-be-liberal": {
    argv: ["--conntrack-tcp-be-liberal"],
    get: (o) => o.config.conntrack.tcpBeLiberal,
    want: true,
  },
  "conntrack-tcp-timeout-close-wait": {
    argv: ["--conntrack-tcp-timeout-close-wait=30m"],
    get: (o) => o.config.conntrack.tcpCloseWaitTimeout,
    want: 1_800_000,
  },
  "conntrack-tcp-timeout-established": {
    argv: ["--conntrack-tcp-timeout-established=0"],
    get: (o) => o.config.conntrack.tcpEstablishedTimeout,
    want: 0,
  },
  "conntrack-udp-timeout": {
    argv: ["--conntrack-udp-timeout=30s"],
    get: (o) => o.config.conntrack.udpTimeout,
    want: 30_000,
  },
  "conntrack-udp-timeout-stream": {
    argv: ["--conntrack-udp-timeout-stream=2m"],
    get: (o) => o.config.conntrack.udpStreamTimeout,
    want: 120_000,
  },
  "detect-local-mode": {
    argv: ["--detect-local-mode=NodeCIDR"],
    get: (o) => [o.config.detectLocalMode, o.detectLocalMode],
    want: ["NodeCIDR", "NodeCIDR"],
  },
  "feature-gates": {
    argv: ["--feature-gates=AllAlpha=true,ContextualLogging=false"],
    get: (o) => o.config.featureGates,
    want: { AllAlpha: true, ContextualLogging: false },
  },
  "healthz-bind-address": {
    argv: ["--healthz-bind-address=[::1]:9000"],
    get: (o) => o.config.healthzBindAddress,
    want: "[::1]:9000",
  },
  "healthz-port": { argv: ["--healthz-port=0"], get: (o) => o.config.healthzBindAddress, want: "" },
  "help": { argv: ["--help"], exit: 0 },
  "hostname-override": {
    argv: ["--hostname-override=Worker-1"],
    get: (o) => [o.config.hostnameOverride, o.hostname],
    want: ["worker-1", "worker-1"],
  },
  "init-only": { argv: ["--init-only"], get: (o) => o.initOnly, want: true },
  "iptables-localhost-nodeports": {
    argv: ["--iptables-localhost-nodeports=false"],
    get: (o) => o.config.iptables.localhostNodePorts,
    want: false,
  },
  "iptables-masquerade-bit": {
    argv: ["--iptables-masquerade-bit=5"],
    get: (o) => [o.config.iptables.masqueradeBit, o.masqueradeBit],
    want: [5, 5],
  },
  "iptables-min-sync-period": {
    argv: ["--iptables-min-sync-period=0"],
    get: (o) => [o.config.iptables.minSyncPeriod, o.minSyncPeriod],
    want: [0, 0],
  },
  "iptables-sync-period": {
    argv: ["--iptables-sync-period=5s"],
    get: (o) => [o.config.iptables.syncPeriod, o.syncPeriod],
    want: [5_000, 5_000],
  },
  "ipvs-exclude-cidrs": {
    argv: ["--ipvs-exclude-cidrs=10.0.0.0/8", "--ipvs-exclude-cidrs=fd00::/8"],
    get: (o) => o.config.ipvs.excludeCIDRs,
    want: ["10.0.0.0/8", "fd00::/8"],
  },
  "ipvs-min-sync-period": {
    argv: ["--proxy-mode=ipvs", "--ipvs-min-sync-period=3s"],
    get: (o) => [o.config.ipvs.minSyncPeriod, o.minSyncPeriod],
    want: [3_000, 3_000],
  },
  "ipvs-scheduler": { argv: ["--ipvs-scheduler=sh"], get: (o) => o.config.ipvs.scheduler, want: "sh" },
  "ipvs-strict-arp": { argv: ["--ipvs-strict-arp"], get: (o) => o.config.ipvs.strictARP, want: true },
  "ipvs-sync-period": {
    argv: ["--proxy-mode=ipvs", "--ipvs-sync-period=45s"],
    get: (o) => [o.config.ipvs.syncPeriod, o.syncPeriod],
    want: [45_000, 45_000],
  },
  "ipvs-tcp-timeout": {
    argv: ["--ipvs-tcp-timeout=900s"],
    get: (o) => o.config.ipvs.tcpTimeout,
    want: 900_000,
  },
  "ipvs-tcpfin-timeout": {
    argv: ["--ipvs-tcpfin-timeout=120s"],
    get: (o) => o.config.ipvs.tcpFinTimeout,
    want: 120_000,
  },
  "ipvs-udp-timeout": { argv: ["--ipvs-udp-timeout=300ms"], get: (o) => o.config.ipvs.udpTimeout, want: 300 },
  "kube-api-burst": {
    argv: ["--kube-api-burst=100"],
    get: (o) => o.config.clientConnection.burst,
    want: 100,
  },
  "kube-api-content-type": {
    argv: ["--kube-api-content-type=application/json"],
    get: (o) => o.config.clientConnection.contentType,
    want: "application/json",
  },
  "kube-api-qps": { argv: ["--kube-api-qps=50.5"], get: (o) => o.config.clientConnection.qps, want: 50.5 },
  "kubeconfig": {
    argv: ["--kubeconfig=/etc/kp.conf"],
    get: (o) => [o.kubeconfig, o.config.clientConnection.kubeconfig, o.apiSource],
    want: ["/etc/kp.conf", "/etc/kp.conf", { kind: "kubeconfig", path: "/etc/kp.conf", server: "" }],
  },
  "log-flush-frequency": {
    argv: ["--log-flush-frequency=10s"],
    get: (o) => o.config.logging.flushFrequency,
    want: 10_000,
  },
  "log-json-info-buffer-size": {
    argv: ["--log-json-info-buffer-size=64Ki"],
    get: (o) => o.config.logging.options.json.infoBufferSize,
    want: "64Ki",
  },
  "log-json-split-stream": {
    argv: ["--log-json-split-stream"],
    get: (o) => o.config.logging.options.json.splitStream,
    want: true,
  },
  "log-text-info-buffer-size": {
    argv: ["--log-text-info-buffer-size=1M"],
    get: (o) => o.config.logging.options.text.infoBufferSize,
    want: "1M",
  },
  "log-text-split-stream": {
    argv: ["--log-text-split-stream"],
    get: (o) => o.config.logging.options.text.splitStream,
    want: true,
  },
  "logging-format": { argv: ["--logging-format=json"], get: (o) => o.config.logging.format, want: "json" },
  "masquerade-all": {
    argv: ["--masquerade-all"],
    get: (o) => [o.config.iptables.masqueradeAll, o.masqueradeAll],
    want: [true, true],
  },
  "master": {
    argv: ["--master=https://10.0.0.1:6443"],
    get: (o) => [o.master, o.apiSource],
    want: ["https://10.0.0.1:6443", { kind: "kubeconfig", path: "", server: "https://10.0.0.1:6443" }],
  },
  "metrics-bind-address": {
    argv: ["--metrics-bind-address=0.0.0.0"],
    get: (o) => o.config.metricsBindAddress,
    want: "0.0.0.0:10249",
  },
  "metrics-port": {
    argv: ["--metrics-bind-address=127.0.0.2", "--metrics-port=9999"],
    get: (o) => o.config.metricsBindAddress,
    want: "127.0.0.2:9999",
  },
  // This agent's own (AGENT_ONLY_FLAGS): hidden from --help, left out of /flagz.
  "nftables-netlink": { argv: ["--nftables-netlink"], get: (o) => o.nftablesNetlink, want: true },
  "nodeport-addresses": {
    argv: ["--nodeport-addresses=10.0.0.0/8,192.168.0.0/16"],
    get: (o) => o.config.nodePortAddresses,
    want: ["10.0.0.0/8", "192.168.0.0/16"],
  },
  "oom-score-adj": { argv: ["--oom-score-adj=-500"], get: (o) => o.config.oomScoreAdj, want: -500 },
  "pod-bridge-interface": {
    argv: ["--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0"],
    get: (o) => o.config.detectLocal.bridgeInterface,
    want: "cbr0",
  },
  "pod-interface-name-prefix": {
    argv: ["--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"],
    get: (o) => o.config.detectLocal.interfaceNamePrefix,
    want: "veth",
  },
  "profiling": { argv: ["--profiling"], get: (o) => o.config.enableProfiling, want: true },
  "proxy-mode": {
    argv: ["--proxy-mode=nftables"],
    get: (o) => [o.config.mode, o.mode],
    want: ["nftables", "nftables"],
  },
  "show-hidden-metrics-for-version": {
    argv: ["--show-hidden-metrics-for-version=1.36"],
    get: (o) => o.config.showHiddenMetricsForVersion,
    want: "1.36",
  },
  "v": { argv: ["-v", "4"], get: (o) => o.config.logging.verbosity, want: 4 },
  "version": { argv: ["--version"], exit: 0 },
  "vmodule": {
    argv: ["--vmodule=proxier=4,runner=2"],
    get: (o) => o.config.logging.vmodule,
    want: [{ filePattern: "proxier", verbosity: 4 }, { filePattern: "runner", verbosity: 2 }],
  },
  "write-config-to": { argv: ["--write-config-to=@OUT@"], exit: 0 },
};

Deno.test("the table covers every registered flag", () => {
  const registered = new Options().fs.all().map((f) => f.name).sort();
  assert.deepEqual(Object.keys(TABLE).sort(), registered);
});

Deno.test("every upstream flag is accepted and lands in the right config field", async () => {
  const dir = tempDir();
  try {
    Deno.writeTextFileSync(
      `${dir}/c.yaml`,
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
    );
    for (const [name, row] of Object.entries(TABLE)) {
      const argv = row.argv.map((a) =>
        a.replace("@CONFIG@", `${dir}/c.yaml`).replace("@OUT@", `${dir}/out.yaml`)
      );
      const r = await run(argv);
      if ("exit" in row) {
        assert.deepEqual(r.result, { exit: row.exit }, `${name}: ${r.stderr}`);
        continue;
      }
      assert.ok("options" in r.result, `--${name}: ${r.stderr}`);
      assert.deepEqual(row.get(r.result.options), row.want, `--${name}`);
      // The underscore spelling is accepted too (Kubernetes' WordSepNormalizeFunc).
      if (argv[argv.length - 1].startsWith("--")) {
        const underscored = [
          ...argv.slice(0, -1),
          argv[argv.length - 1].replace(/^--([^=]+)/, (_m, n) => "--" + n.replaceAll("-", "_")),
        ];
        const u = await run(underscored);
        assert.ok("options" in u.result, `${underscored.join(" ")}: ${u.stderr}`);
        assert.deepEqual(row.get(u.result.options), row.want, underscored.join(" "));
      }
    }
    assert.ok(Deno.statSync(`${dir}/out.yaml`).isFile);
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
