/**
 * The API server's cost of every agent (issue #22): the real kube-apiserver + etcd of the test kit
 * (testkit/kube_apiserver.ts, the reference release) loaded through its API with S Services × E endpoints, then,
 * for each agent kind in turn, N agents started at once as a DaemonSet rollout does, each in a throwaway network
 * namespace attached to the control plane, then endpoint churn. Only API traffic is measured: every agent runs
 * with no-op `iptables*` / `ip6tables*` / `nft` wrappers first in its PATH (they read the payload, note when a
 * restore carried every Service, and exit 0), so no kernel rules are written.
 *
 * ```sh
 * deno run -A scripts/api_cost.ts --services 10000 --endpoints 10 --agents 10 \
 *   --kinds ours,ours-watchlist,upstream --churn 20 --duration 60
 * # first full sync beside upstream: 5 rounds on one load, the kinds' order reversed every other round
 * deno run -A scripts/api_cost.ts --services 10000 --agents 1 --kinds ours,upstream --churn 2 --duration 5 \
 *   --rounds 5
 * # the same with kube-apiserver restarted (same etcd) before every group: peak RSS growth from a fresh heap
 * deno run -A scripts/api_cost.ts --services 10000 --agents 5 --kinds ours,ours-watchlist,upstream \
 *   --churn 2 --duration 5 --rounds 2 --fresh-apiserver
 * # the steady state: every kind at once, an hour of churn, requests counted per 10 minutes
 * deno run -A scripts/api_cost.ts --services 2000 --agents 3 --kinds ours,upstream --together \
 *   --churn 2 --duration 3600 --window 600
 * ```
 *
 * Kinds: `ours` (LIST + gzip, then WATCH; EndpointSlice watches in protobuf), `ours-json` (the same with
 * `--kube-api-content-type=application/json`: every watch JSON), `ours-watchlist` (this agent with
 * `--feature-gates=WatchListClient=true`),
 * `upstream` (upstream kube-proxy of the reference release, its defaults: protobuf, client-go's watch-list).
 * Each agent has its own API user (a static token bound to system:node-proxier), so the audit log tells agents
 * apart. Figures:
 * - per agent: requests by verb (audit log, ResponseComplete stage) during the start (spawn → every agent synced
 *   + settle) and during the churn; bytes received on its link to the control plane (the namespace's `k8s0`
 *   rx_bytes: TLS, HTTP framing and all); time from spawn to the first `iptables-restore` holding every Service;
 * - API server (from /proc of the kube-apiserver process): CPU seconds and peak RSS growth over the start
 *   (VmHWM reset through clear_refs before the start), CPU seconds over the churn; from its /metrics: the
 *   latency of LIST and GET requests, the requests by verb, watch events sent.
 * `DKP_AC_V` sets the agents' `--v` (default 1). Must run as root; everything lives in `dkp-<pid>-...` namespaces,
 * deleted afterwards.
 * @module
 */
import { parseArgs } from "node:util";
import { k8sBinary, KubeApiServer } from "../testkit/kube_apiserver.ts";
import { agentCommand as startCommand, PROJECT_ROOT } from "../testkit/agent_command.ts";
import type { KubeObject } from "../lib/kube/types.ts";
import { sh } from "./scale_netns.ts";

/** Agent kinds the harness runs. */
export type AgentKind = "ours" | "ours-json" | "ours-watchlist" | "upstream";
const KINDS: AgentKind[] = ["ours", "ours-json", "ours-watchlist", "upstream"];
const NS = "apicost";

/** Options of {@linkcode runApiCost}. */
export interface ApiCostOptions {
  services: number;
  endpoints: number;
  /** Agents started at once per kind. */
  agents: number;
  kinds: AgentKind[];
  /** EndpointSlice updates per second during the churn. */
  churn: number;
  /** Seconds of churn. */
  duration: number;
  /** Seconds per window of the requests-over-time row (the steady state). */
  window: number;
  /** Start every kind's agents at once and churn them together (one run for the steady state of all). */
  together: boolean;
  /** Seconds after the last agent's first sync before the start phase is closed. */
  settle: number;
  /** Seconds allowed for every agent's first sync. */
  timeout: number;
  /** Concurrent creates while loading. */
  concurrency: number;
  /** Starts of every kind on the one loaded API server, the kinds' order reversed every other round. */
  rounds: number;
  /**
   * Restart kube-apiserver (same etcd, so the load stays) before every group: each group's peak RSS growth is
   * then measured from the heap of a server that has only built its watch cache, not from what the previous
   * group's requests left in Go's heap.
   */
  freshApiServer: boolean;
  verbose: boolean;
}

/** Requests of one agent by verb (audit log). */
export type Verbs = Record<string, number>;

