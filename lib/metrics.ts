/**
 * Prometheus metrics with upstream kube-proxy's names, types, buckets and labels
 * (`pkg/proxy/metrics/metrics.go`; reference §4). One registry per process; tests read it through
 * {@linkcode metricsText}.
 * @module
 */
import client from "prom-client";

/** The process-wide registry served on `/metrics`: the core metrics and the running mode's (see registerMetrics). */
export const registry: client.Registry = new client.Registry();

/** Every metric of every mode, whatever runs (tests read it through {@linkcode metricsText}). */
const allMetrics: client.Registry = new client.Registry();

/**
 * The registries of the metrics every run serves whatever the mode (the API client's, the process's, build
 * and feature-gate information, the runtime's): both the served one and the one tests read.
 */
export const COMPONENT_REGISTRIES: client.Registry[] = [registry, allMetrics];

const exp = (start: number, factor: number, count: number) => client.exponentialBuckets(start, factor, count);

function programmingBuckets(): number[] {
  const b = [0.25, 0.5];
  for (let s = 1; s <= 59; s++) b.push(s);
  for (let s = 60; s <= 115; s += 5) b.push(s);
  for (let s = 120; s <= 300; s += 30) b.push(s);
  return b;
}

const syncBuckets = exp(0.001, 2, 15);
const family = ["ip_family"] as const;

export const syncProxyRulesDuration = new client.Histogram({
  name: "kubeproxy_sync_proxy_rules_duration_seconds",
  help: "[ALPHA] SyncProxyRules latency in seconds",
  labelNames: family,
  buckets: syncBuckets,
  registers: [allMetrics],
});

export const syncFullProxyRulesDuration = new client.Histogram({
  name: "kubeproxy_sync_full_proxy_rules_duration_seconds",
  help: "[ALPHA] SyncProxyRules latency in seconds for full resyncs",
  labelNames: family,
  buckets: syncBuckets,
  registers: [allMetrics],
});

export const syncPartialProxyRulesDuration = new client.Histogram({
  name: "kubeproxy_sync_partial_proxy_rules_duration_seconds",
  help: "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
  labelNames: family,
  buckets: syncBuckets,
  registers: [allMetrics],
});

export const syncProxyRulesLastTimestamp = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
  help: "[ALPHA] The last time proxy rules were successfully synced",
  labelNames: family,
  registers: [allMetrics],
});

export const syncProxyRulesLastQueuedTimestamp = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
  help: "[ALPHA] The last time a sync of proxy rules was queued",
  labelNames: family,
  registers: [allMetrics],
});

export const networkProgrammingDuration = new client.Histogram({
  name: "kubeproxy_network_programming_duration_seconds",
  help: "[ALPHA] In Cluster Network Programming Latency in seconds",
  labelNames: family,
  buckets: programmingBuckets(),
  registers: [allMetrics],
});

export const endpointChangesPending = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
  help: "[ALPHA] Pending proxy rules Endpoint changes",
  registers: [allMetrics],
});

export const endpointChangesTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_endpoint_changes_total",
  help: "[ALPHA] Cumulative proxy rules Endpoint changes",
  registers: [allMetrics],
});

export const serviceChangesPending = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_service_changes_pending",
  help: "[ALPHA] Pending proxy rules Service changes",
  registers: [allMetrics],
});

export const serviceChangesTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_service_changes_total",
  help: "[ALPHA] Cumulative proxy rules Service changes",
  registers: [allMetrics],
});

export const noLocalEndpointsTotal = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
  help: "[ALPHA] Number of services with a Local traffic policy and no endpoints",
  labelNames: ["ip_family", "traffic_policy"] as const,
  registers: [allMetrics],
});

export const iptablesRestoreFailuresTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
  help: "[ALPHA] Cumulative proxy iptables restore failures",
  labelNames: family,
  registers: [allMetrics],
});

export const iptablesPartialRestoreFailuresTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
  help: "[ALPHA] Cumulative proxy iptables partial restore failures",
  labelNames: family,
  registers: [allMetrics],
});

export const iptablesRulesTotal = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_iptables_total",
  help: "[ALPHA] Total number of iptables rules owned by kube-proxy",
  labelNames: ["ip_family", "table"] as const,
  registers: [allMetrics],
});

export const iptablesRulesLastSync = new client.Gauge({
  name: "kubeproxy_sync_proxy_rules_iptables_last",
  help: "[ALPHA] Number of iptables rules written by kube-proxy in last sync",
  labelNames: ["ip_family", "table"] as const,
  registers: [allMetrics],
});

export const nftablesSyncFailuresTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
  help: "[ALPHA] Cumulative proxy nftables sync failures",
  labelNames: family,
  registers: [allMetrics],
});

export const nftablesCleanupFailuresTotal = new client.Counter({
  name: "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
  help: "[ALPHA] Cumulative proxy nftables cleanup failures",
  labelNames: family,
  registers: [allMetrics],
});

