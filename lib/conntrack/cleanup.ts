/**
 * Stale UDP conntrack cleanup after a sync (upstream `pkg/proxy/conntrack/cleanup.go`), with the `conntrack`
 * tool: one `conntrack -L` per family, then one batched `conntrack -R` of exact `-D` tuples.
 *
 * A UDP flow is stale when its original destination is a ClusterIP / externalIP / LoadBalancer VIP and port of a
 * UDP service port, or its original destination port is a UDP NodePort, and its reply source (IP and port, as
 * upstream v1.37 compares them) is not a *serving* endpoint of that service port.
 *
 * v1.37 (#139629): a service port with no serving endpoint is processed too, with an empty set, so every flow to
 * its ClusterIP / externalIPs / LoadBalancer VIPs is deleted (a one-way UDP sender refreshing its entry would
 * otherwise keep sending to the deleted endpoint for ever, past the reject rule); its NodePort flows are left
 * alone, since they are matched on the port alone and could be another host's. As v1.38 will (#141371), the
 * same holds for a UDP service port that was deleted: its frontends' flows are deleted, unless a current
 * service port took over the same address and port.
 * @module
 */

import type { CommandRunner } from "../exec.ts";
import { log } from "../log.ts";
import type { IPFamily, ProxySnapshot, ServicePortInfo } from "../proxy/types.ts";
import { conntrackReconcilerDeletedEntriesTotal, conntrackReconcilerSyncDuration } from "../metrics.ts";
import { ipValue } from "../net/ip.ts";

/** One conntrack entry: original and reply tuples. */
export interface ConntrackFlow {
  readonly origSrc: string;
  readonly origDst: string;
  readonly origSport: number;
  readonly origDport: number;
  readonly replySrc: string;
  readonly replySport: number;
}

/** Canonical form of an address (IPv6 spellings differ between the API and conntrack). */
function canon(ip: string): string {
  if (!ip.includes(":")) return ip;
  const p = ipValue(ip);
  return p ? "6:" + p.value.toString(16) : ip;
}

/** Parses `conntrack -L -p udp` output (default or `-o extended`), keeping flows of the family. */
export function parseConntrackList(out: string, family: IPFamily): ConntrackFlow[] {
  const flows: ConntrackFlow[] = [];
  const v6 = family === "IPv6";
  for (const line of out.split("\n")) {
    if (!line.includes("udp")) continue;
    const src: string[] = [], dst: string[] = [], sport: number[] = [], dport: number[] = [];
    for (const tok of line.split(/\s+/)) {
      const eq = tok.indexOf("=");
      if (eq < 0) continue;
      const k = tok.slice(0, eq), v = tok.slice(eq + 1);
      if (k === "src") src.push(v);
      else if (k === "dst") dst.push(v);
      else if (k === "sport") sport.push(Number(v));
      else if (k === "dport") dport.push(Number(v));
    }
    if (src.length < 2 || dst.length < 1 || sport.length < 2 || dport.length < 1) continue;
    if (src[0].includes(":") !== v6) continue;
    flows.push({
      origSrc: src[0],
      origDst: dst[0],
      origSport: sport[0],
      origDport: dport[0],
      replySrc: src[1],
      replySport: sport[1],
    });
  }
  return flows;
}

/** The frontends of a service port: what {@linkcode staleUDPFlows} needs of a deleted one. */
export type UDPFrontends = Pick<
  ServicePortInfo,
  "protocol" | "clusterIP" | "loadBalancerVIPs" | "externalIPs" | "port"
>;

/**
 * The flows that point at something other than a serving endpoint of their UDP service port; `removed` are
 * UDP service ports deleted since the last sync (their frontends have no endpoint at all any more).
 */
