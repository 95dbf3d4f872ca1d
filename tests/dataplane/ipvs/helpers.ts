/** A fake kernel for the ipvs dataplane tests: answers the reads of a full sync and records the batches. */
import { type CommandRunner, type RecordedCall, RecordingCommandRunner } from "../../../lib/exec.ts";
import type { ProxyOptions } from "../../../lib/config/command.ts";
import { defaultConfiguration } from "../../../lib/config/defaults.ts";
import type { ModeContext } from "../../../lib/dataplane/mode.ts";
import { log } from "../../../lib/log.ts";
import { IpvsDataplane, type IpvsDataplaneOptions } from "../../../lib/dataplane/ipvs/dataplane.ts";
import { iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { FakeClock } from "../../../lib/proxy/clock.ts";

/** What the fake kernel shows to the reads. */
export interface FakeKernel {
  /** `ip -j addr show` links: name → addresses. */
  links: Record<string, string[]>;
  ipvsadmSave: string;
  ipsetSave: string;
  iptablesSave: { nat: string; filter: string };
  /** `ipvsadm -L -n [-t X]` output. */
  ipvsadmList: string;
  /**
   * The rules of nat KUBE-SERVICES as `iptables -t nat -S KUBE-SERVICES` prints them: set by every
   * iptables-restore the dataplane runs; null makes the listing fail (no such chain).
   */
  natServices: string[] | null;
}

/** A kernel with eth0 holding the node IP 100.101.102.103 (upstream's test node IP), nothing else. */
export function fakeKernel(over: Partial<FakeKernel> = {}): FakeKernel {
  return {
    links: { lo: ["127.0.0.1", "::1"], eth0: ["100.101.102.103"] },
    ipvsadmSave: "",
    ipsetSave: "",
    iptablesSave: { nat: "", filter: "" },
    ipvsadmList: "",
    natServices: null,
    ...over,
  };
}

function addrJson(links: Record<string, string[]>): string {
  return JSON.stringify(
    Object.entries(links).map(([ifname, addrs]) => ({
      ifname,
      addr_info: addrs.map((a) => ({ family: a.includes(":") ? "inet6" : "inet", local: a })),
    })),
  );
}

/** A recorder answering from `k` (changes to `k` show in later reads); `fail` may answer a call first. */
export function kernelRunner(
  k: FakeKernel,
  fail?: (c: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
): RecordingCommandRunner {
  return new RecordingCommandRunner((c) => {
    const f = fail?.(c);
    if (f) return f;
    const a = c.args.join(" ");
    if (c.cmd === "ip" && a === "-j addr show") return { stdout: addrJson(k.links) };
    if (c.cmd === "ipvsadm" && a === "-S -n") return { stdout: k.ipvsadmSave };
    if (c.cmd === "ipvsadm" && a.startsWith("-L -n")) return { stdout: k.ipvsadmList };
    if (c.cmd === "ipset" && a === "save") return { stdout: k.ipsetSave };
    if (c.cmd.endsWith("-restore") && c.stdin.includes("*nat\n")) {
      k.natServices = c.stdin.split("\n").filter((l) => l.startsWith("-A KUBE-SERVICES "));
      return undefined;
    }
    if (/^ip6?tables$/.test(c.cmd) && a.endsWith("-t nat -S KUBE-SERVICES")) {
      if (k.natServices === null) return { code: 1, stderr: "iptables: No chain/target/match by that name." };
      return { stdout: ["-N KUBE-SERVICES", ...k.natServices, ""].join("\n") };
    }
    if (c.cmd.endsWith("-save") && c.args[0] === "-t") {
      return { stdout: k.iptablesSave[c.args[1] as "nat" | "filter"] ?? "" };
    }
    return undefined;
  });
}

/** A dataplane on the recorder, IPv4 unless told, with a fake clock. */
export function ipvsDataplane(r: RecordingCommandRunner, o: Partial<IpvsDataplaneOptions> = {}) {
  const family = o.family ?? "IPv4";
  const clock = new FakeClock(0);
  const dp = new IpvsDataplane({
    family,
    runner: r,
    iptables: iptablesTools("system", family),
    clock,
    ...o,
  });
  return { dp, clock };
}

/** The stdin of the calls of `cmd` (first arg filter optional). */
export function inputs(r: RecordingCommandRunner, cmd: string, firstArg?: string): string[] {
  return r.calls.filter((c) => c.cmd === cmd && (firstArg === undefined || c.args[0] === firstArg)).map((c) =>
    c.stdin
  );
}

/** `cmd args` of every call. */
export function commandLines(r: RecordingCommandRunner): string[] {
  return r.calls.map((c) => [c.cmd, ...c.args].join(" "));
}

/**
 * A ModeContext for the ipvs mode's start-up probe and dataplanes: default configuration with `ipvs` changes,
 * detect-local by the cluster CIDR 10.244.0.0/16, node IP 192.168.0.2; Events are collected in `events`.
 */
export function modeContext(runner: CommandRunner, ipvs: Partial<ProxyOptions["config"]["ipvs"]> = {}) {
  const config = defaultConfiguration();
  Object.assign(config.ipvs, ipvs);
  const events: [string, string][] = [];
  const ctx: ModeContext = {
    runner,
    options: {
      config,
      mode: "ipvs",
      detectLocalMode: "ClusterCIDR",
      clusterCIDRs: ["10.244.0.0/16"],
      nodePortAddresses: [],
      masqueradeBit: 14,
      masqueradeAll: false,
    } as unknown as ProxyOptions,
    nodeIPs: ["192.168.0.2"],
    podCIDRs: [],
    primaryFamily: "IPv4",
    logger: log,
    warningEvent: (reason, note) => events.push([reason, note]),
  };
  return { ctx, events };
}
