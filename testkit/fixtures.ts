/**
 * Test helpers: build ServicePortState objects the way the proxy core would (with a small CategorizeEndpoints
 * good enough for these fixtures), a recording runner that answers sysctl / iptables-save, and a port of
 * upstream's `sortIPTablesRules` from proxier_test.go.
 * @module
 */

import { type RecordedCall, RecordingCommandRunner } from "../lib/exec.ts";
import type {
  EndpointInfo,
  IPFamily,
  Protocol,
  ProxySnapshot,
  ServicePortInfo,
  ServicePortState,
} from "../lib/proxy/types.ts";
import { servicePortNameString } from "../lib/proxy/types.ts";

export const TEST_NODE = "test-node";

export interface SvcSpec {
  ns: string;
  name: string;
  port?: string;
  protocol?: Protocol;
  clusterIP: string;
  portNum?: number;
  nodePort?: number;
  externalIPs?: string[];
  lbVIPs?: string[];
  sourceRanges?: string[];
  affinity?: number;
  eTPLocal?: boolean;
  iTPLocal?: boolean;
  hcnp?: number;
}

export interface EpSpec {
  ip: string;
  port?: number;
  local?: boolean;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
}

export function ep(e: EpSpec): EndpointInfo {
  const port = e.port ?? 80;
  return {
    ip: e.ip,
    port,
    endpoint: e.ip.includes(":") ? `[${e.ip}]:${port}` : `${e.ip}:${port}`,
    isLocal: e.local ?? false,
    ready: e.ready ?? true,
    serving: e.serving ?? e.ready ?? true,
    terminating: e.terminating ?? false,
    zoneHints: null,
    nodeHints: null,
    nodeName: e.local ? TEST_NODE : "",
    zone: "",
  };
}

/** Upstream CategorizeEndpoints without topology. */
export function makeState(s: SvcSpec, eps: EpSpec[]): ServicePortState {
  const protocol = s.protocol ?? "TCP";
  const name = { namespace: s.ns, name: s.name, port: s.port ?? "p80", protocol };
  const info: ServicePortInfo = {
    name,
    nameString: servicePortNameString(name),
    serviceKey: `${s.ns}/${s.name}`,
    clusterIP: s.clusterIP,
    port: s.portNum ?? 80,
    protocol,
    nodePort: s.nodePort ?? 0,
    externalIPs: s.externalIPs ?? [],
    loadBalancerVIPs: s.lbVIPs ?? [],
    loadBalancerSourceRanges: s.sourceRanges ?? [],
    stickyMaxAgeSeconds: s.affinity ?? 0,
    externalPolicyLocal: s.eTPLocal ?? false,
    internalPolicyLocal: s.iTPLocal ?? false,
    // As lib/proxy/service_port.ts (upstream's NeedsHealthCheck gate on HealthCheckNodePort()): the spec value
    // counts only with eTP=Local. Upstream's TestOverallIPTablesRules gives the eTP=Cluster svc5 one too.
    healthCheckNodePort: s.eTPLocal ? s.hcnp ?? 0 : 0,
  };
  const endpoints = eps.map(ep).sort((
    a,
    b,
  ) => (a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0));
  const extAccessible = info.nodePort !== 0 || info.externalIPs.length > 0 ||
    info.loadBalancerVIPs.length > 0;
  const extLocal = info.externalPolicyLocal && extAccessible;
  const usesCluster = !info.internalPolicyLocal || extAccessible;
  const usesLocal = info.internalPolicyLocal || extLocal;
  let cluster: EndpointInfo[] | null = null, local: EndpointInfo[] | null = null;
  if (usesCluster) {
    cluster = endpoints.filter((e) => e.ready);
    if (cluster.length === 0) cluster = endpoints.filter((e) => e.serving && e.terminating);
  }
  if (usesLocal) {
    local = endpoints.filter((e) => e.isLocal && e.ready);
    if (local.length === 0) local = endpoints.filter((e) => e.isLocal && e.serving && e.terminating);
  }
  const all = new Map<string, EndpointInfo>();
  for (const e of [...(cluster ?? []), ...(local ?? [])]) all.set(e.endpoint, e);
  const allReachableEndpoints = [...all.values()].sort((a, b) =>
    a.endpoint < b.endpoint ? -1 : a.endpoint > b.endpoint ? 1 : 0
  );
  const hasAnyEndpoints = (cluster?.length ?? 0) > 0 || (local?.length ?? 0) > 0 ||
    (!usesCluster && endpoints.some((e) => e.ready || (e.serving && e.terminating)));
  return {
    info,
    endpoints,
    selection: { clusterEndpoints: cluster, localEndpoints: local, allReachableEndpoints, hasAnyEndpoints },
  };
}

