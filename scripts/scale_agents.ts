/**
 * The agents the scale harness can run on the same generated state: this one (`ours`, with the `start` task's
 * exact permission and V8 flags) and upstream kube-proxy (`upstream`, the binary scripts/build_k8s.sh builds).
 * Each gives the command line for a mode and backend; both run with the harness's iptables wrappers first in
 * PATH, so every kernel-side figure is measured the same way for both.
 *
 * Modes: iptables (legacy and nft backends) and nftables; what a change looks like in each mode's payloads is in
 * scale_probe.ts. ipvs would slot in the same way.
 * @module
 */
import { agentCommand as startCommand } from "../testkit/agent_command.ts";
import { k8sBinary } from "../testkit/kube_apiserver.ts";

/** Agents the harness knows: `ours-netlink` is this agent with `--nftables-netlink` (and `--allow-ffi`). */
export type AgentName = "ours" | "ours-netlink" | "upstream";

/** Every agent name, in the order the harness's help lists them. */
export const AGENT_NAMES: readonly AgentName[] = ["ours", "ours-netlink", "upstream"];
/** Proxy modes the harness can drive (with a kernel probe in scale_probe.ts). */
export type ScaleMode = "iptables" | "nftables";
/** iptables backends. */
export type Backend = "legacy" | "nft";

/** Where scripts/build_k8s.sh puts upstream kube-proxy (the reference release of testkit/kube_apiserver.ts). */
export const UPSTREAM_BINARY = k8sBinary("kube-proxy");

/** Everything an agent's command line depends on. */
export interface AgentSetup {
  kubeconfig: string;
  nodeName: string;
  mode: ScaleMode;
  /** --iptables-min-sync-period in seconds (the nftables mode's minSyncPeriod too, as upstream). */
  minSyncS: number;
  /** Metrics listen address inside the namespace. */
  metricsAddress: string;
  /** Upstream binary (default {@linkcode UPSTREAM_BINARY}). */
  upstreamBinary?: string;
}

/** The command line of an agent. */
export async function agentCommand(name: AgentName, s: AgentSetup): Promise<string[]> {
  const common = [
    `--kubeconfig=${s.kubeconfig}`,
    `--hostname-override=${s.nodeName}`,
    `--proxy-mode=${s.mode}`,
    "--v=2",
    "--conntrack-max-per-core=0",
    `--metrics-bind-address=${s.metricsAddress}`,
    `--iptables-min-sync-period=${s.minSyncS}s`,
  ];
  if (name === "ours") return startCommand([...common, "--logging-format=json"]);
  if (name === "ours-netlink") {
    return startCommand([...common, "--logging-format=json", "--nftables-netlink"], {
      extraPermissions: ["--allow-ffi"],
    });
  }
  const bin = s.upstreamBinary ?? UPSTREAM_BINARY;
  try {
    await Deno.stat(bin);
  } catch {
    throw new Error(`upstream kube-proxy not found at ${bin} (build it with scripts/build_k8s.sh)`);
  }
  // The simulator speaks JSON only: client-go would accept it for reads (it asks for protobuf, then JSON), but it
  // posts Events as protobuf, which the simulator cannot read; with JSON both directions work.
  return [
    bin,
    ...common,
    "--kube-api-content-type=application/json",
    "--healthz-bind-address=127.0.0.1:10256",
  ];
}

/** True when the upstream binary is there. */
export async function upstreamAvailable(bin = UPSTREAM_BINARY): Promise<boolean> {
  try {
    return (await Deno.stat(bin)).isFile;
  } catch {
    return false;
  }
}
