/**
 * Stale UDP conntrack cleanup after a sync (upstream `pkg/proxy/conntrack/cleanup.go`), with the `conntrack`
 * tool: one `conntrack -L` per family, then one batched `conntrack -R` of exact `-D` tuples.
 *
 * A UDP flow is stale when its original destination is a ClusterIP / externalIP / LoadBalancer VIP and port of a
 * UDP service port, or its original destination port is a UDP NodePort, and its reply source (IP and port) is
 * not a *serving* endpoint of that service port. As upstream, a service port with no serving endpoint at all is
 * skipped ("a Service without endpoints does not require to clean the conntrack entries associated"): its flows
 * stay until endpoints come back, when the ones not pinned to them are deleted.
 *
 * Beyond upstream (which compares the reply source IP only), the reply source *port* is compared too. The
 * operator-visible effect: after a Service's targetPort is changed (say 53 → 5353) while its pods keep their IPs,
 * upstream keeps every flow still DNATed to podIP:53, where nothing listens any more; a client that keeps its
 * source port (a resolver or a syslog/statsd sender, each packet refreshing the entry) stays black-holed until it
 * changes port or goes quiet for the UDP timeout. Here those flows are deleted at the endpoint update, so the
 * next packet is DNATed to podIP:5353. Flows pinned to a serving IP:port are kept exactly as upstream keeps them.
 * @module
 */

import type { CommandRunner } from "../exec.ts";
import { log } from "../log.ts";
import type { IPFamily, ProxySnapshot } from "../proxy/types.ts";
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

/** The flows that point at something other than a serving endpoint of their UDP service port. */
export function staleUDPFlows(snapshot: ProxySnapshot, flows: readonly ConntrackFlow[]): ConntrackFlow[] {
  const byServiceIP = new Map<string, Set<string>>();
  const byNodePort = new Map<number, Set<string>>();
  for (const st of snapshot.servicePorts.values()) {
    const info = st.info;
    if (info.protocol !== "UDP") continue;
    const serving = new Set<string>();
    for (const ep of st.endpoints) if (ep.serving) serving.add(`${canon(ep.ip)} ${ep.port}`);
    // Upstream: "a Service without endpoints does not require to clean the conntrack entries associated".
    if (serving.size === 0) continue;
    for (const ip of [info.clusterIP, ...info.loadBalancerVIPs, ...info.externalIPs]) {
      byServiceIP.set(`${canon(ip)} ${info.port}`, serving);
    }
    if (info.nodePort !== 0) byNodePort.set(info.nodePort, serving);
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
 * Resolves with the number of flows deleted. Call after a successful sync in which UDP endpoints changed.
 */
export async function cleanStaleUDPConntrack(
  runner: CommandRunner,
  snapshot: ProxySnapshot,
  family: IPFamily = snapshot.family,
): Promise<number> {
  const t0 = performance.now();
  let hasUDP = false;
  for (const st of snapshot.servicePorts.values()) {
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
  const stale = staleUDPFlows(snapshot, parseConntrackList(list.stdout, family));
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
