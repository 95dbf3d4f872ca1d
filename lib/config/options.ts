/**
 * The `kube-proxy` flags (upstream v1.33–v1.35, `cmd/kube-proxy/app/options.go` plus component-base logging flags)
 * and their mapping onto KubeProxyConfiguration, with upstream's precedence rules:
 *
 * - Without `--config`, flags are written over the defaulted configuration. The per-mode settings are collapsed as
 *   upstream's internal config does: `--iptables-sync-period` / `--iptables-min-sync-period` apply unless the mode
 *   is ipvs, `--ipvs-*-sync-period` only in ipvs mode, and the resulting values (and `--masquerade-all`) land in the
 *   block of the selected mode (`nftables.*` for nftables, `ipvs.*` for ipvs, else `iptables.*`).
 * - With `--config FILE`, the file **replaces** the flag-built configuration: every config-mapped flag is ignored
 *   (including `--kubeconfig`, `--proxy-mode`, `--feature-gates`), except the logging flags (`-v`, `--vmodule`,
 *   `--logging-format`, `--log-*`), which are copied over the file's `logging` when set, and `--hostname-override`,
 *   which always wins. `--master`, `--cleanup`, `--init-only` and `--write-config-to` are never config fields.
 * - The deprecated `--healthz-port` / `--metrics-port` only apply without `--config`.
 * @module
 */

import { log } from "../log.ts";
import { appendPortIfNeeded, defaultConfiguration } from "./defaults.ts";
import {
  effectiveFeatures,
  type FeatureGateWarning,
  knownFeatures,
  setFeatureGates,
} from "./feature_gates.ts";
import {
  BoundValue,
  type Flag,
  FlagSet,
  parseGoBool,
  parseGoInt,
  parseIPFlag,
  parseIPPortFlag,
} from "./flag_set.ts";
import { loadConfigFile } from "./load.ts";
import type { KubeProxyConfiguration, VModuleItem } from "./types.ts";
import { type FieldError, validateConfiguration } from "./validate.ts";

/** The proxy modes this agent runs on Linux. */
export type EffectiveProxyMode = "iptables" | "ipvs" | "nftables";

/** Where the API server connection comes from (upstream's `createClient`). */
export type ApiSource =
  /** No kubeconfig and no master: in-cluster service account (KUBERNETES_SERVICE_HOST/PORT + token). */
  | { kind: "in-cluster" }
  /**
   * The kubeconfig at `path` (only this explicit path: upstream does not consult $KUBECONFIG), with its server
   * replaced by `server` when non-empty. `path` may be empty when only `--master` is given.
   */
  | { kind: "kubeconfig"; path: string; server: string };

/** Everything the agent needs from the command line, resolved. */
export interface ProxyOptions {
  /** The final, defaulted and validated configuration (file format; per-mode blocks all present). */
  config: KubeProxyConfiguration;
  /** `--config` path ("" if none). */
  configFile: string;
  /** `--cleanup`: remove rules of all modes and exit. */
  cleanup: boolean;
  /** `--init-only`: do the privileged initialisation (sysctls) and exit. */
  initOnly: boolean;
  /**
   * `--nftables-netlink` (this agent's, hidden from `--help` to keep upstream's): nftables mode sends partial
   * syncs to the kernel over its own netlink socket instead of `nft` (needs `--allow-ffi`).
   */
  nftablesNetlink?: boolean;
  /** `--master`: overrides the kubeconfig's server URL. */
  master: string;
  /** `clientConnection.kubeconfig` (from `--kubeconfig` only when there is no `--config`). */
  kubeconfig: string;
  /** Node name: hostnameOverride, else the machine hostname; trimmed and lowercased. */
  hostname: string;
  /** The mode that runs: `mode`, with "" meaning iptables (Linux). */
  mode: EffectiveProxyMode;
  /** `detectLocalMode`, with "" meaning ClusterCIDR. */
  detectLocalMode: string;
  /** `clusterCIDR` split on commas (empty when unset). */
  clusterCIDRs: string[];
  /** `nodePortAddresses`; in nftables mode an empty list means `["primary"]`, as upstream. */
  nodePortAddresses: string[];
  /** Milliseconds: the selected mode's syncPeriod. */
  syncPeriod: number;
  /** Milliseconds: the selected mode's minSyncPeriod. */
  minSyncPeriod: number;
  /** The selected mode's masqueradeAll (`nftables.masqueradeAll` for nftables, else `iptables.masqueradeAll`). */
  masqueradeAll: boolean;
  /** Mark bit: `nftables.masqueradeBit` for nftables, else `iptables.masqueradeBit` (ipvs uses iptables'). */
  masqueradeBit: number;
  /** Every known feature gate's effective value, plus any explicitly set gate. */
  featureGates: Record<string, boolean>;
  /** How to reach the API server. */
  apiSource: ApiSource;
  /** Every flag's value as pflag prints it, for `/flagz` (set by the command line). */
  flagz?: Record<string, string>;
}

