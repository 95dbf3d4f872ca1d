/**
 * Upstream's v1alpha1 defaulting (`pkg/proxy/apis/config/v1alpha1/defaults.go` plus component-base's
 * recommended logging configuration).
 * @module
 */

import { isIP, isIPv4, splitHostPort } from "../net/ip.ts";
import { API_VERSION, KIND, type KubeProxyConfiguration } from "./types.ts";

/** Port of the healthz server (ports.ProxyHealthzPort). */
export const PROXY_HEALTHZ_PORT = 10256;
/** Port of the metrics server (ports.ProxyStatusPort). */
export const PROXY_STATUS_PORT = 10249;
/** qos.KubeProxyOOMScoreAdj. */
export const KUBE_PROXY_OOM_SCORE_ADJ = -999;

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;

/** A configuration with every field zero (Go's zero value), before defaulting. */
export function zeroConfiguration(): KubeProxyConfiguration {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    featureGates: {},
    clientConnection: { kubeconfig: "", acceptContentTypes: "", contentType: "", qps: 0, burst: 0 },
    logging: {
      format: "",
      flushFrequency: 0,
      verbosity: 0,
      vmodule: [],
      options: { text: { infoBufferSize: "0" }, json: { infoBufferSize: "0" } },
    },
    hostnameOverride: "",
    bindAddress: "",
    healthzBindAddress: "",
    metricsBindAddress: "",
    bindAddressHardFail: false,
    enableProfiling: false,
    showHiddenMetricsForVersion: "",
    mode: "",
    iptables: {
      masqueradeBit: NaN,
      masqueradeAll: false,
      localhostNodePorts: true,
      syncPeriod: 0,
      minSyncPeriod: 0,
    },
    ipvs: {
      syncPeriod: 0,
      minSyncPeriod: 0,
      scheduler: "",
      excludeCIDRs: [],
      strictARP: false,
      tcpTimeout: 0,
      tcpFinTimeout: 0,
      udpTimeout: 0,
    },
    nftables: { masqueradeBit: NaN, masqueradeAll: false, syncPeriod: 0, minSyncPeriod: 0 },
    winkernel: {
      networkName: "",
      sourceVip: "",
      enableDSR: false,
      rootHnsEndpointName: "",
      forwardHealthCheckVip: false,
    },
    detectLocalMode: "",
    detectLocal: { bridgeInterface: "", interfaceNamePrefix: "" },
    clusterCIDR: "",
    nodePortAddresses: [],
    oomScoreAdj: NaN,
    conntrack: {
      maxPerCore: NaN,
      min: NaN,
      tcpEstablishedTimeout: NaN,
      tcpCloseWaitTimeout: NaN,
      tcpBeLiberal: false,
      udpTimeout: 0,
      udpStreamTimeout: 0,
    },
    configSyncPeriod: 0,
    portRange: "",
    windowsRunAsService: false,
  };
}

/**
 * proxyutil.AppendPortIfNeeded: returns `addr` unchanged if it already has a port or is not an IP, otherwise
 * appends `:port` (bracketing IPv6).
 */
export function appendPortIfNeeded(addr: string, port: number): string {
  try {
    splitHostPort(addr);
    return addr;
  } catch {
    // no port
  }
  if (!isIP(addr)) return addr;
  return isIPv4(addr) ? `${addr}:${port}` : `[${addr}]:${port}`;
}

/**
 * Applies upstream's v1alpha1 defaults in place. "Unset" is Go's zero value for plain fields (so a zero
 * `iptables.syncPeriod` in a file becomes 30s, exactly as upstream) and NaN for pointer fields (a file's `null`).
 */
export function applyDefaults(c: KubeProxyConfiguration): KubeProxyConfiguration {
  if (c.bindAddress === "") c.bindAddress = "0.0.0.0";
  const v4 = isIPv4(c.bindAddress);
  const [healthzHost, metricsHost] = v4 ? ["0.0.0.0", "127.0.0.1"] : ["[::]", "[::1]"];
  c.healthzBindAddress = c.healthzBindAddress === ""
    ? `${healthzHost}:${PROXY_HEALTHZ_PORT}`
    : appendPortIfNeeded(c.healthzBindAddress, PROXY_HEALTHZ_PORT);
  c.metricsBindAddress = c.metricsBindAddress === ""
    ? `${metricsHost}:${PROXY_STATUS_PORT}`
    : appendPortIfNeeded(c.metricsBindAddress, PROXY_STATUS_PORT);
  if (Number.isNaN(c.oomScoreAdj)) c.oomScoreAdj = KUBE_PROXY_OOM_SCORE_ADJ;
  if (c.iptables.syncPeriod === 0) c.iptables.syncPeriod = 30 * SECOND;
  if (c.iptables.minSyncPeriod === 0) c.iptables.minSyncPeriod = 1 * SECOND;
  if (c.ipvs.syncPeriod === 0) c.ipvs.syncPeriod = 30 * SECOND;
  if (c.nftables.syncPeriod === 0) c.nftables.syncPeriod = 30 * SECOND;
  if (c.nftables.minSyncPeriod === 0) c.nftables.minSyncPeriod = 1 * SECOND;
  if (Number.isNaN(c.conntrack.maxPerCore)) c.conntrack.maxPerCore = 32 * 1024;
  if (Number.isNaN(c.conntrack.min)) c.conntrack.min = 128 * 1024;
  if (Number.isNaN(c.iptables.masqueradeBit)) c.iptables.masqueradeBit = 14;
  if (Number.isNaN(c.nftables.masqueradeBit)) c.nftables.masqueradeBit = 14;
  if (Number.isNaN(c.conntrack.tcpEstablishedTimeout)) c.conntrack.tcpEstablishedTimeout = 24 * HOUR;
  if (Number.isNaN(c.conntrack.tcpCloseWaitTimeout)) c.conntrack.tcpCloseWaitTimeout = 1 * HOUR;
  if (c.configSyncPeriod === 0) c.configSyncPeriod = 15 * MINUTE;
  if (c.clientConnection.contentType === "") {
    c.clientConnection.contentType = "application/vnd.kubernetes.protobuf";
  }
  if (c.clientConnection.qps === 0) c.clientConnection.qps = 5;
  if (c.clientConnection.burst === 0) c.clientConnection.burst = 10;
  // logsapi.SetRecommendedLoggingConfiguration
  if (c.logging.format === "") c.logging.format = "text";
  if (c.logging.flushFrequency === 0) c.logging.flushFrequency = 5 * SECOND;
  if (c.logging.options.text.infoBufferSize === "") c.logging.options.text.infoBufferSize = "0";
  if (c.logging.options.json.infoBufferSize === "") c.logging.options.json.infoBufferSize = "0";
  return c;
}

/** Upstream's defaulted v1alpha1 configuration (what `--write-config-to` writes with no other flag). */
export function defaultConfiguration(): KubeProxyConfiguration {
  return applyDefaults(zeroConfiguration());
}
