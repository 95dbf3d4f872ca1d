/**
 * The ipvs mode's ipsets exactly as upstream's `pkg/proxy/ipvs/ipset.go` defines them (names, types, the
 * comments its iptables rules carry, the `KUBE-6-` prefix of IPv6 sets truncated to 31 characters), their
 * entry formats (`ipset.Entry.String()`), the `ipset restore` create lines and the parser of `ipset save`.
 * @module
 */
import type { IPFamily } from "../../net/ip.ts";

/** The ipset types the mode uses. */
export type SetType = "hash:ip,port" | "hash:ip,port,ip" | "hash:ip,port,net" | "bitmap:port" | "hash:ip";

/** Upstream's set names (IPv4 spelling), used as keys for both families. */
export type SetKey =
  | "KUBE-LOOP-BACK"
  | "KUBE-CLUSTER-IP"
  | "KUBE-EXTERNAL-IP"
  | "KUBE-EXTERNAL-IP-LOCAL"
  | "KUBE-LOAD-BALANCER"
  | "KUBE-LOAD-BALANCER-FW"
  | "KUBE-LOAD-BALANCER-LOCAL"
  | "KUBE-LOAD-BALANCER-SOURCE-IP"
  | "KUBE-LOAD-BALANCER-SOURCE-CIDR"
  | "KUBE-NODE-PORT-TCP"
  | "KUBE-NODE-PORT-LOCAL-TCP"
  | "KUBE-NODE-PORT-UDP"
  | "KUBE-NODE-PORT-LOCAL-UDP"
  | "KUBE-NODE-PORT-SCTP-HASH"
  | "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
  | "KUBE-HEALTH-CHECK-NODE-PORT"
  | "KUBE-IPVS-IPS";

/** One set: upstream's `ipsetInfo` entry. */
export interface SetDef {
  readonly key: SetKey;
  readonly type: SetType;
  /** The comment of the iptables rules matching the set. */
  readonly comment: string;
}

/** Every set, in upstream's `ipsetInfo` order. */
export const SET_DEFS: readonly SetDef[] = [
  {
    key: "KUBE-LOOP-BACK",
    type: "hash:ip,port,ip",
    comment: "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
  },
  {
    key: "KUBE-CLUSTER-IP",
    type: "hash:ip,port",
    comment: "Kubernetes service cluster ip + port for masquerade purpose",
  },
  {
    key: "KUBE-EXTERNAL-IP",
    type: "hash:ip,port",
    comment: "Kubernetes service external ip + port for masquerade and filter purpose",
  },
  {
    key: "KUBE-EXTERNAL-IP-LOCAL",
    type: "hash:ip,port",
    comment: "Kubernetes service external ip + port with externalTrafficPolicy=local",
  },
  { key: "KUBE-LOAD-BALANCER", type: "hash:ip,port", comment: "Kubernetes service lb portal" },
  {
    key: "KUBE-LOAD-BALANCER-FW",
    type: "hash:ip,port",
    comment: "Kubernetes service load balancer ip + port for load balancer with sourceRange",
  },
  {
    key: "KUBE-LOAD-BALANCER-LOCAL",
    type: "hash:ip,port",
    comment: "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
  },
  {
    key: "KUBE-LOAD-BALANCER-SOURCE-IP",
    type: "hash:ip,port,ip",
    comment: "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
  },
  {
    key: "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    type: "hash:ip,port,net",
    comment: "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
  },
  {
    key: "KUBE-NODE-PORT-TCP",
    type: "bitmap:port",
    comment: "Kubernetes nodeport TCP port for masquerade purpose",
  },
  {
    key: "KUBE-NODE-PORT-LOCAL-TCP",
    type: "bitmap:port",
    comment: "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
  },
  {
    key: "KUBE-NODE-PORT-UDP",
    type: "bitmap:port",
    comment: "Kubernetes nodeport UDP port for masquerade purpose",
  },
  {
    key: "KUBE-NODE-PORT-LOCAL-UDP",
    type: "bitmap:port",
    comment: "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
  },
  {
    key: "KUBE-NODE-PORT-SCTP-HASH",
    type: "hash:ip,port",
    comment: "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
  },
  {
    key: "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    type: "hash:ip,port",
    comment: "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
  },
  { key: "KUBE-HEALTH-CHECK-NODE-PORT", type: "bitmap:port", comment: "Kubernetes health check node port" },
  { key: "KUBE-IPVS-IPS", type: "hash:ip", comment: "Addresses on the ipvs interface" },
];

