/**
 * Real kernel, without IPVS (the host has none) and without the dummy module: the ipvs dataplane's ipset
 * restore and iptables-restore payloads applied inside a throwaway network namespace (legacy and nft
 * backends), checked with `ipset save` and `iptables-save`; a partial sync and a full resync that repairs
 * members changed behind its back. `ipvsadm` and `ip -force -batch -` are recorded, not run: the host kernel
 * has neither ip_vs nor the dummy link type (the VM suite under tests/packets runs them for real).
 */
import assert from "node:assert/strict";
import { IpvsDataplane } from "../../../lib/dataplane/ipvs/dataplane.ts";
import { type IptablesBackend, iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables_local_detector.ts";
import type { CommandResult, CommandRunner, CommandSpec } from "../../../lib/exec.ts";
import { configureLogging } from "../../../lib/log.ts";
import { FakeClock } from "../../../lib/proxy/clock.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { type NetnsRunner, netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";

configureLogging({ sink: () => {} });

/** Runs ipset, iptables and `ip -j addr show` in the namespace; records ipvsadm and the ip batches. */
class HalfRealRunner implements CommandRunner {
  readonly faked: CommandSpec[] = [];
  constructor(private readonly ns: NetnsRunner) {}
  async tryRun(spec: CommandSpec): Promise<CommandResult> {
    if (spec.cmd === "ipvsadm" || (spec.cmd === "ip" && spec.args[0] === "-force")) {
      this.faked.push(spec);
      return { code: 0, stdout: "", stderr: "" };
    }
    return await this.ns.tryRun(spec);
  }
  async run(spec: CommandSpec): Promise<CommandResult> {
    const r = await this.tryRun(spec);
    if (r.code !== 0) throw new Error(`${spec.cmd} ${spec.args.join(" ")}: ${r.stderr}`);
    return r;
  }
}

const services = (eps: { ip: string; local?: boolean }[]) => [
  makeState({ ns: "ns1", name: "np", clusterIP: "172.30.0.41", nodePort: 30001 }, eps),
  makeState({
    ns: "ns2",
    name: "lb",
    clusterIP: "172.30.0.42",
    lbVIPs: ["5.6.7.8"],
    // Holds the node IP: no KUBE-IPVS-OUT-FILTER rule, whose `-m ipvs` match needs ip_vs in the kernel.
    sourceRanges: ["192.168.0.0/16", "203.0.113.0/24"],
    eTPLocal: true,
    nodePort: 30002,
    hcnp: 31000,
    affinity: 300,
  }, [{ ip: "10.180.0.9", local: true }]),
  makeState({ ns: "ns3", name: "ext", clusterIP: "172.30.0.43", externalIPs: ["192.168.99.33"] }, [{
    ip: "10.180.0.5",
  }]),
  makeState({ ns: "ns4", name: "udp", protocol: "UDP", clusterIP: "172.30.0.44", nodePort: 30053 }, [{
    ip: "10.180.0.6",
  }]),
  makeState({ ns: "ns5", name: "sctp", protocol: "SCTP", clusterIP: "172.30.0.45", nodePort: 30132 }, [{
    ip: "10.180.0.7",
  }]),
];

function members(save: string): string[] {
  return save.split("\n").filter((l) => l.startsWith("add ")).sort();
}

for (const backend of ["legacy", "nft"] as IptablesBackend[]) {
  privilegedTest(netnsUnavailableReason(), {
    name:
      `netns ${backend}: ipset and iptables payloads of full and partial syncs apply; a full resync repairs`,
    fn: () =>
      withNetns(async (ns) => {
        await ns.run({ cmd: "ip", args: ["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"] });
        await ns.run({ cmd: "ip", args: ["addr", "add", "192.168.0.2/24", "dev", "eth0"] });
        const r = new HalfRealRunner(ns);
        const dp = new IpvsDataplane({
          family: "IPv4",
          runner: r,
          iptables: iptablesTools(backend, "IPv4"),
          localDetector: detectLocalByCIDR("10.0.0.0/8"),
          clock: new FakeClock(0),
        });
        await dp.sync(snapshot(services([{ ip: "10.180.0.1" }, { ip: "10.180.0.2", local: true }])));
        let save = (await ns.run({ cmd: "ipset", args: ["save"] })).stdout;
        assert.equal(save.split("\n").filter((l) => l.startsWith("create KUBE-")).length, 17);
        const expected = [
          "add KUBE-CLUSTER-IP 172.30.0.41,tcp:80",
          "add KUBE-CLUSTER-IP 172.30.0.42,tcp:80",
          "add KUBE-CLUSTER-IP 172.30.0.43,tcp:80",
          "add KUBE-CLUSTER-IP 172.30.0.44,udp:80",
          "add KUBE-CLUSTER-IP 172.30.0.45,sctp:80",
          "add KUBE-EXTERNAL-IP 192.168.99.33,tcp:80",
          "add KUBE-HEALTH-CHECK-NODE-PORT 31000",
          "add KUBE-IPVS-IPS 172.30.0.41",
          "add KUBE-IPVS-IPS 172.30.0.42",
          "add KUBE-IPVS-IPS 172.30.0.43",
          "add KUBE-IPVS-IPS 172.30.0.44",
          "add KUBE-IPVS-IPS 172.30.0.45",
          "add KUBE-IPVS-IPS 192.168.99.33",
          "add KUBE-IPVS-IPS 5.6.7.8",
          "add KUBE-LOAD-BALANCER 5.6.7.8,tcp:80",
          "add KUBE-LOAD-BALANCER-FW 5.6.7.8,tcp:80",
          "add KUBE-LOAD-BALANCER-LOCAL 5.6.7.8,tcp:80",
          "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,192.168.0.0/16",
          "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,203.0.113.0/24",
          "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.8,tcp:80,5.6.7.8",
          "add KUBE-LOOP-BACK 10.180.0.2,tcp:80,10.180.0.2",
          "add KUBE-LOOP-BACK 10.180.0.9,tcp:80,10.180.0.9",
          "add KUBE-NODE-PORT-LOCAL-TCP 30002",
          "add KUBE-NODE-PORT-SCTP-HASH 192.168.0.2,sctp:30132",
          "add KUBE-NODE-PORT-TCP 30001",
          "add KUBE-NODE-PORT-TCP 30002",
          "add KUBE-NODE-PORT-UDP 30053",
        ];
        assert.deepEqual(members(save), expected);
        const tools = iptablesTools(backend, "IPv4");
        const nat = (await ns.run({ cmd: tools.save, args: ["-t", "nat"] })).stdout;
        assert.match(nat, /-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES/);
        assert.match(
          nat,
          /-A KUBE-SERVICES ! -s 10.0.0.0\/8 -m comment --comment "Kubernetes service cluster ip \+ port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ/,
        );
        assert.match(
          nat,
          /-A KUBE-NODE-PORT -p sctp .*--match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ/,
        );
        const filter = (await ns.run({ cmd: tools.save, args: ["-t", "filter"] })).stdout;
        assert.match(
          filter,
          /-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT/,
        );
        assert.equal(filter.match(/-A INPUT /g)?.length, 3);

        // Partial: one endpoint goes (no ipset call needed: its members are unchanged), a Service goes.
        const next = services([{ ip: "10.180.0.1" }]).filter((s) => s.info.serviceKey !== "ns3/ext");
        await dp.sync(snapshot(next, { changed: ["ns1/np", "ns3/ext"] }));
        save = (await ns.run({ cmd: "ipset", args: ["save"] })).stdout;
        const afterPartial = expected.filter((l) =>
          !l.includes("10.180.0.2") && !l.includes("172.30.0.43") && !l.includes("192.168.99.33")
        );
        assert.deepEqual(members(save), afterPartial);
        const filter2 = (await ns.run({ cmd: tools.save, args: ["-t", "nat"] })).stdout;
        assert.ok(!filter2.includes("KUBE-EXTERNAL-IP "), "the empty KUBE-EXTERNAL-IP set's rules are gone");

        // Behind our back: a member removed, a stranger added; the next full sync repairs both.
        await ns.run({ cmd: "ipset", args: ["del", "KUBE-CLUSTER-IP", "172.30.0.41,tcp:80"] });
        await ns.run({ cmd: "ipset", args: ["add", "KUBE-CLUSTER-IP", "172.30.9.9,tcp:80"] });
        await dp.sync(snapshot(next));
        save = (await ns.run({ cmd: "ipset", args: ["save"] })).stdout;
        assert.deepEqual(members(save), afterPartial);
        // The jumps were found by the full sync's scan: not inserted twice.
        const filter3 = (await ns.run({ cmd: tools.save, args: ["-t", "filter"] })).stdout;
        assert.equal(filter3.match(/-A INPUT /g)?.length, 3);
        dp.stop();
      }),
  });
}
