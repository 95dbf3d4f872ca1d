/**
 * The packet tracer of the ipvs mode: the mode's iptables rules walked by the iptables tracer, with their
 * `-m set` matches answered from the ipsets and IPVS's choice of real server made from the virtual servers, as
 * a first sync writes them (the rendered `iptables-restore`, `ipset restore`, `ipvsadm -R` and `ip -batch`
 * input, which use the line forms `iptables-save`, `ipset save` and `ipvsadm -S -n` print). The outcome is
 * derived from those objects alone: it is what explain prints (`explain_path.ts`), and the tests hold it to the
 * Services' semantics, so a rule or entry the mode gets wrong fails there.
 * @module
 */
import { DUMMY_INTERFACE, parseLocalAddresses } from "../dataplane/ipvs/addresses.ts";
import { parseIpsetSave, type SavedSet } from "../dataplane/ipvs/ipsets.ts";
import {
  type KernelVirtualServer,
  keyAddress,
  parseIpvsadmSave,
  serviceKey,
  serviceLine,
} from "../dataplane/ipvs/ipvsadm.ts";
import type { IptablesTables } from "../dataplane/iptables/model.ts";
import {
  type Balanced,
  type SetLookup,
  type Trace,
  type TraceHooks,
  traceIptables,
  type TracePacket,
} from "../dataplane/iptables/trace.ts";
import type { CommandRunner } from "../exec.ts";
import { cidrContains, familyOf, type IPFamily, joinHostPort } from "../net/ip.ts";
import type { Protocol } from "../proxy/types.ts";
import type { FirstSync } from "./engine.ts";
import { readLiveIptables, renderedIptables } from "./explain_trace.ts";

/** The ipvs mode's kernel objects of one family. */
export interface IpvsObjects {
  readonly iptables: IptablesTables;
  /** Virtual servers by key (`-t 10.96.0.1:443`). */
  readonly virtualServers: ReadonlyMap<string, KernelVirtualServer>;
  /** Every ipset by name. */
  readonly sets: ReadonlyMap<string, SavedSet>;
  /** The addresses on kube-ipvs0 (local addresses of the node). */
  readonly dummyAddresses: readonly string[];
}

/** The ipvs objects of `family` a first sync writes, as the tools would hold them after it. */
export function renderedIpvs(sync: FirstSync, family: IPFamily): IpvsObjects {
  const input = (cmd: string) =>
    sync.commands.filter((c) => c.family === family && c.cmd === cmd).map((c) => c.stdin).join("\n");
  const dummyAddresses: string[] = [];
  for (const line of input("ip").split("\n")) {
    const m = line.trim().match(/^addr (?:add|replace) ([^/\s]+)\/\d+ dev (\S+)/);
    if (m && m[2] === DUMMY_INTERFACE) dummyAddresses.push(m[1]);
  }
  return {
    iptables: renderedIptables(sync, family),
    virtualServers: parseIpvsadmSave(input("ipvsadm")),
    sets: parseIpsetSave(input("ipset")),
    dummyAddresses,
  };
}

/**
 * Whether the packet is in `set` by `dirs`, as the kernel's ipset match builds the lookup: one dimension per
 * part of the set's type (`hash:ip,port,net`), each from the source or destination its flag names. A source
 * port is not known: a set that needs one does not match.
 */
export function inIpset(set: SavedSet, dirs: readonly string[], pkt: SetLookup): boolean {
  const parts = set.type.slice(set.type.indexOf(":") + 1).split(",");
  const fields: string[] = [];
  let net: string | null = null;
  for (let i = 0; i < parts.length; i++) {
    const src = dirs[i] === "src";
    switch (parts[i]) {
      case "ip":
        fields.push(src ? pkt.src : pkt.dst);
        break;
      case "port":
        if (src) return false;
        fields.push(set.type.startsWith("bitmap:") ? String(pkt.dport) : `${pkt.protocol}:${pkt.dport}`);
        break;
      case "net":
        net = src ? pkt.src : pkt.dst;
        break;
      default:
        return false;
    }
  }
  if (net === null) return set.entries.has(fields.join(","));
  const prefix = `${fields.join(",")},`;
  for (const e of set.entries) {
    if (!e.startsWith(prefix)) continue;
    const cidr = e.slice(prefix.length);
    if (cidrContains(cidr.includes("/") ? cidr : `${cidr}/${cidr.includes(":") ? 128 : 32}`, net)) {
      return true;
    }
  }
  return false;
}