export function snapshot(
  states: ServicePortState[],
  opts: { family?: IPFamily; changed?: string[] | null; nodeIPs?: string[] } = {},
): ProxySnapshot {
  const m = new Map<string, ServicePortState>();
  let total = 0;
  for (const s of states) {
    m.set(s.info.nameString, s);
    total += s.endpoints.length;
  }
  return {
    family: opts.family ?? "IPv4",
    servicePorts: m,
    changedServices: opts.changed === undefined ? null : opts.changed === null ? null : new Set(opts.changed),
    node: { name: TEST_NODE, ips: opts.nodeIPs ?? ["192.168.0.2"], labels: {} },
    totalEndpoints: total,
  };
}

/** A recorder answering sysctl be_liberal = 0 and empty iptables-save output. */
export function recorder(
  extra?: (c: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
) {
  return new RecordingCommandRunner((c) => {
    const r = extra?.(c);
    if (r) return r;
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: "0\n" };
    return undefined;
  });
}

/**
 * A recorder that remembers the jump rules (`-I CHAIN 1 ...`) of every restore and the chains and jumps created
 * with plain `iptables` calls, and shows them in later `iptables-save -t <table>` output, as the kernel would.
 * `state.drop(table, chain)` forgets a chain's jumps (an external `iptables -F INPUT`).
 */
