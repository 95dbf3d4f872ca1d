/**
 * Self-test of the network-namespace sandbox: pod→pod TCP and UDP through the node, client→node,
 * client→pod (routed), held connections, and that nothing with the sandbox's prefix survives.
 */

import assert from "node:assert/strict";
import {
  cleanupStale,
  listNetns,
  NETNS_PREFIX,
  Sandbox,
  sandboxUnavailableReason,
} from "../../testkit/sandbox.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason(["ip", "sysctl"]);

privilegedTest(unavailable, {
  name: "sandbox: pods, node and client reach each other; destroy removes every namespace",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    if (unavailable) console.log(`skipped: ${unavailable}`);
    const sb = await Sandbox.create({ pods: ["pod-a", "pod-b"], extraClientIPs: ["192.168.77.3"] });
    try {
      const a = sb.pod("pod-a");
      const b = sb.pod("pod-b");
      assert.equal(a.ip, "10.244.0.2");
      assert.equal(b.ip, "10.244.0.3");
      assert.ok(listNetns().includes(a.ns));
      await Promise.all([
        sb.startServer(a.ns, { tcp: [8080], udp: [8081] }),
        sb.startServer(b.ns, { tcp: [8080], udp: [8081] }),
        sb.startServer(sb.node, { name: "node", tcp: [30080] }),
      ]);
      const [pa, pc, pn] = await Promise.all([sb.probe(a.ns), sb.probe(sb.client), sb.probe(sb.node)]);

      await t.step("pod→pod TCP keeps the source pod IP", async () => {
        const r = await pa.tcp(b.ip, 8080);
        assert.equal(r.result, "ok");
        assert.match(r.answer!, new RegExp(`^pod-b ${a.ip.replaceAll(".", "\\.")}:\\d+$`));
      });

      await t.step("pod→pod UDP with a fixed source port", async () => {
        const r = await pa.udp(b.ip, 8081, { localPort: 40123 });
        assert.deepEqual({ result: r.result, answer: r.answer }, {
          result: "ok",
          answer: `pod-b ${a.ip}:40123`,
        });
      });

      await t.step("closed port is refused, unrouted address times out", async () => {
        assert.equal((await pa.tcp(b.ip, 9999)).result, "refused");
        assert.equal((await pa.tcp("10.244.0.200", 8080, { timeoutMs: 300 })).result, "timeout");
      });

      await t.step("client→node IP and client→pod (routed through the node)", async () => {
        const n = await pc.tcp(sb.nodeIP, 30080);
        assert.equal(n.result, "ok");
        assert.ok(n.answer!.startsWith(`node ${sb.clientIP}:`), n.answer);
        const r = await pc.tcp(a.ip, 8080);
        assert.equal(r.result, "ok");
        assert.ok(r.answer!.startsWith(`pod-a ${sb.clientIP}:`), r.answer);
        const r2 = await pc.tcp(a.ip, 8080, { localAddress: "192.168.77.3" });
        assert.ok(r2.answer!.startsWith("pod-a 192.168.77.3:"), r2.answer);
      });

      await t.step("node→pod and many quick probes", async () => {
        const names = await pn.repeat({ op: "tcp", host: b.ip, port: 8080 }, 50);
        assert.deepEqual(new Set(names), new Set(["pod-b"]));
      });

      await t.step("held connection answers until the pod is removed", async () => {
        const opened = await pc.open(b.ip, 8080);
        assert.equal(opened.result, "ok");
        assert.equal((await pc.send(opened.conn!)).result, "ok");
        await sb.removePod("pod-b");
        assert.ok(!listNetns().includes(b.ns));
        assert.notEqual((await pc.send(opened.conn!, 500)).result, "ok");
        assert.equal((await pa.tcp(b.ip, 8080, { timeoutMs: 300 })).result, "timeout");
      });

      await t.step("a pod added later gets the next address and works", async () => {
        const c = await sb.addPod("pod-c");
        assert.equal(c.ip, "10.244.0.4");
        await sb.startServer(c.ns, { tcp: [8080] });
        const r = await pa.tcp(c.ip, 8080);
        assert.ok(r.answer?.startsWith("pod-c "), JSON.stringify(r));
        // Existing pods still reach each other (the gateway MAC did not change under them).
        assert.equal((await sb.probe(c.ns).then((p) => p.tcp(a.ip, 8080))).result, "ok");
      });
    } finally {
      await sb.destroy();
      await sb.destroy(); // idempotent
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix)), []);
  },
});

privilegedTest(unavailable, {
  name: "sandbox: cleanupStale removes namespaces of dead processes only",
  fn: async () => {
    // A pid that cannot be alive (above pid_max's usual ceiling).
    const stale = `${NETNS_PREFIX}4999999-0-node`;
    const p = new Deno.Command("ip", { args: ["netns", "add", stale] });
    assert.equal((await p.output()).code, 0);
    const removed = cleanupStale();
    assert.ok(removed.includes(stale));
    assert.ok(!listNetns().includes(stale));
  },
});
