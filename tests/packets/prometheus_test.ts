/**
 * Operators' monitoring against a real Prometheus (issue 19): upstream kube-proxy v1.37.2 (built by
 * scripts/build_k8s.sh) and this agent run side by side against one real kube-apiserver, each in its own
 * sandbox's node namespace, while Services and EndpointSlices change; a real Prometheus (Debian's package) in the
 * control-plane namespace scrapes both every second as job="kube-proxy", each target labelled with its own
 * `cluster` (the mixin's cluster label), so every query can be scoped to one agent by filling `$cluster`.
 *
 * Asserted for both agents: every query of kubernetes-mixin's "Kubernetes / Proxy" dashboard returns series
 * (except `go_goroutines` for ours: no Go runtime), and the two kube-proxy alerts fire when they should (a
 * target whose scrapes fail, a target gone) and not before; the queries of deploy/monitoring/dashboard.json
 * return series (ours-only panels for ours), and the alert expressions of deploy/monitoring/alerts.yaml stay
 * quiet while the agents are healthy; `promtool check metrics` is clean on our exposition; every family
 * upstream exports that is not about the Go runtime is in ours with upstream's type and help, except the ones
 * docs/operations.md lists as absent (with why), which must indeed be absent.
 *
 * Both agents start before their RBAC binding exists (as when a DaemonSet lands before its ClusterRoleBinding):
 * their first requests are refused with 403, which fills the dashboard's 4xx panel honestly. kube-apiserver
 * sends no 3xx and this test causes no 5xx: those two panels stay empty for both, and the test asserts that.
 */

import assert from "node:assert/strict";
import { parse as parseYaml } from "yaml";
import { KubeApiServer, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import {
  families,
  familiesWithSamples,
  fetchInNamespace,
  PrometheusServer,
  prometheusUnavailableReason,
  promtoolCheckMetrics,
  type Sample,
} from "../../testkit/prometheus.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import type { KubeObject } from "../../lib/kube/types.ts";
import { ALERTS, DASHBOARD_QUERIES, substitute, VARIABLE_SELECTORS } from "./kubernetes_mixin.ts";
import {
  NODE,
  NODE_IP,
  NODE_IP6,
  nodeObject,
  OUR_USER,
  ourAgent,
  UPSTREAM_USER,
  upstreamProxy,
} from "./parity_harness.ts";

const unavailable =
  sandboxUnavailableReason(["ip", "iptables-nft", "ip6tables-nft", "conntrack", "sysctl"]) ??
    kubeApiServerUnavailableReason(["kube-apiserver", "etcd", "kube-proxy"]) ?? prometheusUnavailableReason();

const NS = "mon";
const METRICS_PORT = 10249;
/** The rate window the Grafana variable `$__rate_interval` gets: longer than the whole run (1 s scrapes). */
const RATE_INTERVAL = "5m";
/** How long each wait for a condition may take. */
const WAIT_MS = 90_000;

/**
 * Families upstream exports that this agent leaves out, each with why (docs/operations.md, "Metrics", says the
 * same). The test fails if one of them appears in ours (then it must leave this list) or if upstream exports a
 * non-Go family that is neither here nor in ours.
 */
const ABSENT_BY_DESIGN: Record<string, string> = {
  ...Object.fromEntries(
    [
      "aggregator_discovery_aggregation_count_total",
      "apiserver_audit_event_total",
      "apiserver_audit_requests_rejected_total",
      "apiserver_envelope_encryption_dek_cache_fill_percent",
      "apiserver_storage_data_key_generation_duration_seconds",
      "apiserver_storage_data_key_generation_failures_total",
      "apiserver_storage_envelope_transformation_cache_misses_total",
      "apiserver_validation_declarative_validation_mismatch_total",
      "apiserver_validation_declarative_validation_panic_total",
      "apiserver_validation_duplicate_validation_error_total",
      "apiserver_webhooks_x509_insecure_sha1_total",
      "apiserver_webhooks_x509_missing_san_total",
    ].map((
      n,
    ) => [
      n,
      "an API server library subsystem linked into upstream's binary that kube-proxy never runs (always 0)",
    ]),
  ),
  cardinality_enforcement_unexpected_categorizations_total:
    "component-base's cardinality enforcement: not here",
  registered_metrics_total: "component-base's registry accounting (stability levels): not here",
  disabled_metrics_total: "component-base's --disabled-metrics: not supported, nothing to count",
  hidden_metrics_total: "component-base's hidden deprecated metrics: none hidden, nothing to count",
  rest_client_transport_cache_entries: "client-go's transport cache: this client keeps one pool per identity",
  rest_client_transport_create_calls_total:
    "client-go's transport cache: this client keeps one pool per identity",
  rest_client_transport_cert_rotation_gc_calls_total: "client-go's transport GC: no such mechanism here",
  ...Object.fromEntries(
    [
      "process_open_fds",
      "process_max_fds",
      "process_virtual_memory_bytes",
      "process_virtual_memory_max_bytes",
      "process_network_receive_bytes_total",
      "process_network_transmit_bytes_total",
    ].map((n) => [n, "read from /proc, which Deno lets the agent read only with --allow-all"]),
  ),
};

/** A family about the Go runtime (no equivalent in a Deno process). */
const isGoRuntime = (name: string) => name.startsWith("go_");

/** The panels of the picture (docs/monitoring.png): title, unit, query (15 s windows: 1 s scrapes). */
const PICTURE_PANELS: [string, string, string][] = [
  [
    "Rules sync latency, 99th percentile",
    "s",
    'histogram_quantile(0.99, sum by (le) (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{cluster="$cluster"}[15s])))',
  ],
  [
    "Network programming latency, 99th percentile",
    "s",
    'histogram_quantile(0.99, sum by (le) (rate(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster"}[15s])))',
  ],
  // The requests themselves, not their rate: after their first lists (before the first scrape) both proxies only
  // hold their watches open while Services and endpoints change, so the dashboard's rate stays at 0 here.
  ["Kube API requests since start", "requests", 'sum(rest_client_requests_total{cluster="$cluster"})'],
  ["Memory (resident)", "MiB", 'process_resident_memory_bytes{cluster="$cluster"} / 1048576'],
];

interface Agent {
  who: "upstream" | "deno";
  address: string;
  proc: SandboxProcess;
  sb: Sandbox;
}

function service(name: string): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { namespace: NS, name },
    spec: {
      type: "ClusterIP",
      ipFamilyPolicy: "PreferDualStack",
      ports: [{ name: "http", port: 80, targetPort: 8080, protocol: "TCP" }],
    },
  } as KubeObject;
}

