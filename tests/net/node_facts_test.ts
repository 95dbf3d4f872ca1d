/** The one owner of a family's node facts that every mode asks (node IP, nodePortAddresses, NodePort IPs). */
import assert from "node:assert/strict";
import { RecordingCommandRunner } from "../../lib/exec.ts";
import { log } from "../../lib/log.ts";
import { NodeFacts } from "../../lib/net/node_facts.ts";

const IP_ADDR_V4 = JSON.stringify([
  { ifname: "lo", addr_info: [{ family: "inet", local: "127.0.0.1", prefixlen: 8 }] },
  { ifname: "eth0", addr_info: [{ family: "inet", local: "192.168.1.1", prefixlen: 24 }] },
  { ifname: "eth1", addr_info: [{ family: "inet", local: "10.1.0.5", prefixlen: 16 }] },
]);

Deno.test("node facts: nodePortAddresses are parsed once, with the Node's IPs of the first snapshot", () => {
  const facts = new NodeFacts({
    family: "IPv4",
    nodePortAddresses: ["primary"],
    runner: new RecordingCommandRunner(),
    logger: log,
  });
  assert.equal(facts.observed, false);
  assert.throws(() => facts.nodePortAddresses, /before the first snapshot/);
  facts.observe(["192.168.1.1", "fd00::1"]);
  facts.observe(["192.168.1.2"]); // the Node's IP changed: `primary` stays what it was at start, as upstream
  assert.deepEqual(facts.nodePortAddresses.cidrs, ["192.168.1.1/32"]);
  assert.equal(facts.nodeIP, "192.168.1.2"); // ...while the node IP follows the Node
});

Deno.test("node facts: a specific bindAddress of the family is the node IP; a wildcard or other family is not", () => {
  const runner = new RecordingCommandRunner();
  const facts = (bindAddress: string) => new NodeFacts({ family: "IPv4", bindAddress, runner, logger: log });
  const bound = facts("10.9.9.9");
  bound.observe(["192.168.1.1"]);
  assert.equal(bound.nodeIP, "10.9.9.9");
  for (const b of ["0.0.0.0", "fd00::9"]) {
    const f = facts(b);
    f.observe(["fd00::1", "192.168.1.1"]);
    assert.equal(f.nodeIP, "192.168.1.1");
  }
  const none = facts("0.0.0.0");
  none.observe(["fd00::1"]);
  assert.equal(none.nodeIP, null);
});

Deno.test("node facts: NodePort IPs are the local addresses inside nodePortAddresses, read with ip when asked", async () => {
  const runner = new RecordingCommandRunner((c) => c.cmd === "ip" ? { stdout: IP_ADDR_V4 } : undefined);
  const facts = new NodeFacts({
    family: "IPv4",
    nodePortAddresses: ["10.0.0.0/8", "127.0.0.0/8"],
    runner,
    logger: log,
  });
  facts.observe(["192.168.1.1"]);
  assert.deepEqual(await facts.nodePortIPs(), ["127.0.0.1", "10.1.0.5"]);
  assert.deepEqual(runner.callsOf("ip").map((c) => c.args), [["-j", "-4", "addr", "show"]]);
  assert.deepEqual(facts.nodePortIPsAmong(["192.168.1.1", "10.1.0.5", "10.2.0.1"]), ["10.1.0.5", "10.2.0.1"]);
});

Deno.test("node facts: with nodePortAddresses matching all, nothing is read and every address accepts NodePorts", async () => {
  const runner = new RecordingCommandRunner();
  const facts = new NodeFacts({ family: "IPv6", runner, logger: log });
  facts.observe(["fd00::1"]);
  assert.equal(facts.nodePortAddresses.matchAll, true);
  assert.deepEqual(await facts.nodePortIPs(), []);
  assert.equal(runner.calls.length, 0);
  assert.deepEqual(facts.nodePortIPsAmong(["fd00::1", "fd00::2"]), ["fd00::1", "fd00::2"]);
});

Deno.test("node facts: given local addresses (tests, render) replace reading them", async () => {
  const runner = new RecordingCommandRunner();
  const facts = new NodeFacts({
    family: "IPv4",
    nodePortAddresses: ["192.168.0.0/16"],
    localAddresses: ["192.168.1.1", "10.1.0.5", "192.168.1.1"],
    runner,
    logger: log,
  });
  facts.observe([]);
  assert.deepEqual(await facts.nodePortIPs(), ["192.168.1.1"]);
  assert.equal(runner.calls.length, 0);
});
