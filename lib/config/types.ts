/**
 * KubeProxyConfiguration, `kubeproxy.config.k8s.io/v1alpha1`, with upstream's JSON field names.
 *
 * Representation choices:
 * - The object has the shape of the **v1alpha1 file format** (not upstream's internal type): per-mode
 *   `iptables` / `ipvs` / `nftables` blocks are all kept; `ProxyOptions` (options.ts) carries the collapsed values
 *   for the effective mode.
 * - Every **duration is a number of milliseconds** (fractional below 1 ms). It is read from and written as Go's
 *   duration text (`"30s"`, `"15m0s"`) in files.
 * - Fields that are pointers upstream (`masqueradeBit`, `oomScoreAdj`, `conntrack.min`, ...) are plain numbers:
 *   the object is always defaulted; a `null` in a file means "use the default".
 * - Lists upstream can be `null` (`nodePortAddresses`, `ipvs.excludeCIDRs`) are plain arrays; an empty array is
 *   written as `null`, as Go writes a nil slice.
 * @module
 */

/** The API group/version of the configuration file. */
export const API_VERSION = "kubeproxy.config.k8s.io/v1alpha1";
/** The kind of the configuration file. */
export const KIND = "KubeProxyConfiguration";

/** Proxy modes accepted in `mode` ("" means the platform default: iptables on Linux). */
export type ProxyMode =
  | ""
  | "iptables"
  | "ipvs"
  | "nftables"
  | "kernelspace"
  | (string & Record<never, never>);

/** Local-traffic detection modes ("" means ClusterCIDR). */
export type LocalMode =
  | ""
  | "ClusterCIDR"
  | "NodeCIDR"
  | "BridgeInterface"
  | "InterfaceNamePrefix"
  | (string & Record<never, never>);

/** component-base ClientConnectionConfiguration. */
export interface ClientConnectionConfiguration {
  kubeconfig: string;
  acceptContentTypes: string;
  contentType: string;
  qps: number;
  burst: number;
}

/** One `--vmodule` entry. */
export interface VModuleItem {
  filePattern: string;
  verbosity: number;
}

/** Per-format logging options (component-base `FormatOptions`). */
export interface LogFormatOptions {
  /** Omitted from files when false. */
  splitStream?: boolean;
  /** A resource.Quantity, kept as text ("0", "64Ki"). */
  infoBufferSize: string;
}

/** component-base LoggingConfiguration. */
export interface LoggingConfiguration {
  format: string;
  /** Milliseconds. */
  flushFrequency: number;
  verbosity: number;
  vmodule: VModuleItem[];
  options: { text: LogFormatOptions; json: LogFormatOptions };
}

/** `iptables` block. */
export interface KubeProxyIPTablesConfiguration {
  masqueradeBit: number;
  masqueradeAll: boolean;
  localhostNodePorts: boolean;
  /** Milliseconds. */
  syncPeriod: number;
  /** Milliseconds. */
  minSyncPeriod: number;
}

/** `ipvs` block. */
export interface KubeProxyIPVSConfiguration {
  /** Milliseconds. */
  syncPeriod: number;
  /** Milliseconds. */
  minSyncPeriod: number;
  scheduler: string;
  excludeCIDRs: string[];
  strictARP: boolean;
  /** Milliseconds. */
  tcpTimeout: number;
  /** Milliseconds. */
  tcpFinTimeout: number;
  /** Milliseconds. */
  udpTimeout: number;
}

/** `nftables` block. */
export interface KubeProxyNFTablesConfiguration {
  masqueradeBit: number;
  masqueradeAll: boolean;
  /** Milliseconds. */
  syncPeriod: number;
  /** Milliseconds. */
  minSyncPeriod: number;
}

/** `conntrack` block. */
export interface KubeProxyConntrackConfiguration {
  maxPerCore: number;
  min: number;
  /** Milliseconds. */
  tcpEstablishedTimeout: number;
  /** Milliseconds. */
  tcpCloseWaitTimeout: number;
  tcpBeLiberal: boolean;
  /** Milliseconds. */
  udpTimeout: number;
  /** Milliseconds. */
  udpStreamTimeout: number;
}

/** `winkernel` block (accepted and round-tripped; unused on Linux). */
export interface KubeProxyWinkernelConfiguration {
  networkName: string;
  sourceVip: string;
  enableDSR: boolean;
  rootHnsEndpointName: string;
  forwardHealthCheckVip: boolean;
}

/** `detectLocal` block. */
export interface DetectLocalConfiguration {
  bridgeInterface: string;
  interfaceNamePrefix: string;
}

/** The whole (defaulted) configuration. */
export interface KubeProxyConfiguration {
  apiVersion: typeof API_VERSION;
  kind: typeof KIND;
  featureGates: Record<string, boolean>;
  clientConnection: ClientConnectionConfiguration;
  logging: LoggingConfiguration;
  hostnameOverride: string;
  bindAddress: string;
  healthzBindAddress: string;
  metricsBindAddress: string;
  bindAddressHardFail: boolean;
  enableProfiling: boolean;
  showHiddenMetricsForVersion: string;
  mode: ProxyMode;
  iptables: KubeProxyIPTablesConfiguration;
  ipvs: KubeProxyIPVSConfiguration;
  nftables: KubeProxyNFTablesConfiguration;
  winkernel: KubeProxyWinkernelConfiguration;
  detectLocalMode: LocalMode;
  detectLocal: DetectLocalConfiguration;
  /** Comma-separated, one CIDR or a dual-stack pair. */
  clusterCIDR: string;
  nodePortAddresses: string[];
  oomScoreAdj: number;
  conntrack: KubeProxyConntrackConfiguration;
  /** Milliseconds. */
  configSyncPeriod: number;
  /** Unused upstream; round-tripped. */
  portRange: string;
  /** Omitted from files when false. */
  windowsRunAsService: boolean;
}
