/**
 * The scrape-time reading of `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`
 * (KubeProxyNFTablesLocalhostNodePorts), as upstream v1.37's nftCounterMetricCollector: one
 * `nft --json list counters table <family> kube-proxy` per family (knftables' ListCounters), keeping the
 * `localhost-nodeport-rejected-<proto>` counters' packets, labelled by family and protocol. A family whose table
 * does not exist reports nothing silently; another failure is logged and that family reports nothing.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { LocalhostNodePortRejectedSample } from "../../metrics.ts";
import type { IPFamily } from "../../proxy/types.ts";
import { LOCALHOST_NODEPORT_PROTOCOLS, localhostNodePortRejectedCounter, TABLE } from "./names.ts";

/** Upstream's nftCounterListTimeout: one listing during a scrape. */
const LIST_TIMEOUT_MS = 2000;

/** Counter name to protocol label (`localhost-nodeport-rejected-tcp` to `TCP`, ...). */
const PROTOCOL_OF = new Map<string, string>(
  LOCALHOST_NODEPORT_PROTOCOLS.map((p) => [localhostNodePortRejectedCounter(p), p]),
);

/** The named counters of `nft --json list counters` output: name and packets. */
export function parseNftCounters(json: string): { name: string; packets: number }[] {
  const doc: unknown = JSON.parse(json);
  const items = (doc as { nftables?: unknown })?.nftables;
  if (!Array.isArray(items)) return [];
  const out: { name: string; packets: number }[] = [];
  for (const item of items) {
    const c = (item as { counter?: { name?: unknown; packets?: unknown } })?.counter;
    if (c === undefined || typeof c.name !== "string" || typeof c.packets !== "number") continue;
    out.push({ name: c.name, packets: c.packets });
  }
  return out;
}

/** Reads the rejected-packets counters of each family's `kube-proxy` table at scrape time. */
export function localhostNodePortRejectedReader(
  runner: CommandRunner,
  families: readonly IPFamily[],
  logger: Logger,
): () => Promise<LocalhostNodePortRejectedSample[]> {
  return async () => {
    const out: LocalhostNodePortRejectedSample[] = [];
    for (const family of families) {
      const nftFamily = family === "IPv6" ? "ip6" : "ip";
      let r;
      try {
        r = await runner.tryRun({
          cmd: "nft",
          args: ["--json", "list", "counters", "table", nftFamily, TABLE],
          timeoutMs: LIST_TIMEOUT_MS,
        });
      } catch (err) {
        logger.error("failed to list nftables counters", (err as Error).message, { ipFamily: family });
        continue;
      }
      if (r.code !== 0) {
        // The table not existing (yet, or any more) is not an error (upstream's knftables.IsNotFound).
        if (!/No such file or directory/.test(r.stderr)) {
          logger.error("failed to list nftables counters", r.stderr.trim() || `exit ${r.code}`, {
            ipFamily: family,
          });
        }
        continue;
      }
      let counters;
      try {
        counters = parseNftCounters(r.stdout);
      } catch (err) {
        logger.error("failed to list nftables counters", (err as Error).message, { ipFamily: family });
        continue;
      }
      for (const c of counters) {
        const protocol = PROTOCOL_OF.get(c.name);
        if (protocol === undefined) continue;
        out.push({ labels: { ip_family: family, protocol }, value: c.packets });
      }
    }
    return out;
  };
}