/** Upstream's long description, printed by `--help`. */
export const LONG_DESCRIPTION = `The Kubernetes network proxy runs on each node. This
reflects services as defined in the Kubernetes API on each node and can do simple
TCP, UDP, and SCTP stream forwarding or round robin TCP, UDP, and SCTP forwarding across a set of backends.
Service cluster IPs and ports are currently found through Docker-links-compatible
environment variables specifying ports opened by the service proxy. There is an optional
addon that provides cluster DNS for these cluster IPs. The user must create a service
with the apiserver API to configure the proxy.`;

/** Flags of this agent that upstream does not have: hidden from `--help` and left out of `/flagz`. */
export const AGENT_ONLY_FLAGS = ["nftables-netlink"] as const;

const IGNORED = "This parameter is ignored if a config file is specified by --config.";
const LOGGING_FLAGS = [
  "v",
  "vmodule",
  "logging-format",
  "log-flush-frequency",
  "log-json-info-buffer-size",
  "log-json-split-stream",
  "log-text-info-buffer-size",
  "log-text-split-stream",
];
const NOT_CONFIG_FLAGS = [
  "config",
  "write-config-to",
  "cleanup",
  "init-only",
  "master",
  "hostname-override",
  "version",
  "help",
  ...LOGGING_FLAGS,
];

