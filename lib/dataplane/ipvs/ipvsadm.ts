/**
 * IPVS virtual and real servers in `ipvsadm` terms: the restore lines the mode writes (`ipvsadm -R` reads each
 * line as the options of one ipvsadm call), and parsers of `ipvsadm -S -n` (the full state, read once per full
 * sync) and `ipvsadm -L -n` (connection counters, read only for real servers being drained).
 *
 * A virtual server is keyed by its ipvsadm service option as `-S -n` prints it: `-t 10.0.0.1:80`,
 * `-u [fd00::1]:53`, `--sctp-service 10.0.0.1:80`.
 * @module
 */
import { type IPFamily, joinHostPort, parseIP } from "../../net/ip.ts";
import type { Protocol } from "../../proxy/types.ts";

/** The address the start-up probe uses for its dummy virtual server (TEST-NET-2, as upstream). */
export const PROBE_SERVICE = "-t 198.51.100.0:20000";

/** The service option (key) of a virtual server. */
export function serviceKey(protocol: Protocol, ip: string, port: number): string {
  const opt = protocol === "TCP" ? "-t" : protocol === "UDP" ? "-u" : "--sctp-service";
  return `${opt} ${joinHostPort(ip, port)}`;
}

/** The protocol of a service key. */
export function keyProtocol(key: string): Protocol {
  return key.startsWith("-t ") ? "TCP" : key.startsWith("-u ") ? "UDP" : "SCTP";
}

/** The address of a service key (without brackets). */
export function keyAddress(key: string): string {
  const hp = key.slice(key.indexOf(" ") + 1);
  return hp.startsWith("[") ? hp.slice(1, hp.indexOf("]")) : hp.slice(0, hp.lastIndexOf(":"));
}

/** The settings of a virtual server (what `-E` can change). */
export interface VirtualServerDef {
  readonly scheduler: string;
  /** Persistence timeout in seconds (ClientIP affinity); 0 for none. */
  readonly persistence: number;
  /** Scheduler flags as ipvsadm names them (`mh-port` for mh, as upstream's FlagSourceHash); "" for none. */
  readonly flags: string;
}

/** True when two definitions are the same virtual server settings. */
export function sameDef(a: VirtualServerDef, b: VirtualServerDef): boolean {
  return a.scheduler === b.scheduler && a.persistence === b.persistence && a.flags === b.flags;
}

/** `-A`/`-E` line of a virtual server. */
export function serviceLine(op: "-A" | "-E", key: string, d: VirtualServerDef): string {
  let s = `${op} ${key} -s ${d.scheduler}`;
  if (d.persistence > 0) s += ` -p ${d.persistence}`;
  if (d.flags !== "") s += ` -b ${d.flags}`;
  return s + "\n";
}

/** `-D` line. */
export function deleteServiceLine(key: string): string {
  return `-D ${key}\n`;
}

/** `-a`/`-e` line of a real server with masquerade (NAT) forwarding. */
export function realServerLine(op: "-a" | "-e", key: string, rs: string, weight: number): string {
  return `${op} ${key} -r ${rs} -m -w ${weight}\n`;
}

/** `-d` line. */
export function deleteRealServerLine(key: string, rs: string): string {
  return `-d ${key} -r ${rs}\n`;
}

/** A virtual server as the kernel has it. */
export interface KernelVirtualServer {
  def: VirtualServerDef;
  /** Real server (`ip:port` / `[ip]:port`) → weight. */
  reals: Map<string, number>;
}

function canonicalHostPort(hp: string): string {
  const v6 = hp.startsWith("[");
  const host = v6 ? hp.slice(1, hp.indexOf("]")) : hp.slice(0, hp.lastIndexOf(":"));
  const port = hp.slice(hp.lastIndexOf(":") + 1);
  const ip = parseIP(host)?.ip ?? host;
  return joinHostPort(ip, Number(port));
}

/**
 * Reads `ipvsadm -S -n` line by line (so that a table of 100k real servers is never held as one text): feed
 * every line to `line`, then take `result`. With `family`, virtual servers of the other family and their real
 * servers are skipped as they are read. Firewall-mark services (`-f`) are skipped: kube-proxy never creates
 * them. Unknown options are ignored.
 */
export class IpvsadmSaveReader {
  /** Virtual servers read so far, by key. */
  readonly result = new Map<string, KernelVirtualServer>();

  constructor(private readonly family?: IPFamily) {}

  /** Takes one line of the output (with or without its newline). */
  readonly line = (line: string): void => {
    const w = line.trim().split(/\s+/);
    if (w.length < 3) return;
    const op = w[0];
    if (op !== "-A" && op !== "-a") return;
    if (w[1] !== "-t" && w[1] !== "-u" && w[1] !== "--sctp-service") return;
    if (this.family && (w[2].startsWith("[") ? "IPv6" : "IPv4") !== this.family) return;
    const key = `${w[1]} ${canonicalHostPort(w[2])}`;
    if (op === "-A") {
      let scheduler = "", persistence = 0, flags = "";
      for (let i = 3; i < w.length; i++) {
        if (w[i] === "-s") scheduler = w[++i] ?? "";
        else if (w[i] === "-p") persistence = Number(w[++i] ?? 0);
        else if (w[i] === "-b") flags = w[++i] ?? "";
      }
      this.result.set(key, { def: { scheduler, persistence, flags }, reals: new Map() });
    } else {
      const vs = this.result.get(key);
      if (!vs) return;
      let rs = "", weight = 1;
      for (let i = 3; i < w.length; i++) {
        if (w[i] === "-r") rs = canonicalHostPort(w[++i] ?? "");
        else if (w[i] === "-w") weight = Number(w[++i] ?? 1);
      }
      if (rs !== "") vs.reals.set(rs, weight);
    }
  };
}

/** Parses the whole text of `ipvsadm -S -n` (every family): {@linkcode IpvsadmSaveReader} fed line by line. */
export function parseIpvsadmSave(text: string): Map<string, KernelVirtualServer> {
  const r = new IpvsadmSaveReader();
  for (const line of text.split("\n")) r.line(line);
  return r.result;
}

/** Connection counters of one real server (`ipvsadm -L -n`). */
export interface RealServerStats {
  readonly weight: number;
  readonly activeConn: number;
  readonly inactiveConn: number;
}

const PROTO_OPT: Record<string, string> = { TCP: "-t", UDP: "-u", SCTP: "--sctp-service" };

/** Parses `ipvsadm -L -n` (all services or one): service key → real server → counters. */
export function parseIpvsadmList(text: string): Map<string, Map<string, RealServerStats>> {
  const out = new Map<string, Map<string, RealServerStats>>();
  let cur: Map<string, RealServerStats> | null = null;
  for (const line of text.split("\n")) {
    const w = line.trim().split(/\s+/);
    if (w.length >= 2 && PROTO_OPT[w[0]] !== undefined && !line.startsWith(" ")) {
      cur = new Map();
      out.set(`${PROTO_OPT[w[0]]} ${canonicalHostPort(w[1])}`, cur);
    } else if (cur && w[0] === "->" && w.length >= 6 && w[1] !== "RemoteAddress:Port") {
      // -> ADDR:PORT FORWARD WEIGHT ACTIVE INACTIVE
      cur.set(canonicalHostPort(w[1]), {
        weight: Number(w[3]),
        activeConn: Number(w[4]),
        inactiveConn: Number(w[5]),
      });
    }
  }
  return out;
}
