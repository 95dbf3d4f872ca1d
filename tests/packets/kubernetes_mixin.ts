/**
 * The queries operators run against kube-proxy, as data: every target of kubernetes-mixin's "Kubernetes / Proxy"
 * dashboard and the expressions of its kube-proxy alerts, copied from github.com/kubernetes-monitoring/
 * kubernetes-mixin at commit aa38e2bfa7ea6ec6870420b483046afe790a6411 (2026-08-06):
 * `dashboards/proxy.libsonnet` (panels) and `alerts/kube_proxy.libsonnet` with `lib/absent_alert.libsonnet` and
 * `lib/instance_unreachable_alert.libsonnet` (alerts), with the mixin's defaults filled in: `clusterLabel` is
 * `cluster`, `kubeProxySelector` is `job="kube-proxy"`. The Grafana variables stay as written (`$cluster`,
 * `$instance`, `$__rate_interval` for `grafanaIntervalVar`); {@linkcode substitute} fills them per agent.
 * @module
 */

/** One query of the dashboard or the alerts. */
export interface MixinQuery {
  /** The panel title (and legend) or the alert name. */
  name: string;
  expr: string;
  /** A Go runtime metric: only upstream (Go) has it. */
  goRuntime?: boolean;
}

const sel = 'job="kube-proxy"';

/** The dashboard's targets, in panel order. */
export const DASHBOARD_QUERIES: MixinQuery[] = [
  { name: "Up", expr: `sum(up{cluster="$cluster", ${sel}})` },
  {
    name: "Rules Sync Rate",
    expr:
      `sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count{cluster="$cluster", ${sel}, instance=~"$instance"}[$__rate_interval]))`,
  },
  {
    name: "Rules Sync Latency 99th Quantile",
    expr:
      `histogram_quantile(0.99,rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{cluster="$cluster", ${sel}, instance=~"$instance"}[$__rate_interval]))`,
  },
  {
    name: "Network Programming Rate",
    expr:
      `sum(rate(kubeproxy_network_programming_duration_seconds_count{cluster="$cluster", ${sel}, instance=~"$instance"}[$__rate_interval]))`,
  },
  {
    name: "Network Programming Latency 99th Quantile",
    expr:
      `histogram_quantile(0.99, sum(rate(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster", ${sel}, instance=~"$instance"}[$__rate_interval])) by (instance, le))`,
  },
  ...["2", "3", "4", "5"].map((c) => ({
    name: `Kube API Request Rate (${c}xx)`,
    expr:
      `sum(rate(rest_client_requests_total{cluster="$cluster",${sel}, instance=~"$instance",code=~"${c}.."}[$__rate_interval]))`,
  })),
  {
    name: "Post Request Latency 99th Quantile",
    expr:
      `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", ${sel},instance=~"$instance",verb="POST"}[$__rate_interval])) by (verb, le))`,
  },
  {
    name: "Get Request Latency 99th Quantile",
    expr:
      `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{cluster="$cluster", ${sel}, instance=~"$instance", verb="GET"}[$__rate_interval])) by (verb, le))`,
  },
  {
    name: "Memory",
    expr: `process_resident_memory_bytes{cluster="$cluster", ${sel},instance=~"$instance"}`,
  },
  {
    name: "CPU usage",
    expr:
      `rate(process_cpu_seconds_total{cluster="$cluster", ${sel},instance=~"$instance"}[$__rate_interval])`,
  },
  {
    name: "Goroutines",
    expr: `go_goroutines{cluster="$cluster", ${sel},instance=~"$instance"}`,
    goRuntime: true,
  },
];

/** The dashboard's template variables' queries (label_values(<selector>, <label>)): their selectors. */
export const VARIABLE_SELECTORS: MixinQuery[] = [
  { name: 'variable cluster: label_values(up{job="kube-proxy"}, cluster)', expr: `up{${sel}}` },
  {
    name: 'variable instance: label_values(up{..., cluster="$cluster"}, instance)',
    expr: `up{${sel}, cluster="$cluster", ${sel}}`,
  },
];

/** The kube-proxy alerts: name, expression (`for: 15m` each), and the condition under which they fire. */
export const ALERTS: (MixinQuery & { firesWhen: "target gone" | "scrape fails" })[] = [
  { name: "KubeProxyDown", expr: `absent(up{${sel}})`, firesWhen: "target gone" },
  { name: "KubeProxyInstanceUnreachable", expr: `up{${sel}} == 0`, firesWhen: "scrape fails" },
];

/** Fills the dashboard variables: one agent's cluster label and instance, and a rate window. */
export function substitute(
  expr: string,
  vars: { cluster: string; instance: string; rateInterval: string },
): string {
  return expr.replaceAll("$cluster", vars.cluster).replaceAll(
    "$instance",
    vars.instance.replaceAll(".", "\\\\."),
  )
    .replaceAll("$__rate_interval", vars.rateInterval);
}