/** An EndpointSlice as the EndpointSlice controller writes it, with the trigger time of the change. */
function slice(svc: string, ips: string[]): KubeObject {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      namespace: NS,
      name: `${svc}-0`,
      labels: {
        "kubernetes.io/service-name": svc,
        "endpointslice.kubernetes.io/managed-by": "dkp-prometheus-test",
      },
      annotations: { "endpoints.kubernetes.io/last-change-trigger-time": new Date().toISOString() },
    },
    addressType: "IPv4",
    endpoints: ips.map((ip) => ({ addresses: [ip], nodeName: NODE, conditions: { ready: true } })),
    ports: [{ name: "http", port: 8080, protocol: "TCP" }],
  } as KubeObject;
}

function bindings(): KubeObject[] {
  return [UPSTREAM_USER, OUR_USER].map((user) => ({
    apiVersion: "rbac.authorization.k8s.io/v1",
    kind: "ClusterRoleBinding",
    metadata: { name: user },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node-proxier" },
    subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: user }],
  } as KubeObject));
}

/** Polls `check` (which throws what is still wrong) every second until it passes or `WAIT_MS` passes. */
async function eventually(what: string, check: () => Promise<void>, agents: Agent[] = []): Promise<void> {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    try {
      return await check();
    } catch (e) {
      if (Date.now() > deadline) {
        const tails = agents.map((a) => `--- ${a.who}:\n${a.proc.tail()}`).join("\n");
        throw new Error(`${what}: still failing after ${WAIT_MS} ms: ${(e as Error).message}\n${tails}`);
      }
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

privilegedTest(unavailable, {
  name:
    "prometheus: kubernetes-mixin's kube-proxy dashboard and alerts, and ours, work for upstream and the agent",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const api = await KubeApiServer.start({ tokenUsers: [UPSTREAM_USER, OUR_USER] });
    const sandboxes: Sandbox[] = [];
    let prom: PrometheusServer | undefined;
    let churning = true;
    let churn: Promise<void> = Promise.resolve();
    const ran: string[] = [];
    try {
      await api.create(nodeObject());
      await api.create({ apiVersion: "v1", kind: "Namespace", metadata: { name: NS } } as KubeObject);
      for (const name of ["web", "api"]) {
        await api.create(service(name));
        await api.create(slice(name, ["10.244.0.11", "10.244.1.11"]));
      }

      const [usb, osb] = await Promise.all(
        [0, 1].map(() => Sandbox.create({ ipv6: true, nodeIP: NODE_IP, nodeIP6: NODE_IP6 })),
      );
      sandboxes.push(usb, osb);
      const agents: Agent[] = [];
      const metricsFlag = [`--metrics-bind-address=0.0.0.0:${METRICS_PORT}`];
      for (
        const [who, sb, proxy] of [
          ["upstream", usb, upstreamProxy(api, "iptables", "nft", metricsFlag)],
          ["deno", osb, ourAgent(metricsFlag)],
        ] as const
      ) {
        const address = await api.attach(sb.node);
        // The hint kubelet leaves for iptables-wrapper: our agent picks its backend from it.
        await sb.exec(sb.node, "iptables-nft", ["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
        await sb.exec(sb.node, "ip6tables-nft", ["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
        const proc = await proxy.start(sb, await api.writeKubeconfig({ token: api.tokens.get(proxy.user) }));
        agents.push({ who, address, proc, sb });
      }
      const target = (a: Agent) => `${a.address}:${METRICS_PORT}`;
      const targets = agents.map((a) => ({ targets: [target(a)], labels: { cluster: a.who } }));
      prom = await PrometheusServer.start(usb, api.netns, { job: "kube-proxy", targets });
      const p = prom;
      const query = (expr: string) => {
        ran.push(expr);
        return p.query(expr);
      };
      const scoped = (a: Agent, expr: string) =>
        substitute(expr, { cluster: a.who, instance: target(a), rateInterval: RATE_INTERVAL });

      await t.step("both agents are refused (403) until their ClusterRoleBinding exists", async () => {
        // Upstream serves /metrics only once it has its Node: wait for the refusals in the logs, bind, then
        // find them in the scraped counters.
        await Promise.all(agents.map((a) => a.proc.waitForOutput(/forbidden/i, WAIT_MS)));
        for (const b of bindings()) await api.create(b);
        await eventually("403s scraped from both", async () => {
          for (const a of agents) {
            const s = await query(
              `rest_client_requests_total{job="kube-proxy", cluster="${a.who}", code="403"}`,
            );
            if (s.length === 0) throw new Error(`no 403 from ${a.who} yet`);
          }
        }, agents);
      });

      const runStart = Date.now() / 1000;
      // Churn while they run: an endpoint change every second (with its trigger time, as the EndpointSlice
      // controller writes it), a Service created or deleted every third.
      churn = (async () => {
        for (let i = 0; churning; i++) {
          await api.update(slice(i % 2 ? "web" : "api", [`10.244.0.${20 + (i % 7)}`, "10.244.1.11"]));
          if (i % 3 === 0) {
            const name = `extra-${Math.floor(i / 6)}`;
            if (i % 6 === 0) {
              await api.create(service(name));
              await api.create(slice(name, ["10.244.0.30"]));
            } else await api.remove(service(name));
          }
          await new Promise((r) => setTimeout(r, 1000));
        }
      })();

      await t.step(
        "every query of the mixin's Kubernetes / Proxy dashboard returns series for both",
        async () => {
          const empty = (q: { expr: string }) =>
            q.expr.includes('code=~"3..') || q.expr.includes('code=~"5..');
          await eventually("dashboard queries", async () => {
            const missing: string[] = [];
            for (const a of agents) {
              for (const q of [...DASHBOARD_QUERIES, ...VARIABLE_SELECTORS]) {
                if (q.goRuntime && a.who === "deno") continue;
                const s = await query(scoped(a, q.expr));
                if (empty(q) ? s.length !== 0 : s.length === 0) missing.push(`${a.who}: ${q.name}`);
              }
            }
            if (missing.length) throw new Error(`wrong answers: ${missing.join("; ")}`);
          }, agents);
          // Ours has no Go runtime: the Goroutines panel is the one that stays empty.
          const deno = agents.find((a) => a.who === "deno")!;
          assert.deepEqual(await query(scoped(deno, DASHBOARD_QUERIES.find((q) => q.goRuntime)!.expr)), []);
        },
      );

      await t.step("network programming latency is measured from the trigger time by both", async () => {
        for (const a of agents) {
          const [s] = await query(scoped(
            a,
            `histogram_quantile(0.5, sum(rate(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster"}[$__rate_interval])) by (le))`,
          ));
          // A change reaches the rules within seconds here (the API server and the agent share a machine).
          assert.ok(Number(s.value) > 0 && Number(s.value) < 30, `${a.who}: median ${s.value} s`);
        }
      });

      const expositions = await Promise.all(
        agents.map((a) => fetchInNamespace(usb, api.netns, `http://${target(a)}/metrics`)),
      );

      await t.step(
        "promtool check metrics is clean on our exposition, but for upstream's own names",
        async () => {
          // promtool objects to two gauges upstream named `..._total` (kubeproxy_sync_proxy_rules_iptables_total,
          // kubeproxy_sync_proxy_rules_no_local_endpoints_total): the names stay for compatibility, so the same
          // complaints on both sides are expected; anything else of ours is not.
          const [up, ours] = await Promise.all(expositions.map(promtoolCheckMetrics));
          assert.deepEqual(ours.filter((l) => !up.includes(l)), []);
          assert.ok(
            ours.every((l) => / non-counter metrics should not have "_total" suffix$/.test(l)),
            ours.join("\n"),
          );
          console.log(`promtool check metrics on ours: ${ours.length ? ours.join("; ") : "clean"}`);
        },
      );

      await t.step("every non-Go family upstream exports is in ours with upstream's type and help", () => {
        const [up, ours] = expositions.map(families);
        const upNonGo = [...up.keys()].filter((n) => !isGoRuntime(n)).sort();
        const missing = upNonGo.filter((n) => !ours.has(n) && !(n in ABSENT_BY_DESIGN));
        assert.deepEqual(missing, [], "upstream families missing from ours");
        for (const n of Object.keys(ABSENT_BY_DESIGN)) {
          assert.ok(!ours.has(n), `${n} is served: drop it from the list`);
        }
        const different = upNonGo.filter((n) => ours.has(n))
          .filter((n) => ours.get(n)!.type !== up.get(n)!.type || ours.get(n)!.help !== up.get(n)!.help)
          .map((n) => `${n}: ours ${JSON.stringify(ours.get(n))}, upstream ${JSON.stringify(up.get(n))}`);
        assert.deepEqual(different, []);
        // Families upstream fills in this run are filled in ours too (none declared and left empty).
        const upFilled = familiesWithSamples(expositions[0], upNonGo);
        const oursFilled = familiesWithSamples(expositions[1], upNonGo);
        assert.deepEqual([...upFilled].filter((n) => !oursFilled.has(n) && !(n in ABSENT_BY_DESIGN)), []);
        console.log(
          `families: upstream ${up.size} (${upNonGo.length} not Go runtime), ours ${ours.size} ` +
            `(${[...ours.keys()].filter((n) => n.startsWith("denokubeproxy_")).length} denokubeproxy_)`,
        );
      });

      await t.step(
        "deploy/monitoring/dashboard.json: every query returns series (ours-only panels for ours)",
        async () => {
          const dashboard = JSON.parse(
            await Deno.readTextFile(`${PROJECT_ROOT}deploy/monitoring/dashboard.json`),
          );
          const targetsOf = (panels: { targets?: { expr: string }[]; panels?: unknown[] }[]): string[] =>
            panels.flatMap((pl) => [
              ...(pl.targets ?? []).map((tg) => tg.expr),
              ...targetsOf((pl.panels ?? []) as typeof panels),
            ]);
          const exprs = targetsOf(dashboard.panels);
          assert.ok(exprs.length >= 20, `${exprs.length} queries`);
          await eventually("our dashboard's queries", async () => {
            const wrong: string[] = [];
            for (const expr of exprs) {
              for (const a of agents) {
                const oursOnly = expr.includes("denokubeproxy_");
                // No 3xx/5xx answers and no failed sync in this run: those targets stay empty for both.
                const empty = expr.includes('code=~"3..') || expr.includes('code=~"5..') ||
                  expr.includes('{__name__=~"kubeproxy_sync_proxy_rules_(');
                const s = await query(scoped(a, expr));
                const want = !empty && (a.who === "deno" || !oursOnly);
                if ((s.length > 0) !== want) wrong.push(`${a.who}: ${expr} -> ${s.length} series`);
              }
            }
            if (wrong.length) throw new Error(wrong.join("\n"));
          }, agents);
        },
      );

      // With DKP_MONITORING_DATA=<file>: churn on for DKP_MONITORING_SECONDS (default 120) and save the main
      // panels of both agents over the run, for scripts/monitoring_picture.ts (docs/monitoring.png).
      const dataFile = Deno.env.get("DKP_MONITORING_DATA");
      if (dataFile) {
        await t.step("the main panels over the run are saved for the picture", async () => {
          await new Promise((r) =>
            setTimeout(r, Number(Deno.env.get("DKP_MONITORING_SECONDS") ?? 120) * 1000)
          );
          const end = Date.now() / 1000;
          const panels = [];
          for (const [title, unit, expr] of PICTURE_PANELS) {
            const series = [];
            for (const a of agents) {
              const [s] = await p.queryRange(expr.replaceAll("$cluster", a.who), runStart, end, 1);
              series.push({
                agent: a.who === "deno" ? "deno-kube-proxy" : "upstream kube-proxy v1.37.2",
                points: s?.points ?? [],
              });
            }
            panels.push({ title, unit, series });
          }
          await Deno.writeTextFile(dataFile, JSON.stringify({ start: runStart, end, panels }));
        });
      }

      const ourRules = parseYaml(await Deno.readTextFile(`${PROJECT_ROOT}deploy/monitoring/alerts.yaml`)) as {
        groups: { rules: { alert: string; expr: string }[] }[];
      };
      const ourAlerts = ourRules.groups.flatMap((g) => g.rules);
      const perAgent = (a: Agent, expr: string) =>
        expr.replaceAll('job="kube-proxy"', `job="kube-proxy", cluster="${a.who}"`);

      await t.step("while both are healthy no alert expression returns anything", async () => {
        for (const a of agents) {
          for (const al of [...ALERTS, ...ourAlerts.map((r) => ({ name: r.alert, expr: r.expr }))]) {
            assert.deepEqual(await query(perAgent(a, al.expr)), [], `${a.who}: ${al.name}`);
          }
          // Not vacuous: the series the stale-rules and failure alerts compare exist for this agent.
          for (
            const sel of [
              "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
              "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
              "kubeproxy_network_programming_duration_seconds_bucket",
              ...(a.who === "deno" ? ["denokubeproxy_sync_proxy_rules_failures_total"] : []),
            ]
          ) {
            assert.notDeepEqual(
              await query(`${sel}{job="kube-proxy", cluster="${a.who}"}`),
              [],
              `${a.who}: ${sel}`,
            );
          }
        }
      });

      churning = false;
      await churn;

      await t.step(
        "stopped agents: KubeProxyInstanceUnreachable's and DenoKubeProxyAgentDown's expressions fire",
        async () => {
          await Promise.all(agents.map((a) => a.proc.stop(5000)));
          const unreachable = ALERTS.find((al) => al.firesWhen === "scrape fails")!;
          const down = ourAlerts.find((r) => r.alert === "DenoKubeProxyAgentDown")!;
          await eventually("alerts firing for both", async () => {
            for (const a of agents) {
              for (const expr of [unreachable.expr, down.expr]) {
                const s: Sample[] = await query(perAgent(a, expr));
                if (s.length !== 1 || s[0].metric.instance !== target(a)) {
                  throw new Error(`${a.who}: ${expr}: ${JSON.stringify(s)}`);
                }
              }
            }
          });
        },
      );

      await t.step("targets gone from discovery: KubeProxyDown's expression fires", async () => {
        const gone = ALERTS.find((al) => al.firesWhen === "target gone")!;
        for (const a of agents) assert.deepEqual(await query(perAgent(a, gone.expr)), [], a.who);
        await p.setTargets([]);
        await eventually("absent(up) for both", async () => {
          for (const a of agents) {
            const s = await query(perAgent(a, gone.expr));
            if (s.length !== 1 || s[0].value !== "1") throw new Error(`${a.who}: ${JSON.stringify(s)}`);
          }
        });
      });
    } finally {
      churning = false;
      await churn.catch(() => {});
      await prom?.stop();
      await Promise.all(sandboxes.map((sb) => sb.destroy()));
      await api.stop();
      console.log(`queries run (${new Set(ran).size} distinct):\n${[...new Set(ran)].join("\n")}`);
    }
    assert.deepEqual(listNetns().filter((n) => n === api.netns), []);
  },
});