/** What one kind measured. */
export interface KindResult {
  kind: AgentKind;
  /** The round (see {@linkcode ApiCostOptions.rounds}) this result is of. */
  round: number;
  agents: number;
  /** Agents started at once, this kind's and the others' with `together` (the API server figures are theirs). */
  agentsTogether: number;
  /** Seconds from spawn to the first restore holding every Service, per agent (null: never). */
  firstSyncS: (number | null)[];
  /** Bytes received per agent during the start phase. */
  startBytes: number[];
  /** Bytes received per agent during the churn. */
  churnBytes: number[];
  /** Requests per agent during the start and the churn. */
  startRequests: Verbs[];
  churnRequests: Verbs[];
  /** Requests per agent in each `window` seconds of the churn (re-watches, relists, bookmarks over time). */
  churnRequestsPerWindow: number[][];
  /** URIs of the first requests of agent 0 (what it asked for). */
  sampleURIs: string[];
  apiCpuStartS: number;
  apiCpuChurnS: number;
  apiRssBeforeMiB: number;
  apiRssPeakMiB: number;
  /** Mean LIST / GET latency (s) over the start, from apiserver_request_duration_seconds. */
  listLatencyS: number | null;
  getLatencyS: number | null;
  /** Watch events the server sent over the churn (apiserver_watch_events_total delta). */
  churnWatchEvents: number;
  loadAvg: string;
  errors: string[];
}

const log = (v: boolean, ...a: unknown[]) => v && console.error(`[${new Date().toISOString()}]`, ...a);

/** Metadata-level audit events (one per request, at its end) for the agents' users only. */
function auditPolicy(users: string[]): string {
  return `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  users: ${JSON.stringify(users)}
- level: None
`;
}

/**
 * A no-op iptables/nft: logs `<ns-time> <name> <Services in the payload>` for restores, writes nothing. Read
 * back, it answers as a kernel holding what was restored would where an agent checks: `-S KUBE-SERVICES` lists a
 * service rule once a restore carried one (this agent's check that nat KUBE-SERVICES was not flushed; without it
 * every sync would be full), and every other check succeeds (upstream's canary).
 */
const WRAPPER = `#!/bin/sh
name=$(basename "$0")
case " $* " in *" --version "*|*" -V "*|*" -v "*) case "$name" in
  nft*) echo "nftables v1.0.9 (Old Doc Yak #3)";;
  *) echo "$name v1.8.9 (legacy)";; esac; exit 0;; esac
case "$name" in
  *-restore) n=$(grep -c -- '-A KUBE-SERVICES .*-j KUBE-SVC-'); echo "$(date +%s%N) $name $n" >> "$DKP_AC_LOG";
    [ "$n" -gt 0 ] && touch "$DKP_AC_LOG.\${name%%-*}.services";;
  *-save) ;;
  iptables*|ip6tables*) case " $* " in *" -S KUBE-SERVICES "*)
    [ -e "$DKP_AC_LOG.\${name%%-*}.services" ] && echo "-A KUBE-SERVICES -j KUBE-SVC-RESTORED";; esac;;
  nft) case " $* " in *" -f "*) cat > /dev/null;; esac;;
esac
exit 0
`;
const WRAPPED = [
  "iptables",
  "iptables-save",
  "iptables-restore",
  "ip6tables",
  "ip6tables-save",
  "ip6tables-restore",
  "iptables-legacy",
  "iptables-legacy-save",
  "iptables-legacy-restore",
  "ip6tables-legacy",
  "ip6tables-legacy-save",
  "ip6tables-legacy-restore",
  "iptables-nft",
  "iptables-nft-save",
  "iptables-nft-restore",
  "ip6tables-nft",
  "ip6tables-nft-save",
  "ip6tables-nft-restore",
  "nft",
];

function service(i: number): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: `svc-${i}`, namespace: NS },
    spec: { ports: [{ name: "http", port: 80, protocol: "TCP", targetPort: 8080 }] },
  } as KubeObject;
}

function endpointIP(i: number, j: number, gen: number): string {
  const n = (i * 16 + j) + gen * 1_000_000;
  return `10.${128 + ((n >> 16) & 63)}.${(n >> 8) & 255}.${n & 255}`;
}

function slice(i: number, endpoints: number, gen = 0): KubeObject {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: { name: `svc-${i}-abcde`, namespace: NS, labels: { "kubernetes.io/service-name": `svc-${i}` } },
    addressType: "IPv4",
    endpoints: Array.from({ length: endpoints }, (_, j) => ({
      addresses: [endpointIP(i, j, gen)],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: `pool-${j % 3}`,
    })),
    ports: [{ name: "http", port: 8080, protocol: "TCP" }],
  } as KubeObject;
}