const PROTOCOLS: Readonly<Record<string, Protocol>> = { tcp: "TCP", udp: "UDP", sctp: "SCTP" };

/**
 * IPVS's pick for a new connection to `dst`:`dport`: the virtual server's real servers of weight above 0
 * (weight 0 is a real server being drained: it takes no new connection), in equal shares for `rr` and in
 * proportion to their weights otherwise; "reject" when the virtual server has none (IPVS answers ICMP port
 * unreachable); null when there is no such virtual server.
 */
export function ipvsPick(
  vs: KernelVirtualServer | undefined,
  key: { addr: string; port: number },
): Balanced[] | "reject" | null {
  if (!vs) return null;
  const live = [...vs.reals].filter(([, w]) => w > 0);
  if (live.length === 0) return "reject";
  const total = live.reduce((a, [, w]) => a + w, 0);
  return live.map(([rs, w]) => {
    const v6 = rs.startsWith("[");
    const host = v6 ? rs.slice(1, rs.indexOf("]")) : rs.slice(0, rs.lastIndexOf(":"));
    const port = Number(rs.slice(rs.lastIndexOf(":") + 1));
    return {
      endpoint: joinHostPort(host, port),
      dst: host,
      dport: port,
      share: vs.def.scheduler === "rr" ? 1 / live.length : w / total,
      vaddr: key.addr,
      vport: key.port,
    };
  });
}

/** The tracer's hooks over the ipvs objects: ipset membership and IPVS's pick. */
export function ipvsHooks(o: IpvsObjects, protocol: TracePacket["protocol"]): TraceHooks {
  return {
    inSet: (name, dirs, pkt) => {
      const set = o.sets.get(name);
      return set === undefined ? undefined : inIpset(set, dirs, pkt);
    },
    balance: (dst, dport) =>
      ipvsPick(o.virtualServers.get(serviceKey(PROTOCOLS[protocol], dst, dport)), { addr: dst, port: dport }),
    describe: (dst, dport) => {
      const key = serviceKey(PROTOCOLS[protocol], dst, dport);
      const vs = o.virtualServers.get(key);
      return vs ? `IPVS virtual server ${serviceLine("-A", key, vs.def).trim()}` : `IPVS ${key}`;
    },
  };
}

/** Traces `p` through the ipvs objects (kube-ipvs0's addresses count as the node's own). */
export function traceIpvs(o: IpvsObjects, p: TracePacket): Trace {
  const packet = { ...p, localAddresses: [...p.localAddresses, ...o.dummyAddresses] };
  return traceIptables(o.iptables, packet, ipvsHooks(o, p.protocol));
}

/**
 * Reads this node's ipvs objects of `family`: kube-ipvs0's addresses (`ip -j addr show`), the virtual servers
 * (`ipvsadm -S -n`), the ipsets (`ipset save`) and the iptables rules (the agent's backend's `iptables-save`).
 * @throws {Error} When a tool fails.
 */
export async function readLiveIpvs(runner: CommandRunner, family: IPFamily): Promise<IpvsObjects> {
  const read = async (cmd: string, args: string[]) => {
    const r = await runner.tryRun({ cmd, args, timeoutMs: 60_000 });
    if (r.code !== 0) throw new Error(`${cmd} ${args.join(" ")} failed: ${r.stderr.trim()}`);
    return r.stdout;
  };
  const addrs = parseLocalAddresses(await read("ip", ["-j", "addr", "show"]), family);
  const virtualServers = new Map<string, KernelVirtualServer>();
  for (const [key, vs] of parseIpvsadmSave(await read("ipvsadm", ["-S", "-n"]))) {
    if (familyOf(keyAddress(key)) === family) virtualServers.set(key, vs);
  }
  return {
    iptables: (await readLiveIptables(runner, family)).tables,
    virtualServers,
    sets: parseIpsetSave(await read("ipset", ["save"])),
    dummyAddresses: [...addrs.dummy],
  };
}