export const conntrackReconcilerSyncDuration = new client.Histogram({
  name: "kubeproxy_conntrack_reconciler_sync_duration_seconds",
  help: "[ALPHA] ReconcileConntrackFlowsLatency latency in seconds",
  labelNames: family,
  buckets: syncBuckets,
  registers: [allMetrics],
});

export const conntrackReconcilerDeletedEntriesTotal = new client.Counter({
  name: "kubeproxy_conntrack_reconciler_deleted_entries_total",
  help: "[ALPHA] Cumulative conntrack flows deleted by conntrack reconciler",
  labelNames: family,
  registers: [allMetrics],
});

export const proxyHealthzTotal = new client.Counter({
  name: "kubeproxy_proxy_healthz_total",
  help: "[ALPHA] Cumulative proxy healthz HTTP status",
  labelNames: ["code"] as const,
  registers: [allMetrics],
});

export const proxyLivezTotal = new client.Counter({
  name: "kubeproxy_proxy_livez_total",
  help: "[ALPHA] Cumulative proxy livez HTTP status",
  labelNames: ["code"] as const,
  registers: [allMetrics],
});

/** The exposition text of every metric of every mode. */
export function metricsText(): Promise<string> {
  return allMetrics.metrics();
}

/**
 * Failed syncs of any dataplane, per family. Not an upstream metric (upstream counts failures per
 * backend: `..._iptables_restore_failures_total`, `..._nftables_sync_failures_total`); the `denokubeproxy_`
 * prefix keeps it apart from upstream names.
 */
export const syncFailuresTotal = new client.Counter({
  name: "denokubeproxy_sync_proxy_rules_failures_total",
  help: "Cumulative failed proxy rule syncs (any dataplane)",
  labelNames: family,
  registers: [allMetrics],
});

/**
 * Our own (no upstream counterpart): service ports left out of the rules because the dataplane's kernel tool
 * refused them (lib/proxy/isolation.ts); retried when their Service changes and at every full sync.
 */
export const quarantinedServicePorts = new client.Gauge({
  name: "denokubeproxy_quarantined_service_ports",
  help: "Service ports left out of the proxy rules because the kernel tool refused them",
  labelNames: family,
  registers: [allMetrics],
});

/**
 * Our own (no upstream counterpart), served with `--nftables-netlink` only: nftables transactions by the way
 * they reached the kernel, `netlink` (the agent's own batch) or `nft` (everything the netlink path does not
 * carry: full syncs, and any transaction with an operation it cannot encode).
 */
export const nftablesTransactionsTotal = new client.Counter({
  name: "denokubeproxy_nftables_transactions_total",
  help:
    "nftables transactions sent to the kernel, by path (netlink: the agent's own batch; nft: the nft binary)",
  labelNames: ["ip_family", "path"],
  registers: [allMetrics],
});

/** Serves {@linkcode nftablesTransactionsTotal} on /metrics (`--nftables-netlink`). */
export function registerNftablesNetlinkMetrics(): void {
  if (servedMetrics.has(nftablesTransactionsTotal)) return;
  servedMetrics.add(nftablesTransactionsTotal);
  registry.registerMetric(nftablesTransactionsTotal);
}

/** One sample a {@linkcode ReadAtScrapeCounter} reads: its label values and its value. */
export interface ScrapeSample<T extends string> {
  readonly labels: Partial<Record<T, string>>;
  readonly value: number;
}

/**
 * A counter whose values are read at scrape time (upstream's nfacct and nftables-counter collectors): prom-client's
 * Counter whose `get()` reports the samples read, and none in a scrape where they cannot be read.
 */
class ReadAtScrapeCounter<T extends string> extends client.Counter<T> {
  readonly #read: () => Promise<readonly ScrapeSample<T>[]>;

  constructor(
    name: string,
    help: string,
    labelNames: readonly T[],
    read: () => Promise<readonly ScrapeSample<T>[]>,
  ) {
    super({ name, help, labelNames, registers: [] });
    this.#read = read;
  }

  override async get(): Promise<client.MetricObjectWithValues<client.MetricValue<T>>> {
    const base = await super.get();
    const samples = await this.#read().catch(() => []);
    return { ...base, values: samples.map((s) => ({ value: s.value, labels: { ...s.labels } })) };
  }
}

/**
 * Registers upstream's two nfacct-backed metrics (iptables mode only, as upstream), read from the kernel at
 * every scrape; a counter that cannot be read is left out of that scrape. Registering twice is a no-op.
 */
