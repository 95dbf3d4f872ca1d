/**
 * The ipvs dataplane's drift check: cheap reads, polled every syncPeriod, that tell whether the kernel changed
 * behind the dataplane's back (so that the next sync must be full).
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { IPFamily } from "../../net/ip.ts";
import { DUMMY_INTERFACE, parseLocalAddresses } from "./addresses.ts";
import { setName } from "./ipsets.ts";
import type { KernelModel } from "./kernel_model.ts";

/** What {@linkcode driftReason} compares the kernel with. */
export interface DriftCheckInput {
  runner: CommandRunner;
  family: IPFamily;
  /** The backend's iptables program of the family. */
  iptables: string;
  kernel: KernelModel;
  /** The iptables payload last written (its KUBE-SERVICES rules are counted); null before the first. */
  lastIptables: string | null;
}

/**
 * Why the kernel no longer matches the model, or null when it seems to: node addresses (NodePort virtual
 * servers follow them), addresses on kube-ipvs0, one virtual server we programmed, the rule count of nat
 * KUBE-SERVICES, the member count of KUBE-CLUSTER-IP.
 */
export async function driftReason(input: DriftCheckInput): Promise<string | null> {
  const { runner, family, kernel } = input;
  const a = await runner.tryRun({ cmd: "ip", args: ["-j", "addr", "show"], timeoutMs: 30_000 });
  if (a.code !== 0) return `ip addr show failed: ${a.stderr.trim()}`;
  const addrs = parseLocalAddresses(a.stdout, family);
  if (!addrs.dummyExists) return `${DUMMY_INTERFACE} is gone`;
  if (addrs.others.join(",") !== kernel.nodeAddresses.join(",")) return "node addresses changed";
  if (addrs.dummy.size !== kernel.addrs.size || [...addrs.dummy].some((x) => !kernel.addrs.has(x))) {
    return `addresses on ${DUMMY_INTERFACE} changed`;
  }
  const first = kernel.virtualServers.keys().next();
  if (!first.done) {
    const r = await runner.tryRun({
      cmd: "ipvsadm",
      args: ["-L", "-n", ...first.value.split(" ")],
      timeoutMs: 30_000,
    });
    if (r.code !== 0) return `virtual server ${first.value} is gone`;
  }
  // Beyond upstream (whose every periodic sync is full): a firewall reload or `iptables -t nat -F
  // KUBE-SERVICES` shows as a rule count unlike the one written (the chain is a few rules in this mode).
  if (input.lastIptables !== null) {
    const want = countRules(input.lastIptables, "KUBE-SERVICES");
    const r = await runner.tryRun({
      cmd: input.iptables,
      args: ["-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"],
      timeoutMs: 30_000,
    });
    if (r.code !== 0) return `nat KUBE-SERVICES is gone: ${r.stderr.trim()}`;
    const have = countRules(r.stdout, "KUBE-SERVICES");
    if (have !== want) return `nat KUBE-SERVICES has ${have} rules, ${want} written`;
  }
  const set = setName("KUBE-CLUSTER-IP", family);
  const s = await runner.tryRun({ cmd: "ipset", args: ["list", "-t", set], timeoutMs: 30_000 });
  const m = s.stdout.match(/Number of entries: (\d+)/);
  if (s.code !== 0 || !m) return `ipset ${set} is gone`;
  if (Number(m[1]) !== kernel.sets.get("KUBE-CLUSTER-IP")!.size) return `ipset ${set} changed`;
  return null;
}

/** The number of `-A <chain> ` rules in iptables-save/-S text. */
export function countRules(text: string, chain: string): number {
  const prefix = `-A ${chain} `;
  let n = 0;
  for (const line of text.split("\n")) if (line.startsWith(prefix)) n++;
  return n;
}
