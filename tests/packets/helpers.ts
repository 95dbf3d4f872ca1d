/**
 * Builders for the Kubernetes objects the dataplane tests feed the simulator, and polling helpers.
 * @module
 */

import type { EndpointSlice, Node, Service, ServicePort } from "../../lib/kube/types.ts";
import { agentCommand } from "../../testkit/agent_command.ts";
import type { Sandbox, SandboxProcess } from "../../testkit/sandbox.ts";

/** The test namespace of every object. */
export const NS = "dp";

/** A Service port as tests write it: `targetPort` defaults to 8080 (TCP) or 8081 (UDP). */
export interface PortSpec {
  name?: string;
  port: number;
  protocol?: "TCP" | "UDP";
  nodePort?: number;
}

/** What a test says about a Service; everything else gets the API server's defaults. */
export interface ServiceSpecLite {
  name: string;
  clusterIP: string;
  type?: "ClusterIP" | "NodePort" | "LoadBalancer";
  ports?: PortSpec[];
  externalIPs?: string[];
  lbIPs?: string[];
  sourceRanges?: string[];
  affinitySeconds?: number;
  eTPLocal?: boolean;
  iTPLocal?: boolean;
  healthCheckNodePort?: number;
  /** Every cluster IP, primary first (dual stack); default `[clusterIP]`. */
  clusterIPs?: string[];
  /** Default `["IPv4"]`. */
  ipFamilies?: ("IPv4" | "IPv6")[];
  /** Default `SingleStack`. */
  ipFamilyPolicy?: "SingleStack" | "PreferDualStack" | "RequireDualStack";
}

/** A v1 Service in namespace {@linkcode NS}. */
export function service(s: ServiceSpecLite): Service {
  const type = s.type ?? "ClusterIP";
  const ports: ServicePort[] = (s.ports ?? [{ name: "p", port: 80 }]).map((p) => ({
    name: p.name ?? "p",
    port: p.port,
    protocol: p.protocol ?? "TCP",
    targetPort: (p.protocol ?? "TCP") === "UDP" ? 8081 : 8080,
    ...(p.nodePort ? { nodePort: p.nodePort } : {}),
  }));
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { namespace: NS, name: s.name, uid: `uid-${s.name}` },
    spec: {
      type,
      clusterIP: s.clusterIP,
      clusterIPs: s.clusterIPs ?? [s.clusterIP],
      ipFamilies: s.ipFamilies ?? ["IPv4"],
      ipFamilyPolicy: s.ipFamilyPolicy ?? "SingleStack",
      ports,
      selector: { app: s.name },
      externalIPs: s.externalIPs,
      loadBalancerSourceRanges: s.sourceRanges,
      sessionAffinity: s.affinitySeconds ? "ClientIP" : "None",
      ...(s.affinitySeconds
        ? { sessionAffinityConfig: { clientIP: { timeoutSeconds: s.affinitySeconds } } }
        : {}),
      ...(type !== "ClusterIP" ? { externalTrafficPolicy: s.eTPLocal ? "Local" : "Cluster" } : {}),
      internalTrafficPolicy: s.iTPLocal ? "Local" : "Cluster",
      ...(s.healthCheckNodePort ? { healthCheckNodePort: s.healthCheckNodePort } : {}),
    },
    status: s.lbIPs ? { loadBalancer: { ingress: s.lbIPs.map((ip) => ({ ip, ipMode: "VIP" })) } } : {},
  };
}

/** One endpoint: a pod IP and the node it runs on. */
export interface EndpointLite {
  ip: string;
  node: string;
  ready?: boolean;
  terminating?: boolean;
}

/** Options of {@linkcode endpointSlice} beyond the endpoints and ports. */
export interface EndpointSliceOptions {
  /** Default `IPv4`. */
  addressType?: "IPv4" | "IPv6";
  /** The slice's name; default `<service>-1`. */
  name?: string;
}

/**
 * The EndpointSlice `<service>-1` (or `opts.name`) of a Service whose ports are `ports` (same names as
 * {@linkcode service}).
 */
export function endpointSlice(
  svc: string,
  eps: EndpointLite[],
  ports: PortSpec[] = [{ port: 80 }],
  opts: EndpointSliceOptions = {},
): EndpointSlice {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      namespace: NS,
      name: opts.name ?? `${svc}-1`,
      labels: { "kubernetes.io/service-name": svc, "endpointslice.kubernetes.io/managed-by": "dp-test" },
    },
    addressType: opts.addressType ?? "IPv4",
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      nodeName: e.node,
      conditions: { ready: e.ready ?? true, serving: e.ready ?? true, terminating: e.terminating ?? false },
    })),
    ports: ports.map((p) => ({
      name: p.name ?? "p",
      protocol: p.protocol ?? "TCP",
      port: (p.protocol ?? "TCP") === "UDP" ? 8081 : 8080,
    })),
  };
}

/** A Node with one InternalIP and a pod CIDR. */
export function nodeObject(name: string, ip: string, podCIDR: string): Node {
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: { name, labels: { "kubernetes.io/hostname": name } },
    spec: { podCIDR, podCIDRs: [podCIDR] },
    status: { addresses: [{ type: "InternalIP", address: ip }, { type: "Hostname", address: name }] },
  };
}