async function pool(n: number, concurrency: number, fn: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < n) {
      const i = next++;
      for (let attempt = 0;; attempt++) {
        try {
          await fn(i);
          break;
        } catch (e) {
          if (attempt >= 5 || !/429|timed out|connection|Conflict|409/i.test(String(e))) throw e;
          await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
        }
      }
    }
  }));
}

/** utime+stime (s) and VmRSS / VmHWM (MiB) of a process. */
function procStats(pid: number): { cpuS: number; rssMiB: number; hwmMiB: number } {
  const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const cpuS = (Number(f[11]) + Number(f[12])) / 100;
  const status = Deno.readTextFileSync(`/proc/${pid}/status`);
  const kb = (k: string) => Number(status.match(new RegExp(`^${k}:\\s+(\\d+)`, "m"))?.[1] ?? 0) / 1024;
  return { cpuS, rssMiB: kb("VmRSS"), hwmMiB: kb("VmHWM") };
}

async function apiServerPid(api: KubeApiServer): Promise<number> {
  const pids = (await sh("ip", ["netns", "pids", api.netns])).split(/\s+/).filter(Boolean).map(Number);
  for (const pid of pids) {
    try {
      if (Deno.readTextFileSync(`/proc/${pid}/comm`).trim() === "kube-apiserver") return pid;
    } catch { /* gone */ }
  }
  throw new Error("kube-apiserver process not found");
}

/** Prometheus text → sums of a metric's samples matching label filters. */
function metricSum(text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name + "{") && !line.startsWith(name + " ")) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) {
      sum += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return sum;
}

async function rxBytes(ns: string): Promise<number> {
  return Number(
    (await sh("ip", ["netns", "exec", ns, "cat", "/sys/class/net/k8s0/statistics/rx_bytes"])).trim(),
  );
}

function agentArgs(kind: AgentKind, kubeconfig: string, node: string): string[] {
  const common = [
    `--kubeconfig=${kubeconfig}`,
    `--hostname-override=${node}`,
    "--proxy-mode=iptables",
    `--v=${Deno.env.get("DKP_AC_V") ?? "1"}`,
    "--conntrack-max-per-core=0",
    "--metrics-bind-address=127.0.0.1:10249",
    "--iptables-min-sync-period=1s",
  ];
  if (kind === "upstream") {
    return [k8sBinary("kube-proxy"), ...common, "--healthz-bind-address=127.0.0.1:10256"];
  }
  const extra = kind === "ours-watchlist"
    ? ["--feature-gates=WatchListClient=true"]
    : kind === "ours-json"
    ? ["--kube-api-content-type=application/json"]
    : [];
  return startCommand([...common, ...extra]);
}

/** Runs the whole measurement; returns one result per kind. */
export async function runApiCost(o: ApiCostOptions): Promise<KindResult[]> {
  const work = await Deno.makeTempDir({ prefix: "dkp-apicost-" });
  const wrapDir = `${work}/bin`;
  await Deno.mkdir(wrapDir);
  for (const name of WRAPPED) await Deno.writeTextFile(`${wrapDir}/${name}`, WRAPPER, { mode: 0o755 });
  if (o.kinds.some((k) => k !== "upstream")) {
    // The agents start in namespaces without DNS: their npm modules must be in Deno's cache beforehand.
    const c = await new Deno.Command(Deno.execPath(), { args: ["cache", `${PROJECT_ROOT}main.ts`] }).output();
    if (!c.success) throw new Error(`deno cache main.ts failed: ${new TextDecoder().decode(c.stderr)}`);
  }
  const users = o.kinds.flatMap((k) => Array.from({ length: o.agents }, (_, i) => `${k}-${i}`));
  await Deno.writeTextFile(`${work}/audit-policy.yaml`, auditPolicy(users));
  const api = await KubeApiServer.start({
    tokenUsers: users,
    readyTimeoutMs: 120_000,
    extraArgs: [
      `--audit-policy-file=${work}/audit-policy.yaml`,
      `--audit-log-path=${work}/audit.log`,
      "--audit-log-maxsize=0",
    ],
  });
  const results: KindResult[] = [];
  try {
    await runWith(api, o, work, wrapDir, results);
  } finally {
    await api.stop();
    if (!o.verbose) await Deno.remove(work, { recursive: true }).catch(() => {});
    else log(true, "work directory kept:", work);
  }
  return results;
}

/**
 * Waits until the API server's watch caches of Services and EndpointSlices hold the load: a list at
 * resourceVersion=0 is answered from the watch cache once it is ready; a label selector that matches nothing
 * keeps the answers empty, so the wait leaves no list behind in the server's heap.
 */
