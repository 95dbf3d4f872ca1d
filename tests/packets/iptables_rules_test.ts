/**
 * Packet tests of the iptables rules alone: {@linkcode IptablesDataplane} syncs hand-built snapshots
 * (no API server, no agent) in the sandbox's node namespace, and real traffic checks the result. This
 * isolates rule rendering from the informers and the sync loop.
 */

import assert from "node:assert/strict";
import { IptablesDataplane } from "../../lib/dataplane/iptables/dataplane.ts";
import { newLocalDetector } from "../../lib/dataplane/iptables/local_detector.ts";
import { makeState, snapshot } from "../../testkit/fixtures.ts";
import { NetnsRunner } from "../../testkit/netns.ts";
import { Sandbox, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { tally } from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason(["ip", "iptables", "iptables-restore", "sysctl"]);

privilegedTest(unavailable, {
  name: "iptables rules (IptablesDataplane, hand-built snapshots) carry real traffic",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const sb = await Sandbox.create({ pods: ["pod-a", "pod-b", "pod-x"] });
    try {
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), x = sb.pod("pod-x");
      await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080] })));
      const dp = new IptablesDataplane({
        family: "IPv4",
        runner: new NetnsRunner(sb.node),
        localDetector: newLocalDetector({
          mode: "ClusterCIDR",
          family: "IPv4",
          clusterCIDRs: ["10.244.0.0/16"],
        }),
      });
      const web = (eps: { ip: string; local?: boolean }[]) =>
        makeState({ ns: "dp", name: "web", clusterIP: "10.96.0.10" }, eps.map((e) => ({ ...e, port: 8080 })));
      const np = (eps: { ip: string; local?: boolean }[]) =>
        makeState(
          { ns: "dp", name: "np", clusterIP: "10.96.0.11", nodePort: 30085, eTPLocal: true },
          eps.map((e) => ({ ...e, port: 8080 })),
        );
      const empty = makeState({ ns: "dp", name: "empty", clusterIP: "10.96.0.12" }, []);
      const nodeIPs = [sb.nodeIP];
      await dp.sync(
        snapshot([web([{ ip: a.ip }, { ip: b.ip }]), np([{ ip: a.ip, local: true }]), empty], { nodeIPs }),
      );
      const [pn, px, pc] = await Promise.all([sb.probe(sb.node), sb.probe(x.ns), sb.probe(sb.client)]);

      await t.step("ClusterIP balances over both endpoints from the node and from a pod", async () => {
        for (const probe of [pn, px]) {
          const got = tally(await probe.repeat({ op: "tcp", host: "10.96.0.10", port: 80 }, 40));
          assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
        }
      });

      await t.step("a service without endpoints is rejected", async () => {
        assert.equal((await pn.tcp("10.96.0.12", 80)).result, "refused");
      });

      await t.step("eTP Local NodePort keeps the client IP; no local endpoint drops", async () => {
        const r = await pc.tcp(sb.nodeIP, 30085);
        assert.ok(r.answer?.startsWith(`pod-a ${sb.clientIP}:`), JSON.stringify(r));
        await dp.sync(snapshot([web([{ ip: a.ip }, { ip: b.ip }]), np([{ ip: b.ip }]), empty], {
          nodeIPs,
          changed: ["dp/np"],
        }));
        assert.equal((await pc.tcp(sb.nodeIP, 30085, { timeoutMs: 500 })).result, "timeout");
      });

      await t.step("a partial sync removing an endpoint takes effect at once", async () => {
        await dp.sync(
          snapshot([web([{ ip: a.ip }]), np([{ ip: b.ip }]), empty], { nodeIPs, changed: ["dp/web"] }),
        );
        assert.deepEqual(
          new Set(await pn.repeat({ op: "tcp", host: "10.96.0.10", port: 80 }, 30)),
          new Set(["pod-a"]),
        );
      });
    } finally {
      await sb.destroy();
    }
  },
});