/** A dual-stack Node: one InternalIP and one pod CIDR per family, primary family first. */
export function dualStackNodeObject(name: string, ips: string[], podCIDRs: string[]): Node {
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: { name, labels: { "kubernetes.io/hostname": name } },
    spec: { podCIDR: podCIDRs[0], podCIDRs },
    status: {
      addresses: [
        ...ips.map((address) => ({ type: "InternalIP", address })),
        { type: "Hostname", address: name },
      ],
    },
  };
}

/** Sleeps `ms` milliseconds. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Calls `fn` until it returns a value other than undefined (and does not throw), every `intervalMs`;
 * rejects after `timeoutMs` with the last error or `what`.
 */
export async function eventually<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  timeoutMs = 10_000,
  intervalMs = 100,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (true) {
    try {
      const v = await fn();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${last}` : ""}`);
    }
    await sleep(intervalMs);
  }
}

/** Counts occurrences of each string. */
export function tally(names: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const n of names) out[n] = (out[n] ?? 0) + 1;
  return out;
}

/**
 * The KUBE-SVC-/KUBE-SEP- lines (chain declarations and rules, every line that names such a chain) of an
 * `iptables-save` output, counters removed, so that two dumps compare equal exactly when those rules are.
 */
export function serviceChainLines(save: string): string[] {
  return save.split("\n")
    .filter((l) => /KUBE-(SVC|SEP)-/.test(l))
    .map((l) => l.replace(/\s*\[\d+:\d+\]/g, "").trimEnd());
}

/** Options of {@linkcode startSandboxAgent}. */
export interface SandboxAgentOptions {
  /** Node name (`--hostname-override`). */
  nodeName: string;
  /** `--cluster-cidr` (comma-separated for dual-stack). @default "10.244.0.0/16" */
  clusterCIDR?: string;
  /** `--iptables-sync-period` in seconds (the sync period of iptables and nftables mode). @default 5 */
  syncPeriodS?: number;
  /** `--proxy-mode`. @default "iptables" */
  mode?: "iptables" | "nftables" | "ipvs";
  /** More flags. */
  extraArgs?: string[];
  /** A directory put first on the agent's PATH (tool wrappers of a test; see refusingToolWrappers). */
  pathPrefix?: string;
  /** What `$DKP_EXTRA_PERMISSIONS` expands to (e.g. `--allow-ffi` for `--nftables-netlink`). */
  extraPermissions?: string[];
}

/**
 * Starts the real agent in the sandbox's node namespace, with the `start` task's exact permissions, against
 * the simulator behind `kubeconfig`: no min sync period, `-v=2`, and nf_conntrack_max left alone (it is not
 * per namespace, so a test must not change the host's).
 */
export function startSandboxAgent(
  sb: Sandbox,
  kubeconfig: string,
  opts: SandboxAgentOptions,
): SandboxProcess {
  const [cmd, ...args] = agentCommand(["--kubeconfig", kubeconfig, ...sandboxAgentFlags(opts)], {
    ...(opts.extraPermissions ? { extraPermissions: opts.extraPermissions } : {}),
  });
  if (opts.pathPrefix) {
    // Deno resolves the names in --allow-run on PATH, so the wrappers are what the agent may run and runs.
    return sb.spawn(sb.node, "env", [
      `PATH=${opts.pathPrefix}:${Deno.env.get("PATH") ?? "/usr/sbin:/usr/bin"}`,
      cmd,
      ...args,
    ]);
  }
  return sb.spawn(sb.node, cmd, args);
}

/** The flags {@linkcode startSandboxAgent} gives the agent besides `--kubeconfig` (render takes the same). */
export function sandboxAgentFlags(opts: SandboxAgentOptions): string[] {
  return [
    "--hostname-override",
    opts.nodeName,
    `--cluster-cidr=${opts.clusterCIDR ?? "10.244.0.0/16"}`,
    `--proxy-mode=${opts.mode ?? "iptables"}`,
    ...(opts.mode === "ipvs"
      ? [`--ipvs-sync-period=${opts.syncPeriodS ?? 5}s`, "--ipvs-min-sync-period=0s"]
      : [`--iptables-sync-period=${opts.syncPeriodS ?? 5}s`, "--iptables-min-sync-period=0s"]),
    "--conntrack-max-per-core=0",
    "-v=2",
    ...(opts.extraArgs ?? []),
  ];
}

/**
 * Fault injection for the isolation test: a directory of wrappers, one per tool in `tools` found on PATH, that
 * refuse (exit 1, a message on stderr) any input on stdin containing `marker` and pass everything else to the
 * real tool unchanged. The refusal is the only pretend part: the rest of every sync reaches the real kernel.
 * Whatever the arguments: the check forms (`iptables-restore --test`, `nft -c`/`--check`) are refused alike.
 */
export async function refusingToolWrappers(tools: readonly string[], marker: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "dkp-refusing-tools-" });
  for (const tool of tools) {
    const which = await new Deno.Command("sh", { args: ["-c", `command -v ${tool}`] }).output();
    const real = new TextDecoder().decode(which.stdout).trim();
    if (which.code !== 0 || real === "") continue;
    const script = `#!/bin/sh
tmp=$(mktemp)
cat > "$tmp"
if grep -qF '${marker}' "$tmp"; then
  rm -f "$tmp"
  echo "${tool}: injected refusal of ${marker} (test fault injection)" >&2
  exit 1
fi
"${real}" "$@" < "$tmp"
rc=$?
rm -f "$tmp"
exit $rc
`;
    await Deno.writeTextFile(`${dir}/${tool}`, script);
    await Deno.chmod(`${dir}/${tool}`, 0o755);
  }
  return dir;
}