export function staleUDPFlows(
  snapshot: ProxySnapshot,
  flows: readonly ConntrackFlow[],
  removed: readonly UDPFrontends[] = [],
): ConntrackFlow[] {
  const byServiceIP = new Map<string, Set<string>>();
  const byNodePort = new Map<number, Set<string>>();
  const none = new Set<string>();
  for (const info of removed) {
    if (info.protocol !== "UDP") continue;
    for (const ip of [info.clusterIP, ...info.loadBalancerVIPs, ...info.externalIPs]) {
      byServiceIP.set(`${canon(ip)} ${info.port}`, none);
    }
  }
  for (const st of snapshot.servicePorts.values()) {
    const info = st.info;
    if (info.protocol !== "UDP") continue;
    const serving = new Set<string>();
    for (const ep of st.endpoints) if (ep.serving) serving.add(`${canon(ep.ip)} ${ep.port}`);
    // v1.37: without serving endpoints too (an empty set: every flow to the frontends goes).
    for (const ip of [info.clusterIP, ...info.loadBalancerVIPs, ...info.externalIPs]) {
      byServiceIP.set(`${canon(ip)} ${info.port}`, serving);
    }
    // NodePort flows match on the port alone: only with serving endpoints, as upstream.
    if (info.nodePort !== 0 && serving.size > 0) byNodePort.set(info.nodePort, serving);
  }
  if (byServiceIP.size === 0 && byNodePort.size === 0) return [];
  const stale: ConntrackFlow[] = [];
  for (const f of flows) {
    const reply = `${canon(f.replySrc)} ${f.replySport}`;
    const svc = byServiceIP.get(`${canon(f.origDst)} ${f.origDport}`);
    const np = byNodePort.get(f.origDport);
    if ((svc !== undefined && !svc.has(reply)) || (np !== undefined && !np.has(reply))) stale.push(f);
  }
  return stale;
}

/** `conntrack -R` lines deleting exactly these flows (original tuple + reply source). */
export function deleteBatch(flows: readonly ConntrackFlow[]): string {
  let s = "";
  for (const f of flows) {
    s +=
      `-D -p udp -s ${f.origSrc} -d ${f.origDst} --sport ${f.origSport} --dport ${f.origDport} -r ${f.replySrc}\n`;
  }
  return s;
}

/**
 * Lists UDP flows of the family once, deletes the stale ones in one batched `conntrack -R /dev/stdin` (falling
 * back to one `conntrack -D` per flow when the tool has no `-R`), and updates the reconciler metrics.
 * Resolves with the number of flows deleted. Call after a successful sync in which UDP endpoints changed or UDP
 * service ports (`removed`) were deleted.
 */
export async function cleanStaleUDPConntrack(
  runner: CommandRunner,
  snapshot: ProxySnapshot,
  family: IPFamily = snapshot.family,
  removed: readonly UDPFrontends[] = [],
): Promise<number> {
  const t0 = performance.now();
  let hasUDP = removed.some((r) => r.protocol === "UDP");
  for (const st of hasUDP ? [] : snapshot.servicePorts.values()) {
    if (st.info.protocol === "UDP") {
      hasUDP = true;
      break;
    }
  }
  if (!hasUDP) return 0;
  const fam = family === "IPv6" ? "ipv6" : "ipv4";
  const list = await runner.tryRun({
    cmd: "conntrack",
    args: ["-L", "-f", fam, "-p", "udp"],
    timeoutMs: 60_000,
  });
  if (list.code !== 0) {
    log.error("Failed to list conntrack entries", list.stderr.trim(), { ipFamily: family });
    return 0;
  }
  const stale = staleUDPFlows(snapshot, parseConntrackList(list.stdout, family), removed);
  let deleted = 0;
  if (stale.length > 0) {
    const r = await runner.tryRun({
      cmd: "conntrack",
      args: ["-R", "/dev/stdin"],
      stdin: deleteBatch(stale),
    });
    if (r.code === 0) deleted = stale.length;
    else {
      for (const f of stale) {
        const d = await runner.tryRun({
          cmd: "conntrack",
          args: [
            "-D",
            "-p",
            "udp",
            "-s",
            f.origSrc,
            "-d",
            f.origDst,
            "--sport",
            String(f.origSport),
            "--dport",
            String(f.origDport),
            "-r",
            f.replySrc,
          ],
        });
        if (d.code === 0) deleted++;
      }
    }
    conntrackReconcilerDeletedEntriesTotal.inc({ ip_family: family }, deleted);
  }
  conntrackReconcilerSyncDuration.observe({ ip_family: family }, (performance.now() - t0) / 1000);
  log.v(4).info("Finished reconciling conntrack entries", { ipFamily: family, deleted, stale: stale.length });
  return deleted;
}