/** Definitions by key. */
export const SET_BY_KEY: ReadonlyMap<SetKey, SetDef> = new Map(SET_DEFS.map((d) => [d.key, d]));

/** Upstream's `ipset` name limit. */
const MAX_NAME = 31;

/**
 * The kernel name of a set in a family: the IPv4 name, or for IPv6 `KUBE-` replaced by `KUBE-6-` and cut to 31
 * characters (`KUBE-6-LOAD-BALANCER-SOURCE-CID`, `KUBE-6-NODE-PORT-LOCAL-SCTP-HAS`), as upstream's NewIPSet.
 */
export function setName(key: SetKey, family: IPFamily): string {
  if (family === "IPv4") return key;
  return ("KUBE-6-" + key.slice("KUBE-".length)).slice(0, MAX_NAME);
}

/** Every set name the mode may create (both families): what `--cleanup` destroys. */
export function allSetNames(): string[] {
  const out: string[] = [];
  for (const d of SET_DEFS) out.push(setName(d.key, "IPv4"), setName(d.key, "IPv6"));
  return out;
}

/**
 * The `ipset restore` line creating a set as upstream's `createSet` does (hashsize 1024, maxelem 65536; range
 * 0-65535 for bitmap:port; no comment extension). Used with `-exist`.
 */
export function createLine(def: SetDef, family: IPFamily): string {
  const name = setName(def.key, family);
  if (def.type === "bitmap:port") return `create ${name} bitmap:port range 0-65535`;
  return `create ${name} ${def.type} family ${
    family === "IPv6" ? "inet6" : "inet"
  } hashsize 1024 maxelem 65536`;
}

/** `ip,proto:port` (hash:ip,port). */
export function ipPortEntry(ip: string, proto: string, port: number): string {
  return `${ip},${proto}:${port}`;
}

/** `ip,proto:port,ip2` (hash:ip,port,ip). */
export function ipPortIPEntry(ip: string, proto: string, port: number, ip2: string): string {
  return `${ip},${proto}:${port},${ip2}`;
}

/**
 * `ip,proto:port,net` (hash:ip,port,net). A host network (`/32`, `/128`) is written as the bare address, as
 * `ipset save` prints it, so that what was written and what is read back compare equal.
 */
export function ipPortNetEntry(ip: string, proto: string, port: number, net: string): string {
  const n = net.endsWith("/32") && !net.includes(":")
    ? net.slice(0, -3)
    : net.endsWith("/128") && net.includes(":")
    ? net.slice(0, -4)
    : net;
  return `${ip},${proto}:${port},${n}`;
}

/** One set as `ipset save` shows it. */
export interface SavedSet {
  readonly type: string;
  /** The `create` line's options after the type (family, hashsize, ...). */
  readonly options: string;
  readonly entries: Set<string>;
}

/**
 * Reads `ipset save` line by line: feed every line to `line`, then take `result`. With `names`, only those sets
 * are kept (the host's other sets and the other family's are skipped as they are read).
 */
export class IpsetSaveReader {
  /** Sets read so far, by name. */
  readonly result = new Map<string, SavedSet>();

  constructor(private readonly names?: ReadonlySet<string>) {}

  /** Takes one line of the output. */
  readonly line = (line: string): void => {
    if (line.startsWith("add ")) {
      const sp = line.indexOf(" ", 4);
      if (sp < 0) return;
      const set = this.result.get(line.slice(4, sp));
      if (!set) return;
      // Entries may carry options (timeout, comment): the element is the first word.
      const rest = line.slice(sp + 1);
      const end = rest.indexOf(" ");
      set.entries.add(end < 0 ? rest : rest.slice(0, end));
    } else if (line.startsWith("create ")) {
      const parts = line.split(" ");
      if (this.names && !this.names.has(parts[1])) return;
      this.result.set(parts[1], {
        type: parts[2] ?? "",
        options: parts.slice(3).join(" "),
        entries: new Set(),
      });
    }
  };
}

/** Parses `ipset save` output (every set on the host; callers pick theirs). */
export function parseIpsetSave(text: string): Map<string, SavedSet> {
  const r = new IpsetSaveReader();
  for (const line of text.split("\n")) r.line(line);
  return r.result;
}