async function watchCachesReady(api: KubeApiServer, services: number): Promise<void> {
  for (const path of ["/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"]) {
    await api.request("GET", `${path}?resourceVersion=0&limit=1&labelSelector=apicost-none%3Dx`);
  }
  // The count from etcd (a consistent read of one page with its remaining count) says the load is all there.
  const r = await api.request("GET", `/api/v1/namespaces/${NS}/services?limit=1`) as {
    metadata?: { remainingItemCount?: number };
  };
  const n = 1 + (r.metadata?.remainingItemCount ?? 0);
  if (n < services) throw new Error(`after the restart ${n} Services, expected ${services}`);
}

async function runWith(
  api: KubeApiServer,
  o: ApiCostOptions,
  work: string,
  wrapDir: string,
  results: KindResult[],
): Promise<void> {
  let pid = await apiServerPid(api);
  const client = Deno.createHttpClient({
    caCerts: [api.caPem],
    cert: await Deno.readTextFile(`${api.dir}/admin.crt`),
    key: await Deno.readTextFile(`${api.dir}/admin.key`),
  });
  const metrics = async () => {
    const res = await fetch(`${api.localUrl}/metrics`, { client });
    return await res.text();
  };
  for (const kind of o.kinds) {
    await api.create({
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "ClusterRoleBinding",
      metadata: { name: `apicost-${kind}` },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node-proxier" },
      subjects: Array.from({ length: o.agents }, (_, i) => ({
        apiGroup: "rbac.authorization.k8s.io",
        kind: "User",
        name: `${kind}-${i}`,
      })),
    } as KubeObject);
  }
  for (let i = 0; i < o.agents; i++) {
    await api.create({
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: `node-${i}`, labels: { "kubernetes.io/hostname": `node-${i}` } },
      spec: {},
      // Both agents wait for the node's addresses (upstream gives up after 30 s).
      status: { addresses: [{ type: "InternalIP", address: `192.168.${100 + (i >> 8)}.${i & 255}` }] },
    } as KubeObject);
  }
  await api.create({ apiVersion: "v1", kind: "Namespace", metadata: { name: NS } } as KubeObject);
  const loadStart = performance.now();
  await pool(o.services, o.concurrency, async (i) => {
    await api.create(service(i));
    await api.create(slice(i, o.endpoints));
  });
  log(
    o.verbose,
    `loaded ${o.services} Services × ${o.endpoints} in ${
      ((performance.now() - loadStart) / 1000).toFixed(1)
    } s`,
  );
  const gen = new Map<number, number>();
  let seq = 0;
  // Each group starts at once and shares one churn: one kind per group, or every kind (--together).
  // With several rounds the kinds' order is reversed every other round, on the same loaded API server.
  const groups: { round: number; kinds: AgentKind[] }[] = [];
  for (let round = 0; round < o.rounds; round++) {
    const kinds = round % 2 === 0 ? o.kinds : [...o.kinds].reverse();
    if (o.together) groups.push({ round, kinds });
    else for (const k of kinds) groups.push({ round, kinds: [k] });
  }
  for (const { round, kinds: group } of groups) {
    if (o.freshApiServer) {
      const awayMs = await api.restart();
      pid = await apiServerPid(api);
      await watchCachesReady(api, o.services);
      log(
        o.verbose,
        `kube-apiserver restarted for round ${round} (${group.join(",")}), away ${awayMs.toFixed(0)} ms`,
      );
    }
    const rs = group.map((kind): KindResult => ({
      kind,
      round,
      agents: o.agents,
      agentsTogether: o.agents * group.length,
      firstSyncS: [],
      startBytes: [],
      churnBytes: [],
      startRequests: [],
      churnRequests: [],
      churnRequestsPerWindow: [],
      sampleURIs: [],
      apiCpuStartS: 0,
      apiCpuChurnS: 0,
      apiRssBeforeMiB: 0,
      apiRssPeakMiB: 0,
      listLatencyS: null,
      getLatencyS: null,
      churnWatchEvents: 0,
      loadAvg: "",
      errors: [],
    }));
    results.push(...rs);
    /** Every agent of the group: its kind, index within the kind, result and API user. */
    const agents = group.flatMap((kind, g) =>
      Array.from({ length: o.agents }, (_, i) => {
        const user = `${kind}-${i}`;
        // Its files: one set per round (the wrapper's restore log and marker, the agent's log).
        return { kind, i, r: rs[g], user, files: `${work}/${round > 0 ? `${user}-r${round}` : user}` };
      })
    );
    const n = agents.length;
    /** Figures of the API server as a whole, shared by the group's kinds. */
    const shared = (set: (r: KindResult) => void) => rs.forEach(set);
    const nss: string[] = [];
    const procs: Deno.ChildProcess[] = [];
    const logs: string[] = [];
    try {
      for (const a of agents) {
        const ns = `dkp-${Deno.pid}-ac${seq++}`;
        await sh("ip", ["netns", "add", ns]);
        nss.push(ns);
        await sh("ip", ["-n", ns, "link", "set", "lo", "up"]);
        await api.attach(ns);
        logs.push(`${a.files}.restores`);
      }
      const kubeconfigs = await Promise.all(
        agents.map((a) => api.writeKubeconfig({ token: api.tokens.get(a.user) })),
      );
      // Let the server settle after the load or the previous kind.
      await new Promise((res) => setTimeout(res, 5000));
      const rx0 = await Promise.all(nss.map(rxBytes));
      const m0 = await metrics();
      await Deno.writeTextFile(`/proc/${pid}/clear_refs`, "5");
      const p0 = procStats(pid);
      shared((r) => r.apiRssBeforeMiB = p0.rssMiB);
      const tStart = Date.now();
      for (let j = 0; j < n; j++) {
        const cmd = agentArgs(agents[j].kind, kubeconfigs[j], `node-${agents[j].i}`);
        procs.push(
          new Deno.Command("ip", {
            args: [
              "netns",
              "exec",
              nss[j],
              "env",
              `PATH=${wrapDir}:${Deno.env.get("PATH")}`,
              `DKP_AC_LOG=${logs[j]}`,
              `XTABLES_LOCKFILE=${work}/xtables-${j}.lock`,
              ...cmd,
            ],
            stdin: "null",
            stdout: "null",
            stderr: "piped",
          }).spawn(),
        );
      }
      procs.forEach((p, j) => {
        const f = Deno.openSync(`${agents[j].files}.log`, {
          write: true,
          create: true,
          truncate: true,
        });
        p.stderr.pipeTo(f.writable).catch(() => {});
      });
      const synced: (number | null)[] = Array(n).fill(null);
      const exitCodes: (number | null)[] = Array(n).fill(null);
      procs.forEach((p, j) => p.status.then((s) => exitCodes[j] = s.code));
      const deadline = tStart + o.timeout * 1000;
      while (synced.some((s) => s === null) && Date.now() < deadline) {
        await new Promise((res) => setTimeout(res, 250));
        for (let j = 0; j < n; j++) {
          if (synced[j] !== null) continue;
          if (exitCodes[j] !== null) {
            // An agent that exited before its first sync will not sync: say why instead of waiting it out.
            const tail = (await Deno.readTextFile(`${agents[j].files}.log`).catch(() => ""))
              .split("\n").slice(-15).join("\n");
            throw new Error(
              `${agents[j].user} exited (code ${exitCodes[j]}) before its first sync:\n${tail}`,
            );
          }
          let text = "";
          try {
            text = await Deno.readTextFile(logs[j]);
          } catch { /* not yet */ }
          for (const line of text.split("\n")) {
            const [ns, name, count] = line.split(" ");
            if (name?.startsWith("iptables") && Number(count) >= o.services) {
              synced[j] = (Number(ns) / 1e6 - tStart) / 1000;
              break;
            }
          }
        }
      }
      for (const r of rs) {
        r.firstSyncS = synced.filter((_, j) => agents[j].r === r);
        const missing = r.firstSyncS.filter((s) => s === null).length;
        if (missing) r.errors.push(`${missing} agents did not sync`);
        log(o.verbose, `${r.kind}: synced`, r.firstSyncS.map((s) => s?.toFixed(1)).join(" "));
      }
      await new Promise((res) => setTimeout(res, o.settle * 1000));
      const tChurn = Date.now();
      const p1 = procStats(pid);
      shared((r) => {
        r.apiCpuStartS = p1.cpuS - p0.cpuS;
        r.apiRssPeakMiB = p1.hwmMiB;
      });
      const rx1 = await Promise.all(nss.map(rxBytes));
      const m1 = await metrics();
      const lat = (verb: string) => {
        const c = metricSum(m1, "apiserver_request_duration_seconds_count", { verb }) -
          metricSum(m0, "apiserver_request_duration_seconds_count", { verb });
        const s = metricSum(m1, "apiserver_request_duration_seconds_sum", { verb }) -
          metricSum(m0, "apiserver_request_duration_seconds_sum", { verb });
        return c > 0 ? s / c : null;
      };
      shared((r) => {
        r.listLatencyS = lat("LIST");
        r.getLatencyS = lat("GET");
      });
      // Churn: replace one endpoint of a random slice, `churn` times a second.
      const rand = mulberry(7);
      const churnEnd = tChurn + o.duration * 1000;
      let k = 0;
      while (Date.now() < churnEnd) {
        const due = tChurn + (k * 1000) / o.churn;
        if (due > Date.now()) await new Promise((res) => setTimeout(res, due - Date.now()));
        const i = Math.floor(rand() * o.services);
        const g = (gen.get(i) ?? 0) + 1;
        gen.set(i, g);
        await api.patch(
          { apiVersion: "discovery.k8s.io/v1", kind: "EndpointSlice", namespace: NS, name: `svc-${i}-abcde` },
          { endpoints: (slice(i, o.endpoints, g) as unknown as { endpoints: unknown[] }).endpoints },
        ).catch((e) => rs[0].errors.push(String(e)));
        k++;
      }
      const p2 = procStats(pid);
      const rx2 = await Promise.all(nss.map(rxBytes));
      const m2 = await metrics();
      const loadAvg = (await Deno.readTextFile("/proc/loadavg")).split(" ").slice(0, 3).join(" ");
      shared((r) => {
        r.apiCpuChurnS = p2.cpuS - p1.cpuS;
        r.churnWatchEvents = metricSum(m2, "apiserver_watch_events_total") -
          metricSum(m1, "apiserver_watch_events_total");
        r.loadAvg = loadAvg;
      });
      for (const p of procs) p.kill("SIGTERM");
      // Agents get 15 s to exit after SIGTERM; one that does not is killed and reported.
      const exited = await Promise.all(
        procs.map((p) =>
          Promise.race([
            p.status.then(() => true),
            new Promise<boolean>((res) => setTimeout(() => res(false), 15_000)),
          ])
        ),
      );
      exited.forEach((ok, j) => {
        if (ok) return;
        agents[j].r.errors.push(`${agents[j].user}: did not exit within 15 s of SIGTERM`);
        try {
          procs[j].kill("SIGKILL");
        } catch { /* gone */ }
      });
      await Promise.all(procs.map((p) => p.status));
      // Let the audit backend flush the watches' ResponseComplete events.
      await new Promise((res) => setTimeout(res, 2000));
      const audit = await readAudit(`${work}/audit.log`);
      const windowMs = o.window * 1000;
      for (let j = 0; j < n; j++) {
        const { r, i, user, files } = agents[j];
        // Agents of earlier rounds used the same users.
        const mine = audit.filter((e) => e.user === user && e.t >= tStart);
        r.startBytes.push(rx1[j] - rx0[j]);
        r.churnBytes.push(rx2[j] - rx1[j]);
        r.startRequests.push(countVerbs(mine.filter((e) => e.t < tChurn)));
        const churn = mine.filter((e) => e.t >= tChurn && e.t < churnEnd);
        r.churnRequests.push(countVerbs(churn));
        r.churnRequestsPerWindow.push(
          Array.from(
            { length: Math.ceil((churnEnd - tChurn) / windowMs) },
            (_, w) => churn.filter((e) => Math.floor((e.t - tChurn) / windowMs) === w).length,
          ),
        );
        if (i === 0) r.sampleURIs = mine.slice(0, 12).map((e) => `${e.verb} ${e.uri}`);
        if (synced[j] === null) {
          r.errors.push(`${user}: ${(await Deno.readTextFile(`${files}.log`)).slice(-1500)}`);
        }
      }
    } finally {
      for (const p of procs) {
        try {
          p.kill("SIGKILL");
        } catch { /* gone */ }
      }
      for (const ns of nss) await sh("ip", ["netns", "del", ns]).catch(() => {});
    }
  }
  client.close();
}