export function registerNfacctMetrics(read: (counter: string) => Promise<number | null>): void {
  const metrics = [
    [
      "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
      "[ALPHA] packets dropped by iptables to work around conntrack problems",
      "ct_state_invalid_dropped_pkts",
    ],
    [
      "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
      "[ALPHA] Number of packets accepted on nodeports of loopback interface",
      "localhost_nps_accepted_pkts",
    ],
  ];
  for (const [name, help, counter] of metrics) {
    if (registry.getSingleMetric(name)) continue;
    const readOne = async (): Promise<ScrapeSample<never>[]> => {
      const v = await read(counter);
      return v === null ? [] : [{ labels: {}, value: v }];
    };
    registry.registerMetric(new ReadAtScrapeCounter(name, help, [], readOne));
  }
}

/** Active loopback listeners of the localhost NodePort proxy (KubeProxyNFTablesLocalhostNodePorts, nftables). */
export const localhostNodePortListeners = new client.Gauge({
  name: "kubeproxy_nftables_localhost_nodeport_listeners",
  help: "[ALPHA] Number of active localhost NodePort userspace proxy listeners.",
  labelNames: family,
  registers: [allMetrics],
});

/** Loopback listeners of the localhost NodePort proxy that could not be bound. */
export const localhostNodePortListenerCreationFailuresTotal = new client.Counter({
  name: "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
  help: "[ALPHA] Number of localhost NodePort userspace proxy listener creation failures.",
  labelNames: family,
  registers: [allMetrics],
});

/** The name of the rejected-packets metric read at scrape time from the table's named counters. */
export const LOCALHOST_NODEPORT_REJECTED_PACKETS =
  "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";

/** A reading of one `localhost-nodeport-rejected-<proto>` counter of one family's table. */
export type LocalhostNodePortRejectedSample = ScrapeSample<"ip_family" | "protocol">;

/**
 * Registers upstream's three KubeProxyNFTablesLocalhostNodePorts metrics (nftables mode with the gate on, as
 * upstream): the listener gauge and creation-failure counter (set by the loopback listeners), and the rejected
 * packets read from the kernel by `read` at every scrape. Registering twice is a no-op.
 */
export function registerLocalhostNodePortMetrics(
  read: () => Promise<readonly LocalhostNodePortRejectedSample[]>,
): void {
  for (const m of [localhostNodePortListeners, localhostNodePortListenerCreationFailuresTotal]) {
    if (servedMetrics.has(m)) continue;
    servedMetrics.add(m);
    registry.registerMetric(m);
  }
  if (registry.getSingleMetric(LOCALHOST_NODEPORT_REJECTED_PACKETS)) return;
  registry.registerMetric(
    new ReadAtScrapeCounter(
      LOCALHOST_NODEPORT_REJECTED_PACKETS,
      "[ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is " +
        "rejected when the localhost NodePort proxy is not running",
      ["ip_family", "protocol"],
      read,
    ),
  );
}

/** Metrics of every mode (upstream's RegisterMetrics core list, plus our cross-mode failure counter). */
const CORE_METRICS: client.Metric[] = [
  syncProxyRulesDuration,
  syncProxyRulesLastQueuedTimestamp,
  syncProxyRulesLastTimestamp,
  endpointChangesPending,
  endpointChangesTotal,
  serviceChangesPending,
  serviceChangesTotal,
  proxyHealthzTotal,
  proxyLivezTotal,
  networkProgrammingDuration,
  noLocalEndpointsTotal,
  syncFailuresTotal,
  quarantinedServicePorts,
];

const conntrackMetrics = [conntrackReconcilerSyncDuration, conntrackReconcilerDeletedEntriesTotal];

/** Each mode's own metrics, as upstream's RegisterMetrics switch (pkg/proxy/metrics/metrics.go). */
const MODE_METRICS: Record<string, client.Metric[]> = {
  iptables: [
    syncFullProxyRulesDuration,
    syncPartialProxyRulesDuration,
    iptablesRestoreFailuresTotal,
    iptablesPartialRestoreFailuresTotal,
    iptablesRulesTotal,
    iptablesRulesLastSync,
    ...conntrackMetrics,
  ],
  ipvs: [iptablesRestoreFailuresTotal, ...conntrackMetrics],
  nftables: [
    syncFullProxyRulesDuration,
    syncPartialProxyRulesDuration,
    nftablesSyncFailuresTotal,
    nftablesCleanupFailuresTotal,
    ...conntrackMetrics,
  ],
};

/** The metrics registerMetrics has put on /metrics (some are shared by modes, and each is registered once). */
const servedMetrics = new Set<client.Metric>();

/**
 * Serves the core metrics and those of `mode` on /metrics, as upstream registers them: an operator sees the
 * metrics of the mode that runs, not zeros of the others. Registering again is a no-op.
 */
export function registerMetrics(mode: string): void {
  for (const m of [...CORE_METRICS, ...(MODE_METRICS[mode] ?? [])]) {
    if (servedMetrics.has(m)) continue;
    servedMetrics.add(m);
    registry.registerMetric(m);
  }
}
