/**
 * The metrics read from the kernel at scrape time (upstream's nfacct counters, iptables mode): served as
 * prom-client counters whose value is the reading, and without a sample in a scrape where it cannot be read.
 */
import assert from "node:assert/strict";
import { registerNfacctMetrics, registry } from "../lib/metrics.ts";

Deno.test("nfacct metrics: each scrape reports the kernel's reading, and no sample when it cannot be read", async () => {
  const readings = new Map<string, number | null>([
    ["localhost_nps_accepted_pkts", 7],
    ["ct_state_invalid_dropped_pkts", null],
  ]);
  registerNfacctMetrics((counter) => Promise.resolve(readings.get(counter) ?? null));
  const sample = (text: string, name: string) => text.split("\n").find((l) => l.startsWith(`${name} `));
  let text = await registry.metrics();
  assert.equal(
    sample(text, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"),
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 7",
  );
  assert.match(text, /^# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter$/m);
  assert.match(
    text,
    /^# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total \[ALPHA\] packets dropped by iptables/m,
  );
  assert.equal(sample(text, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"), undefined);
  readings.set("localhost_nps_accepted_pkts", 12);
  readings.set("ct_state_invalid_dropped_pkts", 3);
  text = await registry.metrics();
  assert.equal(
    sample(text, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"),
    "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 12",
  );
  assert.equal(
    sample(text, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"),
    "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 3",
  );
  // A rejected read is an unreadable one, not a failed scrape.
  readings.set("localhost_nps_accepted_pkts", null);
  text = await registry.metrics();
  assert.equal(sample(text, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"), undefined);
});
