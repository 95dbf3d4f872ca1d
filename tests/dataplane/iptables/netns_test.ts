/**
 * Real kernel: payloads (full, partial, every feature on) applied with iptables-legacy-restore and
 * iptables-nft-restore inside a throwaway network namespace, checked with iptables-save.
 */
import assert from "node:assert/strict";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import { type IptablesBackend, iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables/local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { overallFixture } from "../../../testkit/fixtures.ts";
import { netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";

configureLogging({ sink: () => {} });
const unavailable = netnsUnavailableReason();

function chainsOf(save: string): Set<string> {
  return new Set(save.split("\n").filter((l) => l.startsWith(":")).map((l) => l.slice(1).split(" ")[0]));
}

function allFeatures() {
  return [
    ...overallFixture(),
    makeState({ ns: "ns7", name: "itp", clusterIP: "172.30.0.47", iTPLocal: true }, [{ ip: "10.180.0.7" }]),
    makeState({
      ns: "ns8",
      name: "udp",
      clusterIP: "172.30.0.48",
      protocol: "UDP",
      portNum: 53,
      nodePort: 30053,
    }, [
      { ip: "10.180.0.8", port: 5353 },
      { ip: "10.180.0.9", port: 5353, local: true },
      { ip: "10.180.0.10", port: 5353 },
    ]),
    makeState({
      ns: "ns9",
      name: "lbl",
      clusterIP: "172.30.0.49",
      nodePort: 30049,
      lbVIPs: ["5.6.7.9"],
      sourceRanges: ["192.168.0.0/16", "203.0.113.0/24"],
      eTPLocal: true,
      hcnp: 31000,
      affinity: 300,
    }, [{ ip: "10.180.0.11", local: true }, { ip: "10.180.0.12" }]),
    makeState({ ns: "ns10", name: "sctp", clusterIP: "172.30.0.50", protocol: "SCTP", portNum: 7777 }, [{
      ip: "10.180.0.13",
    }]),
  ];
}

for (const backend of ["legacy", "nft"] as IptablesBackend[]) {
  privilegedTest(unavailable, {
    name:
      `netns ${backend}: full, partial and stale-deletion payloads are accepted; iptables-save shows them`,
    fn: () =>
      withNetns(async (runner) => {
        const tools = iptablesTools(backend, "IPv4");
        const dp = new IptablesDataplane({
          family: "IPv4",
          runner,
          backend,
          localDetector: detectLocalByCIDR("10.0.0.0/8"),
          masqueradeAll: false,
        });
        const states = allFeatures();
        const r1 = await dp.sync(snapshot(states));
        assert.equal(r1.full, true);
        const save1 = (await runner.run({ cmd: tools.save, args: [] })).stdout;
        const chains1 = chainsOf(save1);
        for (const c of dp.lastPayload!.text.matchAll(/^:(\S+)/gm)) assert.ok(chains1.has(c[1]), c[1]);
        assert.ok(save1.includes("-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment"));
        assert.match(
          save1,
          /-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/,
        );
        assert.match(save1, /-A INPUT -j KUBE-FIREWALL/);
        assert.ok(chains1.has("KUBE-PROXY-CANARY"));
        assert.equal(await dp.needsFullSync(), false);

        // Partial: drop an endpoint of ns8 and delete ns1 entirely.
        const next = states.filter((s) => s.info.serviceKey !== "ns1/svc1");
        const i = next.findIndex((s) => s.info.serviceKey === "ns8/udp");
        next[i] = makeState({
          ns: "ns8",
          name: "udp",
          clusterIP: "172.30.0.48",
          protocol: "UDP",
          portNum: 53,
          nodePort: 30053,
        }, [
          { ip: "10.180.0.8", port: 5353 },
        ]);
        const r2 = await dp.sync(snapshot(next, { changed: ["ns1/svc1", "ns8/udp"] }));
        assert.equal(r2.full, false);
        assert.ok(dp.lastPayload!.deleted.length >= 4);
        const save2 = (await runner.run({ cmd: tools.save, args: ["-t", "nat"] })).stdout;
        const chains2 = chainsOf(save2);
        for (const c of dp.lastPayload!.deleted) assert.ok(!chains2.has(c), `${c} deleted`);
        assert.ok(!save2.includes("ns1/svc1"));
        assert.ok(!save2.includes("10.180.0.9"));
        // Jump rules are still there exactly once.
        assert.equal(save2.match(/-A PREROUTING .*-j KUBE-SERVICES/g)?.length, 1);

        // Another full sync (periodic): no duplicate jumps, nothing left behind.
        await dp.sync(snapshot(next));
        const save3 = (await runner.run({ cmd: tools.save, args: [] })).stdout;
        assert.equal(save3.match(/-A INPUT .*-j KUBE-EXTERNAL-SERVICES/g)?.length, 1);

        // External flush: the canary goes, the next full sync brings everything back.
        await runner.run({ cmd: tools.iptables, args: ["-t", "mangle", "-X", "KUBE-PROXY-CANARY"] });
        await runner.run({ cmd: tools.iptables, args: ["-t", "nat", "-F", "PREROUTING"] });
        assert.equal(await dp.needsFullSync(), true);
        const r4 = await dp.sync(snapshot(next, { changed: [] }));
        assert.equal(r4.full, true);
        const save4 = (await runner.run({ cmd: tools.save, args: ["-t", "nat"] })).stdout;
        assert.equal(save4.match(/-A PREROUTING .*-j KUBE-SERVICES/g)?.length, 1);
      }),
  });
}

privilegedTest(unavailable, {
  name: "netns legacy IPv6: payload accepted by ip6tables-legacy-restore",
  fn: () =>
    withNetns(async (runner) => {
      const dp = new IptablesDataplane({
        family: "IPv6",
        runner,
        backend: "legacy",
        localDetector: detectLocalByCIDR("fd00::/48"),
      });
      await dp.sync(snapshot([
        makeState({
          ns: "a",
          name: "v6",
          clusterIP: "fd00:1::10",
          nodePort: 30010,
          lbVIPs: ["2001:db8::1"],
          sourceRanges: ["2001:db8:1::/48"],
          affinity: 60,
        }, [
          { ip: "fd00::5" },
          { ip: "fd00::6", local: true },
        ]),
        makeState({ ns: "a", name: "none", clusterIP: "fd00:1::11" }, []),
      ], { family: "IPv6", nodeIPs: ["fd00::2"] }));
      const save = (await runner.run({ cmd: "ip6tables-legacy-save", args: ["-t", "nat"] })).stdout;
      assert.ok(save.includes("--to-destination [fd00::5]:80"));
    }),
});

for (const backend of ["legacy", "nft"] as IptablesBackend[]) {
  privilegedTest(unavailable, {
    name:
      `netns ${backend}: periodic full sync restores a jump deleted with the canary intact; kubelet's KUBE-FIREWALL jumps ensured without localhost NodePorts, its rules kept`,
    fn: () =>
      withNetns(async (runner) => {
        const tools = iptablesTools(backend, "IPv4");
        const ipt = (...args: string[]) => runner.run({ cmd: tools.iptables, args });
        // kubelet got there first with its own rule in KUBE-FIREWALL (but no jumps yet).
        await ipt("-t", "filter", "-N", "KUBE-FIREWALL");
        await ipt(
          "-t",
          "filter",
          "-A",
          "KUBE-FIREWALL",
          "-m",
          "comment",
          "--comment",
          "kubelet rule",
          "-j",
          "RETURN",
        );
        const dp = new IptablesDataplane({
          family: "IPv4",
          runner,
          backend,
          localDetector: detectLocalByCIDR("10.0.0.0/8"),
          localhostNodePorts: false,
        });
        const states = overallFixture();
        await dp.sync(snapshot(states));
        const filter = async () => (await runner.run({ cmd: tools.save, args: ["-t", "filter"] })).stdout;
        let f = await filter();
        assert.equal(f.match(/^-A INPUT -j KUBE-FIREWALL$/gm)?.length, 1);
        assert.equal(f.match(/^-A OUTPUT -j KUBE-FIREWALL$/gm)?.length, 1);
        assert.match(
          f.split("\n").find((l) => l.startsWith("-A INPUT "))!,
          /-j KUBE-FIREWALL$/,
          "first in INPUT",
        );
        assert.ok(f.includes('--comment "kubelet rule" -j RETURN'), "kubelet's rule is not flushed");

        // An external tool deletes one jump; the canary stays, so only the periodic full sync can notice.
        await ipt(
          "-t",
          "nat",
          "-D",
          "PREROUTING",
          "-m",
          "comment",
          "--comment",
          "kubernetes service portals",
          "-j",
          "KUBE-SERVICES",
        );
        await ipt("-t", "filter", "-D", "OUTPUT", "-j", "KUBE-FIREWALL");
        assert.equal(await dp.needsFullSync(), false);
        await dp.sync(snapshot(states)); // periodic: changedServices null
        const nat = (await runner.run({ cmd: tools.save, args: ["-t", "nat"] })).stdout;
        assert.equal(nat.match(/^-A PREROUTING .*-j KUBE-SERVICES$/gm)?.length, 1);
        f = await filter();
        assert.equal(f.match(/^-A OUTPUT -j KUBE-FIREWALL$/gm)?.length, 1);
        assert.equal(f.match(/^-A INPUT -j KUBE-FIREWALL$/gm)?.length, 1);
        assert.equal(f.match(/^-A INPUT .*-j KUBE-EXTERNAL-SERVICES$/gm)?.length, 1, "no duplicates");
        assert.ok(f.includes('--comment "kubelet rule" -j RETURN'));
      }),
  });
}