interface AuditEvent {
  user: string;
  verb: string;
  uri: string;
  /** requestReceivedTimestamp, ms since the epoch. */
  t: number;
}

async function readAudit(path: string): Promise<AuditEvent[]> {
  const out: AuditEvent[] = [];
  for (const line of (await Deno.readTextFile(path)).split("\n")) {
    if (!line) continue;
    const e = JSON.parse(line);
    if (e.stage !== "ResponseComplete" && e.stage !== "Panic") continue;
    out.push({
      user: e.user?.username ?? "",
      verb: e.verb,
      uri: e.requestURI,
      t: Date.parse(e.requestReceivedTimestamp),
    });
  }
  return out;
}

function countVerbs(evs: AuditEvent[]): Verbs {
  const v: Verbs = {};
  for (const e of evs) {
    const key = e.verb === "watch" && /sendInitialEvents=true/.test(e.uri) ? "watchlist" : e.verb;
    v[key] = (v[key] ?? 0) + 1;
  }
  return v;
}

function mulberry(seed: number): () => number {
  let s = seed | 0;
  return () => {
    s = (s + 0x6d2b79f5) | 0;
    let t = Math.imul(s ^ (s >>> 15), 1 | s);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function median(xs: number[]): number | null {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

function fmtVerbs(vs: Verbs[]): string {
  const total: Verbs = {};
  for (const v of vs) for (const [k, n] of Object.entries(v)) total[k] = (total[k] ?? 0) + n;
  return Object.entries(total).sort().map(([k, n]) => `${k} ${(n / vs.length).toFixed(1)}`).join(", ");
}

/** The side-by-side table (per agent start, per agent over the churn, API server), ratios against upstream. */
export function table(o: ApiCostOptions, rs: KindResult[]): string {
  const up = rs.find((r) => r.kind === "upstream");
  const mib = (b: number | null) => b === null ? "-" : (b / 1048576).toFixed(2);
  const rows: [string, (r: KindResult) => number | null, (v: number | null) => string][] = [
    ["bytes received per agent start (MiB, median)", (r) => median(r.startBytes), mib],
    ["first full sync (s, median)", (r) => median(r.firstSyncS.filter((x): x is number => x !== null)), f1],
    ["first full sync (s, slowest)", (r) => Math.max(...r.firstSyncS.map((x) => x ?? Infinity)), f1],
    ["API server CPU per agent start (s)", (r) => r.apiCpuStartS / r.agentsTogether, f2],
    [
      "API server peak RSS growth per agent start (MiB)",
      (r) => (r.apiRssPeakMiB - r.apiRssBeforeMiB) / r.agentsTogether,
      f2,
    ],
    ["API server mean LIST latency during the start (s)", (r) => r.listLatencyS, f2],
    ["bytes received per agent over the churn (MiB, median)", (r) => median(r.churnBytes), mib],
    ["requests per agent over the churn", (r) => total(r.churnRequests) / r.agents, f1],
    ["API server CPU over the churn (s)", (r) => r.apiCpuChurnS, f1],
  ];
  const lines = [
    `${o.agents} agents per kind started at once${
      o.together ? ", every kind together (API server figures are the group's)" : ""
    }; ${o.services} Services × ${o.endpoints} endpoints; churn ${o.churn} slice updates/s for ${o.duration} s`,
    "",
    `| | ${rs.map((r) => r.kind).join(" | ")} |${
      up ? rs.filter((r) => r !== up).map((r) => ` ${r.kind} / upstream |`).join("") : ""
    }`,
    `|---|${rs.map(() => "---|").join("")}${up ? rs.filter((r) => r !== up).map(() => "---|").join("") : ""}`,
  ];
  for (const [label, get, fmt] of rows) {
    const vals = rs.map(get);
    const u = up ? get(up) : null;
    // With `together` the API server's figures belong to the whole group: no ratio.
    const groupFigure = o.together && label.startsWith("API server");
    const ratios = up
      ? rs.filter((r) => r !== up).map((r) => {
        if (groupFigure) return " - |";
        const v = get(r);
        return v !== null && u ? ` ${(v / u).toFixed(2)} |` : " - |";
      }).join("")
      : "";
    lines.push(`| ${label} | ${vals.map(fmt).join(" | ")} |${ratios}`);
  }
  lines.push(`| requests per agent start | ${rs.map((r) => fmtVerbs(r.startRequests)).join(" | ")} |`);
  lines.push(
    `| requests per agent over the churn | ${rs.map((r) => fmtVerbs(r.churnRequests)).join(" | ")} |`,
  );
  lines.push(
    `| requests per agent in each ${o.window} s of the churn | ${
      rs.map((r) => perWindow(r.churnRequestsPerWindow).join(" ")).join(" | ")
    } |`,
  );
  lines.push(
    `| API server RSS before the start (MiB) | ${rs.map((r) => r.apiRssBeforeMiB.toFixed(0)).join(" | ")} |`,
  );
  lines.push(`| load average after the kind | ${rs.map((r) => r.loadAvg).join(" | ")} |`);
  return lines.join("\n");
}

/**
 * Per round, every kind's first full sync (median over the round's agents), API server CPU and peak RSS growth
 * per agent start, with the ratios to upstream and their medians over the rounds (the API server's heap depends
 * on which kind ran before it, so its figures are worth reading in both orders).
 */
export function roundsTable(rs: KindResult[]): string {
  const sync = (r: KindResult) => median(r.firstSyncS.filter((x): x is number => x !== null));
  return [
    perRound(rs, "first full sync (s)", sync, f1),
    perRound(rs, "API server CPU per agent start (s)", (r) => r.apiCpuStartS / r.agentsTogether, f2),
    perRound(
      rs,
      "API server peak RSS growth per agent start (MiB)",
      (r) => (r.apiRssPeakMiB - r.apiRssBeforeMiB) / r.agentsTogether,
      f2,
    ),
  ].join("\n\n");
}

/** One figure of {@linkcode roundsTable}: a row per round, then the medians. */
function perRound(
  rs: KindResult[],
  title: string,
  get: (r: KindResult) => number | null,
  fmt: (v: number | null) => string,
): string {
  const kinds = [...new Set(rs.map((r) => r.kind))];
  const up = kinds.includes("upstream") ? "upstream" : null;
  const others = kinds.filter((k) => k !== up);
  const lines = [
    `${title} per round`,
    "",
    `| round (order) | ${kinds.join(" | ")} |${up ? others.map((k) => ` ${k} / upstream |`).join("") : ""}`,
    `|---|${kinds.map(() => "---|").join("")}${up ? others.map(() => "---|").join("") : ""}`,
  ];
  const ratios = new Map<AgentKind, number[]>(others.map((k) => [k, []]));
  const byKind = new Map<AgentKind, number[]>(kinds.map((k) => [k, []]));
  for (const round of [...new Set(rs.map((r) => r.round))]) {
    const of = rs.filter((r) => r.round === round);
    const v = new Map(kinds.map((k) => {
      const r = of.find((x) => x.kind === k);
      return [k, r ? get(r) : null];
    }));
    for (const [k, x] of v) if (x !== null) byKind.get(k)!.push(x);
    const u = up ? v.get(up) : null;
    const cells = up
      ? others.map((k) => {
        const x = v.get(k);
        if (x === null || x === undefined || !u) return " - |";
        ratios.get(k)!.push(x / u);
        return ` ${(x / u).toFixed(2)} |`;
      }).join("")
      : "";
    lines.push(
      `| ${round} (${of.map((r) => r.kind).join(", ")}) | ${
        kinds.map((k) => fmt(v.get(k) ?? null)).join(" | ")
      } |${cells}`,
    );
  }
  lines.push(
    `| median | ${kinds.map((k) => f2(median(byKind.get(k)!))).join(" | ")} |${
      up ? others.map((k) => ` ${f2(median(ratios.get(k)!))} |`).join("") : ""
    }`,
  );
  return lines.join("\n");
}

/** The mean over agents of each window's requests. */
function perWindow(vs: number[][]): string[] {
  if (vs.length === 0) return [];
  return vs[0].map((_, w) => (vs.reduce((s, v) => s + v[w], 0) / vs.length).toFixed(1));
}

function total(vs: Verbs[]): number {
  return vs.reduce((s, v) => s + Object.values(v).reduce((a, b) => a + b, 0), 0);
}
const f1 = (v: number | null) => v === null || !Number.isFinite(v) ? "-" : v.toFixed(1);
const f2 = (v: number | null) => v === null || !Number.isFinite(v) ? "-" : v.toFixed(2);

if (import.meta.main) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      services: { type: "string", default: "10000" },
      endpoints: { type: "string", default: "10" },
      agents: { type: "string", default: "10" },
      kinds: { type: "string", default: KINDS.join(",") },
      churn: { type: "string", default: "20" },
      duration: { type: "string", default: "60" },
      window: { type: "string", default: "600" },
      together: { type: "boolean", default: false },
      settle: { type: "string", default: "5" },
      timeout: { type: "string", default: "600" },
      concurrency: { type: "string", default: "16" },
      rounds: { type: "string", default: "1" },
      "fresh-apiserver": { type: "boolean", default: false },
      verbose: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
    },
  });
  const o: ApiCostOptions = {
    services: Number(values.services),
    endpoints: Number(values.endpoints),
    agents: Number(values.agents),
    kinds: values.kinds.split(",") as AgentKind[],
    churn: Number(values.churn),
    duration: Number(values.duration),
    window: Number(values.window),
    together: values.together,
    settle: Number(values.settle),
    timeout: Number(values.timeout),
    concurrency: Number(values.concurrency),
    rounds: Number(values.rounds),
    freshApiServer: values["fresh-apiserver"],
    verbose: values.verbose,
  };
  for (const k of o.kinds) if (!KINDS.includes(k)) throw new Error(`unknown kind ${k}`);
  const rs = await runApiCost(o);
  console.log(table(o, rs.filter((r) => r.round === 0)));
  if (o.rounds > 1) console.log(`\n${roundsTable(rs)}`);
  for (const r of rs) {
    console.log(`\n${r.kind}: agent 0's requests:\n  ${r.sampleURIs.join("\n  ")}`);
    if (r.errors.length) console.log(`${r.kind} errors:\n${r.errors.join("\n").slice(0, 4000)}`);
  }
  if (values.json) console.log(JSON.stringify(rs));
}
