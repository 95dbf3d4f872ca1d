/**
 * A node that exists only as answers: what a fresh Linux host tells a proxy mode while it starts and syncs for
 * the first time (empty iptables tables and nft ruleset, no IPVS virtual servers, no ipsets, the node's
 * addresses, default sysctls, nfacct available), given to the mode through a {@linkcode RecordingCommandRunner}
 * so that nothing is spawned and every command the mode runs is recorded. Writes that a later read would see
 * (sysctls, nfacct counters) are remembered, as the kernel would.
 * @module
 */
import { type RecordedCall, RecordingCommandRunner } from "../exec.ts";
import type { CommandResult } from "../exec.ts";

/** The `nft --version` a current distribution ships (above the nftables mode's minimum). */
const NFT_VERSION = "nftables v1.0.9 (Old Doc Yak #3)\n";
/** The `ipset --version` a current distribution ships. */
const IPSET_VERSION = "ipset v7.19, protocol version: 7\n";

/** What the simulated node has. */
export interface SimulatedHostOptions {
  /** The node's own addresses (on `eth0`); loopback is added. */
  readonly addresses: readonly string[];
}

function isIptables(cmd: string): boolean {
  return /^ip6?tables(-nft|-legacy)?$/.test(cmd);
}

/**
 * True for a command that changes the kernel (a restore, a transaction, a batch, a sysctl write, a counter
 * creation, ...); false for the reads a mode makes (saves, listings, versions, `sysctl -n`). Unknown commands
 * count as changes, so that nothing that might change the kernel is hidden from render's output.
 */
export function changesKernel(call: { cmd: string; args: readonly string[] }): boolean {
  const a = call.args;
  if (/^ip6?tables(-nft|-legacy)?-save$/.test(call.cmd)) return false;
  if (isIptables(call.cmd)) {
    return !a.some((x) => x === "-S" || x === "-L" || x === "-C" || x === "--version");
  }
  switch (call.cmd) {
    case "nft":
      return !a.some((x) => x === "--version" || x === "-v" || x === "--check" || x === "-c" || x === "list");
    case "ip":
      return !a.some((x) => x === "show" || x === "list" || x === "-V");
    case "sysctl":
      return !a.includes("-n");
    case "nfacct":
      return !(a[0] === "get" || a[0] === "list" || a[0] === "version");
    case "ipset":
      return !a.some((x) => x === "--version" || x === "save" || x === "list" || x === "-n");
    case "ipvsadm":
      return !a.some((x) => x === "-S" || x === "-L" || x === "--version" || x === "-l");
    case "conntrack":
      return !a.some((x) => x === "-L" || x === "-C" || x === "--version");
    default:
      return true;
  }
}

/** The `ip -j addr show` answer: `lo` with the loopback addresses, `eth0` with the node's. */
function addrJson(addresses: readonly string[], args: readonly string[]): string {
  const only = args.includes("-4") ? "inet" : args.includes("-6") ? "inet6" : null;
  const info = (ips: readonly string[]) =>
    ips
      .map((ip) => ({
        family: ip.includes(":") ? "inet6" : "inet",
        local: ip,
        prefixlen: ip.includes(":") ? 64 : 24,
        scope: ip === "127.0.0.1" || ip === "::1" ? "host" : "global",
      }))
      .filter((a) => only === null || a.family === only);
  return JSON.stringify([
    { ifindex: 1, ifname: "lo", flags: ["LOOPBACK", "UP"], addr_info: info(["127.0.0.1", "::1"]) },
    { ifindex: 2, ifname: "eth0", flags: ["UP"], addr_info: info(addresses) },
  ]);
}

/** The simulated node: a recording runner answering as a fresh host. */
export class SimulatedHost {
  readonly runner: RecordingCommandRunner;
  readonly #sysctls = new Map<string, string>();
  readonly #counters = new Set<string>();

  constructor(readonly opts: SimulatedHostOptions) {
    this.runner = new RecordingCommandRunner((c) => this.#answer(c));
  }

  #answer(c: RecordedCall): Partial<CommandResult> | undefined {
    const a = c.args;
    if (isIptables(c.cmd) || /-(save|restore)$/.test(c.cmd)) return { stdout: "" };
    switch (c.cmd) {
      case "nft":
        if (a.includes("--version")) return { stdout: NFT_VERSION };
        if (a.includes("-j")) return { stdout: '{"nftables": []}' };
        return { stdout: "" };
      case "ip":
        if (a.includes("addr") && a.includes("show")) return { stdout: addrJson(this.opts.addresses, a) };
        return undefined;
      case "sysctl": {
        if (a[0] === "-n") return { stdout: `${this.#sysctls.get(a[1]) ?? "0"}\n` };
        const m = a.find((x) => x.includes("="))?.match(/^([^=]+)=(.*)$/);
        if (m) this.#sysctls.set(m[1], m[2]);
        return undefined;
      }
      case "nfacct":
        if (a[0] === "get") {
          return this.#counters.has(a[1])
            ? { stdout: `{ pkts = 00000000000000000000, bytes = 00000000000000000000 } = ${a[1]};\n` }
            : { code: 1, stderr: "nfacct: No such file or directory\n" };
        }
        if (a[0] === "add") this.#counters.add(a[1]);
        return undefined;
      case "ipset":
        if (a.includes("--version")) return { stdout: IPSET_VERSION };
        return undefined;
      default:
        return undefined;
    }
  }
}