export function jumpRecorder(
  extra?: (c: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
) {
  const tables: Record<string, { chains: Set<string>; rules: string[] }> = {
    filter: { chains: new Set(["INPUT", "FORWARD", "OUTPUT"]), rules: [] },
    nat: { chains: new Set(["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]), rules: [] },
  };
  const state = {
    tables,
    drop(table: string, chain: string) {
      tables[table].rules = tables[table].rules.filter((l) => !l.startsWith(`-A ${chain} `));
    },
  };
  const r = recorder((c) => {
    const e = extra?.(c);
    if (e) return e;
    if (c.cmd.endsWith("-save")) {
      const t = tables[c.args[1]];
      return {
        stdout: `*${c.args[1]}\n${[...t.chains].map((n) => `:${n} - [0:0]\n`).join("")}${
          t.rules.join("")
        }COMMIT\n`,
      };
    }
    if (c.cmd.endsWith("-restore")) {
      let table = "";
      for (const l of c.stdin.split("\n")) {
        if (l.startsWith("*")) table = l.slice(1);
        else if (l.startsWith(":") && tables[table]) tables[table].chains.add(l.slice(1, l.indexOf(" ")));
        else if (l.startsWith("-I ") && tables[table]) {
          tables[table].rules.unshift(l.replace(/^-I (\S+) 1 /, "-A $1 ") + "\n");
        }
      }
      return undefined;
    }
    if (/^ip6?tables/.test(c.cmd)) {
      const t = tables[c.args[c.args.indexOf("-t") + 1]];
      const i = c.args.indexOf("-N");
      if (i >= 0) t.chains.add(c.args[i + 1]);
      const j = c.args.indexOf("-I");
      if (j >= 0) t.rules.unshift(`-A ${c.args[j + 1]} ${c.args.slice(j + 3).join(" ")}\n`);
    }
    return undefined;
  });
  return { r, state };
}

/** Restore payloads handed to `cmd`. */
export function restores(r: RecordingCommandRunner, cmd = "iptables-restore"): string[] {
  return r.callsOf(cmd).map((c) => c.stdin);
}

// ---- port of upstream sortIPTablesRules ----

interface Table {
  name: string;
  chains: string[];
  rules: Map<string, string[]>;
}

function commentService(rule: string): string | null {
  const m = rule.match(/--comment (?:"([^"]*)"|(\S+))/);
  if (!m) return null;
  const v = m[1] ?? m[2];
  const i = v.search(/[ :]/);
  return i === -1 ? v : v.slice(0, i);
}

function chainOrder(a: string, b: string): number {
  const rank = (
    c: string,
  ) => (c === "KUBE-NODEPORTS" ? 0 : c === "KUBE-SERVICES" ? 1 : c.startsWith("KUBE-") ? 2 : 3);
  const ra = rank(a), rb = rank(b);
  if (ra !== rb) return ra - rb;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Sorts an iptables-restore payload like upstream's test helper (tables, chains, service-ordered rules). */
export function sortIPTablesRules(data: string): string {
  const tables: Table[] = [];
  let cur: Table | null = null;
  for (const line of data.split("\n")) {
    if (line.startsWith("*")) {
      cur = { name: line.slice(1), chains: [], rules: new Map() };
      tables.push(cur);
    } else if (line.startsWith(":")) {
      const c = line.slice(1).split(" ")[0];
      cur!.chains.push(c);
      cur!.rules.set(c, []);
    } else if (line.startsWith("-A ")) {
      const c = line.split(" ")[1];
      cur!.rules.get(c)!.push(line);
    }
  }
  tables.sort((a, b) => (a.name < b.name ? -1 : 1));
  let out = "";
  for (const t of tables) {
    t.chains.sort(chainOrder);
    const byName = (a: string, b: string) => {
      const x = commentService(a), y = commentService(b);
      if (x === null || y === null) return 0;
      return x < y ? -1 : x > y ? 1 : 0;
    };
    for (const c of ["KUBE-NODEPORTS", "KUBE-SERVICES"]) {
      const rs = t.rules.get(c);
      if (!rs) continue;
      rs.sort((a, b) => {
        if (t.name === "nat" && c === "KUBE-SERVICES") {
          if (a.includes("must be the last rule")) return 1;
          if (b.includes("must be the last rule")) return -1;
        }
        return byName(a, b);
      });
    }
    out += `*${t.name}\n`;
    for (const c of t.chains) out += `:${c} - [0:0]\n`;
    for (const c of t.chains) for (const r of t.rules.get(c)!) out += r + "\n";
    out += "COMMIT\n";
  }
  return out;
}

/** Removes our own additions upstream's payload does not have: canary chains, mangle table, -I jump lines. */
export function stripExtras(payload: string): string {
  const out: string[] = [];
  let skip = false;
  for (const line of payload.split("\n")) {
    if (line === "*mangle") skip = true;
    if (!skip && !line.includes("KUBE-PROXY-CANARY") && !line.startsWith("-I ") && !line.startsWith("-X ")) {
      out.push(line);
    }
    if (skip && line === "COMMIT") skip = false;
  }
  return out.join("\n");
}

export function dedent(s: string): string {
  const lines = s.replace(/^\n/, "").split("\n");
  const ind = Math.min(...lines.filter((l) => l.trim()).map((l) => l.match(/^\s*/)![0].length));
  return lines.map((l) => l.slice(ind)).join("\n").replace(/\s+$/, "\n");
}

/** The services and endpoints of upstream's TestOverallIPTablesRules. */
export function overallFixture() {
  return [
    makeState({ ns: "ns1", name: "svc1", clusterIP: "172.30.0.41" }, [{ ip: "10.180.0.1" }]),
    makeState({
      ns: "ns2",
      name: "svc2",
      clusterIP: "172.30.0.42",
      nodePort: 3001,
      lbVIPs: ["1.2.3.4"],
      externalIPs: ["192.168.99.22"],
      eTPLocal: true,
      hcnp: 30000,
    }, [{ ip: "10.180.0.2" }]),
    makeState({ ns: "ns3", name: "svc3", clusterIP: "172.30.0.43", nodePort: 3003 }, [{ ip: "10.180.0.3" }]),
    makeState({ ns: "ns4", name: "svc4", clusterIP: "172.30.0.44", externalIPs: ["192.168.99.33"] }, [
      { ip: "10.180.0.4" },
      { ip: "10.180.0.5", local: true },
    ]),
    makeState({
      ns: "ns5",
      name: "svc5",
      clusterIP: "172.30.0.45",
      nodePort: 3002,
      lbVIPs: ["5.6.7.8"],
      hcnp: 30000,
      sourceRanges: ["203.0.113.0/25"],
      affinity: 10800,
    }, [{ ip: "10.180.0.3" }]),
    makeState({ ns: "ns6", name: "svc6", clusterIP: "172.30.0.46" }, []),
  ];
}