function parseQuantity(s: string): string {
  if (!/^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$/.test(s)) {
    throw new Error(
      "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    );
  }
  return s;
}

function parseVModule(s: string): VModuleItem[] {
  const out: VModuleItem[] = [];
  for (const pat of s.split(",")) {
    if (pat.length === 0) continue;
    const parts = pat.split("=");
    if (parts.length !== 2 || parts[0].length === 0 || parts[1].length === 0) {
      throw new Error(`${JSON.stringify(pat)} does not have the pattern=N format`);
    }
    let v: number;
    try {
      v = parseGoInt(parts[1], 31, "strconv.ParseUint", true);
    } catch (e) {
      throw new Error(`parsing verbosity in ${JSON.stringify(pat)}: ${(e as Error).message}`);
    }
    out.push({ filePattern: parts[0], verbosity: v });
  }
  return out;
}

/** The command-line state: the flag set plus the values flags write that are not config fields. */
export class Options {
  /** The registered flags. */
  readonly fs: FlagSet = new FlagSet("kube-proxy");
  /** The defaulted configuration flags write into (replaced by the file's when `--config` is given). */
  config: KubeProxyConfiguration = defaultConfiguration();
  configFile = "";
  writeConfigTo = "";
  cleanup = false;
  initOnly = false;
  nftablesNetlink = false;
  master = "";
  hostnameOverride = "";
  healthzPort = 10256;
  metricsPort = 10249;
  /** The command named by `--help` and errors (`kube-proxy`, or `kube-proxy render` for a subcommand). */
  commandName = "kube-proxy";
  /** The description `--help` prints first (upstream's, or a subcommand's). */
  description = LONG_DESCRIPTION;
  /** `--version` value: "false", "true", "raw", or a version override. */
  version = "false";
  help = false;
  // Placeholders collapsed by mode in `complete()`, as upstream's processV1Alpha1Flags.
  iptablesSyncPeriod: number;
  iptablesMinSyncPeriod: number;
  ipvsSyncPeriod: number;
  ipvsMinSyncPeriod: number;
  masqueradeAll: boolean;

  constructor() {
    const c = this.config;
    this.iptablesSyncPeriod = c.iptables.syncPeriod;
    this.iptablesMinSyncPeriod = c.iptables.minSyncPeriod;
    this.ipvsSyncPeriod = c.iptables.syncPeriod;
    this.ipvsMinSyncPeriod = c.iptables.minSyncPeriod;
    this.masqueradeAll = c.iptables.masqueradeAll;
    this.addFlags();
  }

  private addFlags(): void {
    const fs = this.fs;
    const cfg = () => this.config;
    fs.string(
      "config",
      () => this.configFile,
      (v) => this.configFile = v,
      "The path to the configuration file.",
    );
    fs.string(
      "write-config-to",
      () => this.writeConfigTo,
      (v) => this.writeConfigTo = v,
      "If set, write the default configuration values to this file and exit.",
    );
    fs.bool(
      "cleanup",
      () => this.cleanup,
      (v) => this.cleanup = v,
      "If true cleanup iptables and ipvs rules and exit.",
    );
    fs.mapStringBool(
      "feature-gates",
      () => cfg().featureGates,
      (v) => cfg().featureGates = v,
      "A set of key=value pairs that describe feature gates for alpha/experimental features. Options are:\n" +
        knownFeatures().join("\n") + "\n" + IGNORED,
    );
    fs.string(
      "kubeconfig",
      () => cfg().clientConnection.kubeconfig,
      (v) => cfg().clientConnection.kubeconfig = v,
      "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).",
    );
    fs.string(
      "master",
      () => this.master,
      (v) => this.master = v,
      "The address of the Kubernetes API server (overrides any value in kubeconfig)",
    );
    fs.string(
      "kube-api-content-type",
      () => cfg().clientConnection.contentType,
      (v) => cfg().clientConnection.contentType = v,
      "Content type of requests sent to apiserver.",
    );
    fs.int32(
      "kube-api-burst",
      () => cfg().clientConnection.burst,
      (v) => cfg().clientConnection.burst = v,
      "Burst to use while talking with kubernetes apiserver",
    );
    fs.float32(
      "kube-api-qps",
      () => cfg().clientConnection.qps,
      (v) => cfg().clientConnection.qps = v,
      "QPS to use while talking with kubernetes apiserver",
    );
    fs.string(
      "hostname-override",
      () => this.hostnameOverride,
      (v) => this.hostnameOverride = v,
      "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.",
    );
    fs.add(
      "bind-address",
      new BoundValue("ip", () => cfg().bindAddress, (v) => cfg().bindAddress = v, parseIPFlag),
      "Overrides kube-proxy's idea of what its node's primary IP is. Note that the name is a historical artifact, and kube-proxy does not actually bind any sockets to this IP. " +
        IGNORED,
    );
    fs.add(
      "healthz-bind-address",
      new BoundValue(
        "ipport",
        () => cfg().healthzBindAddress,
        (v) => cfg().healthzBindAddress = v,
        parseIPPortFlag,
      ),
      'The IP address and port for the health check server to serve on, defaulting to "0.0.0.0:10256". ' +
        IGNORED,
    );
    fs.add(
      "metrics-bind-address",
      new BoundValue(
        "ipport",
        () => cfg().metricsBindAddress,
        (v) => cfg().metricsBindAddress = v,
        parseIPPortFlag,
      ),
      'The IP address and port for the metrics server to serve on, defaulting to "127.0.0.1:10249". (Set to "0.0.0.0:10249" / "[::]:10249" to bind on all interfaces.) ' +
        IGNORED,
    );
    fs.bool(
      "bind-address-hard-fail",
      () => cfg().bindAddressHardFail,
      (v) => cfg().bindAddressHardFail = v,
      "If true kube-proxy will treat failure to bind to a port as fatal and exit",
    );
    fs.bool(
      "profiling",
      () => cfg().enableProfiling,
      (v) => cfg().enableProfiling = v,
      "If true enables profiling via web interface on /debug/pprof handler. " + IGNORED,
    );
    fs.string(
      "show-hidden-metrics-for-version",
      () => cfg().showHiddenMetricsForVersion,
      (v) => cfg().showHiddenMetricsForVersion = v,
      "The previous version for which you want to show hidden metrics. " +
        "Only the previous minor version is meaningful, other values will not be allowed. " +
        "The format is <major>.<minor>, e.g.: '1.16'. " +
        "The purpose of this format is make sure you have the opportunity to notice if the next release hides additional metrics, " +
        "rather than being surprised when they are permanently removed in the release after that. " + IGNORED,
    );
    fs.bool(
      "init-only",
      () => this.initOnly,
      (v) => this.initOnly = v,
      "If true, perform any initialization steps that must be done with full root privileges, and then exit. After doing this, you can run kube-proxy again with only the CAP_NET_ADMIN capability.",
    );
    fs.bool(
      AGENT_ONLY_FLAGS[0],
      () => this.nftablesNetlink,
      (v) => this.nftablesNetlink = v,
      "This agent only (not upstream's; hidden from --help): in nftables mode, send partial syncs to the kernel " +
        "over a netlink socket of the agent's own instead of nft. Needs --allow-ffi (docs/operations.md).",
      { hidden: true },
    );
    fs.string(
      "proxy-mode",
      () => cfg().mode,
      (v) => cfg().mode = v,
      "Which proxy mode to use: on Linux this can be 'iptables' (default), 'ipvs', or 'nftables'. On Windows the only supported value is 'kernelspace'. " +
        IGNORED,
      { typeName: "ProxyMode" },
    );
    fs.int32(
      "iptables-masquerade-bit",
      () => cfg().iptables.masqueradeBit,
      (v) => cfg().iptables.masqueradeBit = v,
      "If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].",
    );
    fs.bool(
      "masquerade-all",
      () => this.masqueradeAll,
      (v) => this.masqueradeAll = v,
      "SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins. Only supported on Linux.",
    );
    fs.bool(
      "iptables-localhost-nodeports",
      () => cfg().iptables.localhostNodePorts,
      (v) => cfg().iptables.localhostNodePorts = v,
      "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4; localhost NodePorts are never allowed with other proxy modes or with IPv6.)",
    );
    fs.duration(
      "iptables-sync-period",
      () => this.iptablesSyncPeriod,
      (v) => this.iptablesSyncPeriod = v,
      "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.",
    );
    fs.duration(
      "iptables-min-sync-period",
      () => this.iptablesMinSyncPeriod,
      (v) => this.iptablesMinSyncPeriod = v,
      "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.",
    );
    fs.duration(
      "ipvs-sync-period",
      () => this.ipvsSyncPeriod,
      (v) => this.ipvsSyncPeriod = v,
      "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.",
    );
    fs.duration(
      "ipvs-min-sync-period",
      () => this.ipvsMinSyncPeriod,
      (v) => this.ipvsMinSyncPeriod = v,
      "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate IPVS resync.",
    );
    fs.string(
      "ipvs-scheduler",
      () => cfg().ipvs.scheduler,
      (v) => cfg().ipvs.scheduler = v,
      "The ipvs scheduler type when proxy mode is ipvs",
    );
    fs.stringSlice(
      "ipvs-exclude-cidrs",
      () => cfg().ipvs.excludeCIDRs,
      (v) => cfg().ipvs.excludeCIDRs = v,
      "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.",
    );
    fs.bool(
      "ipvs-strict-arp",
      () => cfg().ipvs.strictARP,
      (v) => cfg().ipvs.strictARP = v,
      "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2",
    );
    fs.duration(
      "ipvs-tcp-timeout",
      () => cfg().ipvs.tcpTimeout,
      (v) => cfg().ipvs.tcpTimeout = v,
      "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').",
    );
    fs.duration(
      "ipvs-tcpfin-timeout",
      () => cfg().ipvs.tcpFinTimeout,
      (v) => cfg().ipvs.tcpFinTimeout = v,
      "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').",
    );
    fs.duration(
      "ipvs-udp-timeout",
      () => cfg().ipvs.udpTimeout,
      (v) => cfg().ipvs.udpTimeout = v,
      "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').",
    );
    fs.string(
      "detect-local-mode",
      () => cfg().detectLocalMode,
      (v) => cfg().detectLocalMode = v,
      "Mode to use to detect local traffic. " + IGNORED,
      { typeName: "LocalMode" },
    );
    fs.string(
      "pod-bridge-interface",
      () => cfg().detectLocal.bridgeInterface,
      (v) => cfg().detectLocal.bridgeInterface = v,
      "A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.",
    );
    fs.string(
      "pod-interface-name-prefix",
      () => cfg().detectLocal.interfaceNamePrefix,
      (v) => cfg().detectLocal.interfaceNamePrefix = v,
      "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.",
    );
    fs.string(
      "cluster-cidr",
      () => cfg().clusterCIDR,
      (v) => cfg().clusterCIDR = v,
      "The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range. (Otherwise it is not used.) " +
        IGNORED,
    );
    fs.stringSlice(
      "nodeport-addresses",
      () => cfg().nodePortAddresses,
      (v) => cfg().nodePortAddresses = v,
      "A list of CIDR ranges and/or keywords that expand to CIDR ranges. NodePort services are only accessible on node IPs covered by the list. Supported keywords: 'primary' (the Node object's primary IPv4 and/or IPv6 addresses), 'localhost' (127.0.0.0/8 and ::1/128), and 'all' (0.0.0.0/0 and ::/0). Any combination of valid keywords and CIDRS may be included in the list. Serving NodePorts on loopback IPs is only supported in iptables mode (IPv4 only, see --iptables-localhost-nodeports), and, only for TCP, in nftables mode when the KubeProxyNFTablesLocalhostNodePorts feature gate is enabled and the list explicitly includes loopback (e.g. 'localhost'). If unset, this defaults to 'all' in iptables and ipvs mode, and to 'primary' in nftables mode. " +
        IGNORED,
    );
    fs.int32(
      "oom-score-adj",
      () => cfg().oomScoreAdj,
      (v) => cfg().oomScoreAdj = v,
      "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000]. " +
        IGNORED,
    );
    fs.int32(
      "conntrack-max-per-core",
      () => cfg().conntrack.maxPerCore,
      (v) => cfg().conntrack.maxPerCore = v,
      "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).",
    );
    fs.int32(
      "conntrack-min",
      () => cfg().conntrack.min,
      (v) => cfg().conntrack.min = v,
      "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).",
    );
    fs.duration(
      "conntrack-tcp-timeout-established",
      () => cfg().conntrack.tcpEstablishedTimeout,
      (v) => cfg().conntrack.tcpEstablishedTimeout = v,
      "Idle timeout for established TCP connections (0 to leave as-is)",
    );
    fs.duration(
      "conntrack-tcp-timeout-close-wait",
      () => cfg().conntrack.tcpCloseWaitTimeout,
      (v) => cfg().conntrack.tcpCloseWaitTimeout = v,
      "NAT timeout for TCP connections in the CLOSE_WAIT state",
    );
    fs.bool(
      "conntrack-tcp-be-liberal",
      () => cfg().conntrack.tcpBeLiberal,
      (v) => cfg().conntrack.tcpBeLiberal = v,
      "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1",
    );
    fs.duration(
      "conntrack-udp-timeout",
      () => cfg().conntrack.udpTimeout,
      (v) => cfg().conntrack.udpTimeout = v,
      "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)",
    );
    fs.duration(
      "conntrack-udp-timeout-stream",
      () => cfg().conntrack.udpStreamTimeout,
      (v) => cfg().conntrack.udpStreamTimeout = v,
      "Idle timeout for ASSURED UDP connections (0 to leave as-is)",
    );
    fs.duration(
      "config-sync-period",
      () => cfg().configSyncPeriod,
      (v) => cfg().configSyncPeriod = v,
      "How often configuration from the apiserver is refreshed.  Must be greater than 0.",
    );
    fs.int32(
      "healthz-port",
      () => this.healthzPort,
      (v) => this.healthzPort = v,
      "The port to bind the health check server. Use 0 to disable.",
      {
        deprecated:
          "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.",
      },
    );
    fs.int32(
      "metrics-port",
      () => this.metricsPort,
      (v) => this.metricsPort = v,
      "The port to bind the metrics server. Use 0 to disable.",
      {
        deprecated:
          "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.",
      },
    );
    // --proxy-port-range (deprecated, no effect) is gone in v1.37: an unknown flag, as upstream's binary says.
    this.addLoggingFlags();
    fs.add(
      "version",
      new BoundValue("version", () => this.version, (v) => this.version = v, (s) => {
        if (s === "raw") return s;
        if (/^v\d+\.\d+\.\d+/.test(s)) return s;
        return String(parseGoBool(s));
      }),
      "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version",
      { noOptDefVal: "true" },
    );
    fs.bool("help", () => this.help, (v) => this.help = v, "help for kube-proxy", { shorthand: "h" });
  }

  private addLoggingFlags(): void {
    const fs = this.fs;
    const lg = () => this.config.logging;
    const bufferUsage = (fmt: string) =>
      `[Alpha] In ${fmt} format with split output streams, the info messages can be buffered for a while to increase performance. The default value of zero bytes disables buffering. The size can be specified as number of bytes (512), multiples of 1000 (1K), multiples of 1024 (2Ki), or powers of those (3M, 4G, 5Mi, 6Gi). Enable the LoggingAlphaOptions feature gate to use this.`;
    const splitUsage = (fmt: string) =>
      `[Alpha] In ${fmt} format, write error messages to stderr and info messages to stdout. The default is to write a single stream to stdout. Enable the LoggingAlphaOptions feature gate to use this.`;
    fs.duration(
      "log-flush-frequency",
      () => lg().flushFrequency,
      (v) => lg().flushFrequency = v,
      "Maximum number of seconds between log flushes",
    );
    fs.add(
      "log-json-info-buffer-size",
      new BoundValue(
        "quantity",
        () => lg().options.json.infoBufferSize,
        (v) => lg().options.json.infoBufferSize = v,
        parseQuantity,
      ),
      bufferUsage("JSON"),
    );
    fs.bool(
      "log-json-split-stream",
      () => lg().options.json.splitStream ?? false,
      (v) => lg().options.json.splitStream = v,
      splitUsage("JSON"),
    );
    fs.add(
      "log-text-info-buffer-size",
      new BoundValue(
        "quantity",
        () => lg().options.text.infoBufferSize,
        (v) => lg().options.text.infoBufferSize = v,
        parseQuantity,
      ),
      bufferUsage("text"),
    );
    fs.bool(
      "log-text-split-stream",
      () => lg().options.text.splitStream ?? false,
      (v) => lg().options.text.splitStream = v,
      splitUsage("text"),
    );
    fs.string(
      "logging-format",
      () => lg().format,
      (v) => lg().format = v,
      'Sets the log format. Permitted formats: "json" (gated by LoggingBetaOptions), "text".',
    );
    fs.add(
      "v",
      new BoundValue(
        "Level",
        () => lg().verbosity,
        (v) => lg().verbosity = v,
        (s) => parseGoInt(s, 31, "strconv.ParseUint", true),
      ),
      "number for the log level verbosity",
      { shorthand: "v" },
    );
    fs.add(
      "vmodule",
      new BoundValue(
        "pattern=N,...",
        () => lg().vmodule,
        (v) => lg().vmodule = [...lg().vmodule, ...v],
        parseVModule,
        (v) => v.map((i) => `${i.filePattern}=${i.verbosity}`).join(","),
      ),
      "comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)",
    );
  }

  /** cobra's usage string: `Usage:` line and the flag table. */
  usage(): string {
    return `Usage:\n  ${this.commandName} [flags]\n\nFlags:\n${this.fs.usages().trimEnd()}\n`;
  }

  /** cobra's help output: the long description, then the usage. */
  helpText(): string {
    return `${this.description}\n\n${this.usage()}`;
  }

  /** Parses argv into the flag set (throws FlagError / HelpRequested from flag_set.ts). */
  parse(argv: string[]): void {
    this.fs.parse(argv);
  }

  /** Changed flags that `--config` makes ineffective (for a warning; upstream ignores them silently). */
  ignoredByConfigFile(): Flag[] {
    return this.fs.all().filter((f) => f.changed && !NOT_CONFIG_FLAGS.includes(f.name));
  }

  /**
   * Upstream's Complete(): loads `--config` (replacing the flag-built config, keeping changed logging flags) or
   * collapses the per-mode flags; applies the deprecated port flags and `--hostname-override`.
   * Throws ConfigLoadError, Error("empty hostname-override is invalid") or FeatureGateError.
   */
  async complete(): Promise<void> {
    if (this.configFile === "") {
      this.config.healthzBindAddress = addressFromDeprecatedFlags(
        this.config.healthzBindAddress,
        this.healthzPort,
      );
      this.config.metricsBindAddress = addressFromDeprecatedFlags(
        this.config.metricsBindAddress,
        this.metricsPort,
      );
      this.processV1Alpha1Flags();
    } else {
      const fromFile = await loadConfigFile(this.configFile);
      this.copyLoggingFlags(fromFile);
      for (const f of this.ignoredByConfigFile()) {
        log.warn("Flag is ignored because a config file is specified by --config", { flag: `--${f.name}` });
      }
      this.config = fromFile;
    }
    if (this.hostnameOverride.length > 0) {
      const h = this.hostnameOverride.trim();
      if (h.length === 0) throw new Error("empty hostname-override is invalid");
      this.config.hostnameOverride = h.toLowerCase();
    }
    // Upstream's SetFromMap, last in Complete(): unknown gates and locked ones are refused (FeatureGateError).
    this.featureGateWarnings = setFeatureGates(this.config.featureGates);
  }

  private processV1Alpha1Flags(): void {
    const c = this.config;
    // Upstream's internal config holds one syncPeriod/minSyncPeriod/masqueradeAll, initialised from the
    // defaulted iptables block, overridden by the flags of the selected mode, then written to that mode's block.
    let sync = c.iptables.syncPeriod;
    let minSync = c.iptables.minSyncPeriod;
    const ipvs = c.mode === "ipvs";
    if (this.fs.changed("iptables-sync-period") && !ipvs) sync = this.iptablesSyncPeriod;
    if (this.fs.changed("iptables-min-sync-period") && !ipvs) minSync = this.iptablesMinSyncPeriod;
    if (this.fs.changed("ipvs-sync-period") && ipvs) sync = this.ipvsSyncPeriod;
    if (this.fs.changed("ipvs-min-sync-period") && ipvs) minSync = this.ipvsMinSyncPeriod;
    const block = c.mode === "ipvs" ? c.ipvs : c.mode === "nftables" ? c.nftables : c.iptables;
    block.syncPeriod = sync;
    block.minSyncPeriod = minSync;
    if (c.mode === "nftables") c.nftables.masqueradeAll = this.masqueradeAll;
    else c.iptables.masqueradeAll = this.masqueradeAll;
  }

  private copyLoggingFlags(to: KubeProxyConfiguration): void {
    const from = this.config.logging;
    const l = to.logging;
    const ch = (n: string) => this.fs.changed(n);
    if (ch("v")) l.verbosity = from.verbosity;
    if (ch("logging-format")) l.format = from.format;
    if (ch("log-flush-frequency")) l.flushFrequency = from.flushFrequency;
    if (ch("log-json-info-buffer-size")) l.options.json.infoBufferSize = from.options.json.infoBufferSize;
    if (ch("log-json-split-stream")) l.options.json.splitStream = from.options.json.splitStream;
    if (ch("log-text-info-buffer-size")) l.options.text.infoBufferSize = from.options.text.infoBufferSize;
    if (ch("log-text-split-stream")) l.options.text.splitStream = from.options.text.splitStream;
    // vmodule: the flag's entries first, then the file's (upstream's copyLogsFromFlags).
    if (ch("vmodule")) l.vmodule = [...from.vmodule, ...l.vmodule];
  }

  /** Upstream's Validate(): every error of the completed configuration. */
  validate(): FieldError[] {
    return validateConfiguration(this.config);
  }

  /** Upstream's warnings for GA and deprecated gates set by `complete()` (logged by the command). */
  featureGateWarnings: FeatureGateWarning[] = [];
}

/** addressFromDeprecatedFlags: port 0 disables the server, else the port is appended if the address has none. */
export function addressFromDeprecatedFlags(addr: string, port: number): string {
  if (port === 0) return "";
  return appendPortIfNeeded(addr, port);
}

/** nodeutil.GetHostname: the override or the machine's hostname, trimmed and lowercased. */
export function getHostname(override: string, machineHostname: () => string): string {
  let h = override;
  if (h.length === 0) h = machineHostname();
  h = h.trim();
  if (h.length === 0) throw new Error("empty hostname is invalid");
  return h.toLowerCase();
}

/** The collapsed settings of the effective mode (upstream's internal config values). */
export function effectiveSettings(c: KubeProxyConfiguration): Pick<
  ProxyOptions,
  | "mode"
  | "detectLocalMode"
  | "clusterCIDRs"
  | "nodePortAddresses"
  | "syncPeriod"
  | "minSyncPeriod"
  | "masqueradeAll"
  | "masqueradeBit"
> {
  const mode: EffectiveProxyMode = c.mode === "ipvs"
    ? "ipvs"
    : c.mode === "nftables"
    ? "nftables"
    : "iptables";
  const block = mode === "ipvs" ? c.ipvs : mode === "nftables" ? c.nftables : c.iptables;
  return {
    mode,
    detectLocalMode: c.detectLocalMode === "" ? "ClusterCIDR" : c.detectLocalMode,
    clusterCIDRs: c.clusterCIDR === "" ? [] : c.clusterCIDR.split(","),
    nodePortAddresses: mode === "nftables" && c.nodePortAddresses.length === 0
      ? ["primary"]
      : [...c.nodePortAddresses],
    syncPeriod: block.syncPeriod,
    minSyncPeriod: block.minSyncPeriod,
    masqueradeAll: mode === "nftables" ? c.nftables.masqueradeAll : c.iptables.masqueradeAll,
    masqueradeBit: mode === "nftables" ? c.nftables.masqueradeBit : c.iptables.masqueradeBit,
  };
}

/** upstream createClient: in-cluster when neither kubeconfig nor master is given, else kubeconfig + master. */
export function resolveApiSource(kubeconfig: string, master: string): ApiSource {
  if (kubeconfig === "" && master === "") return { kind: "in-cluster" };
  return { kind: "kubeconfig", path: kubeconfig, server: master };
}

/** Assembles ProxyOptions from a completed and validated Options. */
export function buildProxyOptions(o: Options, machineHostname: () => string): ProxyOptions {
  const c = o.config;
  return {
    config: c,
    configFile: o.configFile,
    cleanup: o.cleanup,
    initOnly: o.initOnly,
    nftablesNetlink: o.nftablesNetlink,
    master: o.master,
    kubeconfig: c.clientConnection.kubeconfig,
    hostname: getHostname(c.hostnameOverride, machineHostname),
    ...effectiveSettings(c),
    featureGates: effectiveFeatures(c.featureGates),
    apiSource: resolveApiSource(c.clientConnection.kubeconfig, o.master),
  };
}
