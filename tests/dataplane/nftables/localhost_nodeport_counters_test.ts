/**
 * `kubeproxy_nftables_localhost_nodeport_rejected_packets_total` (KubeProxyNFTablesLocalhostNodePorts): read at
 * each scrape from the `localhost-nodeport-rejected-<proto>` counters of each family's table, one
 * `nft --json list counters` per family, labelled by family and protocol; a missing table is silent, another
 * failure logged, and either leaves that family out of the scrape.
 */
import assert from "node:assert/strict";
import { localhostNodePortRejectedReader } from "../../../lib/dataplane/nftables/localhost_nodeport_counters.ts";
import { RecordingCommandRunner } from "../../../lib/exec.ts";
import { Logger } from "../../../lib/log.ts";
import {
  LOCALHOST_NODEPORT_REJECTED_PACKETS,
  registerLocalhostNodePortMetrics,
  registry,
} from "../../../lib/metrics.ts";

const NAME = LOCALHOST_NODEPORT_REJECTED_PACKETS;

/** `nft --json list counters table ...` output as nft 1.0.6 prints it. */
function listing(family: string, counters: Record<string, number>): string {
  return JSON.stringify({
    nftables: [
      { metainfo: { version: "1.0.6", release_name: "Lester Gooch #5", json_schema_version: 1 } },
      ...Object.entries(counters).map(([name, packets], i) => ({
        counter: { family, name, table: "kube-proxy", handle: i + 2, packets, bytes: packets * 60 },
      })),
    ],
  });
}

const samples = (text: string) => text.split("\n").filter((l) => l.startsWith(`${NAME}{`)).sort();

Deno.test("localhost NodePort rejected packets: each scrape lists each family's counters, labelled by family and protocol", async () => {
  const errors: string[] = [];
  const logger = new Logger();
  logger.error = (msg: string, err?: unknown) => void errors.push(`${msg}: ${err}`);
  const tables: Record<string, { code: number; stdout?: string; stderr?: string }> = {
    ip: {
      code: 0,
      stdout: listing("ip", {
        "localhost-nodeport-rejected-tcp": 4,
        "localhost-nodeport-rejected-udp": 1,
        "localhost-nodeport-rejected-sctp": 0,
        "some-other-counter": 99,
      }),
    },
    ip6: { code: 0, stdout: listing("ip6", { "localhost-nodeport-rejected-udp": 2 }) },
  };
  const runner = new RecordingCommandRunner((c) => tables[c.args[4]]);
  registerLocalhostNodePortMetrics(localhostNodePortRejectedReader(runner, ["IPv4", "IPv6"], logger));

  let text = await registry.metrics();
  assert.match(
    text,
    new RegExp(
      `^# HELP ${NAME} \\[ALPHA\\] Number of packets rejected on localhost NodePorts\\. UDP and SCTP are always ` +
        "rejected; TCP is rejected when the localhost NodePort proxy is not running$",
      "m",
    ),
  );
  assert.match(text, new RegExp(`^# TYPE ${NAME} counter$`, "m"));
  assert.deepEqual(samples(text), [
    `${NAME}{ip_family="IPv4",protocol="SCTP"} 0`,
    `${NAME}{ip_family="IPv4",protocol="TCP"} 4`,
    `${NAME}{ip_family="IPv4",protocol="UDP"} 1`,
    `${NAME}{ip_family="IPv6",protocol="UDP"} 2`,
  ]);
  assert.deepEqual(runner.calls.map((c) => [c.cmd, ...c.args].join(" ")), [
    "nft --json list counters table ip kube-proxy",
    "nft --json list counters table ip6 kube-proxy",
  ]);
  assert.deepEqual(errors, []);

  // The next scrape reads again; the IPv6 table gone is not an error, another failure is logged.
  tables.ip.stdout = listing("ip", { "localhost-nodeport-rejected-udp": 5 });
  tables.ip6 = {
    code: 1,
    stderr: "Error: No such file or directory; did you mean table ‘kube-proxy’ in family ip?\n" +
      "list counters table ip6 kube-proxy\n                        ^^^^^^^^^^\n",
  };
  text = await registry.metrics();
  assert.deepEqual(samples(text), [`${NAME}{ip_family="IPv4",protocol="UDP"} 5`]);
  assert.equal(runner.calls.length, 4);
  assert.deepEqual(errors, []);

  tables.ip = { code: 1, stderr: "Error: Could not process rule: Operation not permitted\n" };
  text = await registry.metrics();
  assert.deepEqual(samples(text), []);
  assert.match(text, new RegExp(`^# TYPE ${NAME} counter$`, "m"), "still registered");
  assert.deepEqual(errors, [
    "failed to list nftables counters: Error: Could not process rule: Operation not permitted",
  ]);
});

Deno.test("localhost NodePort metrics: registered with the listener gauge and failure counter, upstream's help", async () => {
  registerLocalhostNodePortMetrics(() => Promise.resolve([]));
  registerLocalhostNodePortMetrics(() => Promise.resolve([])); // again: a no-op
  const text = await registry.metrics();
  assert.match(
    text,
    /^# HELP kubeproxy_nftables_localhost_nodeport_listeners \[ALPHA\] Number of active localhost NodePort userspace proxy listeners\.$/m,
  );
  assert.match(text, /^# TYPE kubeproxy_nftables_localhost_nodeport_listeners gauge$/m);
  assert.match(
    text,
    /^# HELP kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total \[ALPHA\] Number of localhost NodePort userspace proxy listener creation failures\.$/m,
  );
  assert.match(
    text,
    /^# TYPE kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total counter$/m,
  );
  assert.equal(text.split("\n").filter((l) => l.startsWith(`# TYPE ${NAME} `)).length, 1);
});
