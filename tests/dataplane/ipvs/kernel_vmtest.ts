/**
 * The ipvs dataplane against a real IPVS kernel (inside the IPVS VM: `*_vmtest.ts`), in a throwaway network
 * namespace with every program run for real: `ipvsadm -R`, `ipset restore`, `ip -force -batch -` and
 * `iptables-restore` must accept every batch the dataplane writes (the kernel's own judgement of the
 * restore grammar), `ipvsadm -S -n`, `ipset save` and `ip -j addr show` must show exactly what was meant,
 * and the dataplane's parsers must read that back: a second dataplane's full sync over the same kernel finds
 * nothing to write. Every Service shape, IPv6 (kube-ipvs0 and `KUBE-6-` sets, `-m ipvs` in ip6tables), the
 * mh scheduler, partial syncs, the drain check on `ipvsadm -L -n` with a live connection, the drift checks.
 *
 * Standalone: `bash scripts/ipvs_vm.sh test tests/dataplane/ipvs/kernel_vmtest.ts`.
 */
import assert from "node:assert/strict";
import { IpvsDataplane, type IpvsDataplaneOptions } from "../../../lib/dataplane/ipvs/dataplane.ts";
import { iptablesTools } from "../../../lib/dataplane/iptables_backend.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables_local_detector.ts";
import { configureLogging } from "../../../lib/log.ts";
import { FakeClock } from "../../../lib/proxy/clock.ts";
import type { IPFamily, ServicePortState } from "../../../lib/proxy/types.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { ipvsKernelUnavailableReason } from "../../../testkit/ipvs_vm.ts";
import { NetnsRunner, withNetns } from "../../../testkit/netns.ts";
import { Sandbox } from "../../../testkit/sandbox.ts";

configureLogging({ sink: () => {} });
const unavailable = ipvsKernelUnavailableReason(["iptables-save", "ip6tables-save"]);
if (unavailable) console.log(`ipvs kernel tests skipped: ${unavailable}`);

const NODE4 = "192.168.0.2";
const NODE4B = "192.168.1.2";
const NODE6 = "fd00:77::2";

/** eth0 (veth) with two IPv4 node addresses and an IPv6 one, as a node has. */
async function nodeLinks(ns: NetnsRunner): Promise<void> {
  await ns.run({ cmd: "ip", args: ["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"] });
  await ns.run({ cmd: "ip", args: ["addr", "add", `${NODE4}/24`, "dev", "eth0"] });
  await ns.run({ cmd: "ip", args: ["addr", "add", `${NODE4B}/24`, "dev", "eth0"] });
  await ns.run({ cmd: "ip", args: ["addr", "add", `${NODE6}/64`, "dev", "eth0", "nodad"] });
  await ns.run({ cmd: "ip", args: ["link", "set", "eth0", "up"] });
  await ns.run({ cmd: "ip", args: ["link", "set", "eth1", "up"] });
}

function dataplane(ns: NetnsRunner, family: IPFamily, o: Partial<IpvsDataplaneOptions> = {}) {
  return new IpvsDataplane({
    family,
    runner: ns,
    iptables: iptablesTools("system", family),
    localDetector: detectLocalByCIDR(family === "IPv4" ? "10.180.0.0/16" : "fd00:180::/64"),
    clock: new FakeClock(0),
    keepLastBatches: true,
    ...o,
  });
}

/** The IPv4 corpus: every shape the mode renders. */
function services4(eps2 = [{ ip: "10.180.0.1" }, { ip: "10.180.0.2", local: true }]): ServicePortState[] {
  return [
    makeState({ ns: "a", name: "cip", clusterIP: "172.30.0.1" }, eps2),
    makeState({ ns: "a", name: "np", clusterIP: "172.30.0.2", nodePort: 30001 }, [{ ip: "10.180.0.3" }]),
    makeState({
      ns: "a",
      name: "lb",
      clusterIP: "172.30.0.3",
      lbVIPs: ["5.6.7.8"],
      // Without the node IP: a KUBE-IPVS-OUT-FILTER rule with `-m ipvs`.
      sourceRanges: ["203.0.113.0/24", "198.51.100.7/32"],
      nodePort: 30002,
    }, [{ ip: "10.180.0.4" }]),
    makeState({
      ns: "a",
      name: "lb-local",
      clusterIP: "172.30.0.4",
      lbVIPs: ["5.6.7.9"],
      sourceRanges: ["192.168.0.0/16"],
      eTPLocal: true,
      nodePort: 30003,
      hcnp: 31000,
      affinity: 300,
    }, [{ ip: "10.180.0.5", local: true }, { ip: "10.180.0.6" }]),
    // One external IP is a node address: a virtual server, but not bound on kube-ipvs0.
    makeState(
      { ns: "a", name: "ext", clusterIP: "172.30.0.5", externalIPs: ["198.51.100.33", NODE4B] },
      [{ ip: "10.180.0.7" }],
    ),
    makeState(
      { ns: "a", name: "ext-local", clusterIP: "172.30.0.6", externalIPs: ["198.51.100.34"], eTPLocal: true },
      [{ ip: "10.180.0.8", local: true }],
    ),
    makeState({
      ns: "a",
      name: "udp",
      protocol: "UDP",
      clusterIP: "172.30.0.7",
      portNum: 53,
      nodePort: 30053,
    }, [
      { ip: "10.180.0.9", port: 5353 },
    ]),
    makeState({ ns: "a", name: "sctp", protocol: "SCTP", clusterIP: "172.30.0.8", nodePort: 30132 }, [
      { ip: "10.180.0.10" },
    ]),
    makeState({ ns: "a", name: "noep", clusterIP: "172.30.0.9", nodePort: 30009 }, []),
    makeState({ ns: "a", name: "itp", clusterIP: "172.30.0.10", iTPLocal: true }, [
      { ip: "10.180.0.11", local: true },
      { ip: "10.180.0.12" },
    ]),
  ];
}

/** The IPv6 corpus (a non-canonical endpoint address among them: the model writes what it is given). */
function services6(): ServicePortState[] {
  return [
    makeState({ ns: "b", name: "cip6", clusterIP: "fd00:96::1" }, [{ ip: "fd00:180::1" }, {
      ip: "fd00:180::2",
      local: true,
    }]),
    makeState({
      ns: "b",
      name: "lb6",
      clusterIP: "fd00:96::2",
      lbVIPs: ["2001:db8::5"],
      sourceRanges: ["2001:db8:1::/64"],
      nodePort: 30601,
    }, [{ ip: "fd00:180::3" }]),
    makeState({ ns: "b", name: "udp6", protocol: "UDP", clusterIP: "fd00:96::3", portNum: 53 }, [
      { ip: "fd00:180::4", port: 53 },
    ]),
  ];
}

async function run(ns: NetnsRunner, cmd: string, ...args: string[]): Promise<string> {
  return (await ns.run({ cmd, args })).stdout;
}

/** `ipvsadm -S -n` lines of one family, sorted. */
async function savedVS(ns: NetnsRunner, family: IPFamily): Promise<string[]> {
  return (await run(ns, "ipvsadm", "-S", "-n")).split("\n").filter((l) => l !== "")
    .filter((l) => l.includes("[") === (family === "IPv6")).sort();
}

/** A second dataplane's full sync over the same kernel: it must find nothing to write. */
async function assertReadsBack(
  ns: NetnsRunner,
  family: IPFamily,
  states: ServicePortState[],
  nodeIPs: string[],
  o: Partial<IpvsDataplaneOptions> = {},
) {
  const fresh = dataplane(ns, family, o);
  await fresh.sync(snapshot(states, { family, nodeIPs }));
  const b = fresh.lastBatches!;
  assert.equal(b.ipvsadm, "", `ipvsadm batch of a fresh full sync (parsers disagree with the kernel)`);
  assert.equal(b.ip, "", "ip batch of a fresh full sync");
  const ipsetWrites = b.ipset.split("\n").filter((l) => l !== "" && !l.startsWith("create "));
  assert.deepEqual(ipsetWrites, [], "ipset writes of a fresh full sync");
  fresh.stop();
}

Deno.test({
  name:
    "ipvs kernel: every IPv4 shape applies; ipvsadm -S -n, ipset save and kube-ipvs0 are as meant and read back",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await nodeLinks(ns);
      const dp = dataplane(ns, "IPv4");
      const states = services4();
      const res = await dp.sync(snapshot(states, { nodeIPs: [NODE4] }));
      assert.equal(res.full, true);
      const nps = (port: number, proto = "-t") => [NODE4, NODE4B].map((ip) => `${proto} ${ip}:${port}`);
      const expected = [
        "-A -t 172.30.0.1:80 -s rr",
        "-a -t 172.30.0.1:80 -r 10.180.0.1:80 -m -w 1",
        "-a -t 172.30.0.1:80 -r 10.180.0.2:80 -m -w 1",
        "-A -t 172.30.0.2:80 -s rr",
        "-a -t 172.30.0.2:80 -r 10.180.0.3:80 -m -w 1",
        ...nps(30001).flatMap((k) => [`-A ${k} -s rr`, `-a ${k} -r 10.180.0.3:80 -m -w 1`]),
        "-A -t 172.30.0.3:80 -s rr",
        "-a -t 172.30.0.3:80 -r 10.180.0.4:80 -m -w 1",
        "-A -t 5.6.7.8:80 -s rr",
        "-a -t 5.6.7.8:80 -r 10.180.0.4:80 -m -w 1",
        ...nps(30002).flatMap((k) => [`-A ${k} -s rr`, `-a ${k} -r 10.180.0.4:80 -m -w 1`]),
        // eTP=Local: the LB and NodePort virtual servers only have the local endpoint; affinity everywhere.
        "-A -t 172.30.0.4:80 -s rr -p 300",
        "-a -t 172.30.0.4:80 -r 10.180.0.5:80 -m -w 1",
        "-a -t 172.30.0.4:80 -r 10.180.0.6:80 -m -w 1",
        "-A -t 5.6.7.9:80 -s rr -p 300",
        "-a -t 5.6.7.9:80 -r 10.180.0.5:80 -m -w 1",
        ...nps(30003).flatMap((k) => [`-A ${k} -s rr -p 300`, `-a ${k} -r 10.180.0.5:80 -m -w 1`]),
        "-A -t 172.30.0.5:80 -s rr",
        "-a -t 172.30.0.5:80 -r 10.180.0.7:80 -m -w 1",
        "-A -t 198.51.100.33:80 -s rr",
        "-a -t 198.51.100.33:80 -r 10.180.0.7:80 -m -w 1",
        `-A -t ${NODE4B}:80 -s rr`,
        `-a -t ${NODE4B}:80 -r 10.180.0.7:80 -m -w 1`,
        "-A -t 172.30.0.6:80 -s rr",
        "-a -t 172.30.0.6:80 -r 10.180.0.8:80 -m -w 1",
        "-A -t 198.51.100.34:80 -s rr",
        "-a -t 198.51.100.34:80 -r 10.180.0.8:80 -m -w 1",
        "-A -u 172.30.0.7:53 -s rr",
        "-a -u 172.30.0.7:53 -r 10.180.0.9:5353 -m -w 1",
        ...nps(30053, "-u").flatMap((k) => [`-A ${k} -s rr`, `-a ${k} -r 10.180.0.9:5353 -m -w 1`]),
        "-A --sctp-service 172.30.0.8:80 -s rr",
        "-a --sctp-service 172.30.0.8:80 -r 10.180.0.10:80 -m -w 1",
        ...nps(30132, "--sctp-service").flatMap((
          k,
        ) => [`-A ${k} -s rr`, `-a ${k} -r 10.180.0.10:80 -m -w 1`]),
        "-A -t 172.30.0.9:80 -s rr",
        ...nps(30009).map((k) => `-A ${k} -s rr`),
        "-A -t 172.30.0.10:80 -s rr",
        "-a -t 172.30.0.10:80 -r 10.180.0.11:80 -m -w 1",
      ].sort();
      assert.deepEqual(await savedVS(ns, "IPv4"), expected);

      const link = JSON.parse(await run(ns, "ip", "-j", "addr", "show", "dev", "kube-ipvs0"))[0];
      assert.ok(!link.flags.includes("UP"), "kube-ipvs0 stays down, as upstream");
      const bound = link.addr_info.map((a: { local: string; prefixlen: number }) =>
        `${a.local}/${a.prefixlen}`
      )
        .sort();
      assert.deepEqual(
        bound,
        [
          ...["172.30.0.1", "172.30.0.2", "172.30.0.3", "172.30.0.4", "172.30.0.5", "172.30.0.6"],
          ...["172.30.0.7", "172.30.0.8", "172.30.0.9", "172.30.0.10", "198.51.100.33", "198.51.100.34"],
          ...["5.6.7.8", "5.6.7.9"],
        ].map((ip) => `${ip}/32`).sort(),
      );
      const local = await run(ns, "ip", "route", "show", "table", "local", "dev", "kube-ipvs0");
      assert.match(local, /^local 5\.6\.7\.8 /m, "a bound address is local even on a down interface");

      const sets = await run(ns, "ipset", "save");
      const members = sets.split("\n").filter((l) => l.startsWith("add ")).sort();
      for (
        const m of [
          "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,198.51.100.7",
          "add KUBE-LOAD-BALANCER-SOURCE-CIDR 5.6.7.8,tcp:80,203.0.113.0/24",
          "add KUBE-LOAD-BALANCER-SOURCE-IP 5.6.7.9,tcp:80,5.6.7.9",
          `add KUBE-NODE-PORT-SCTP-HASH ${NODE4},sctp:30132`,
          `add KUBE-NODE-PORT-SCTP-HASH ${NODE4B},sctp:30132`,
          "add KUBE-NODE-PORT-UDP 30053",
          "add KUBE-NODE-PORT-LOCAL-TCP 30003",
          "add KUBE-HEALTH-CHECK-NODE-PORT 31000",
          "add KUBE-EXTERNAL-IP-LOCAL 198.51.100.34,tcp:80",
          "add KUBE-LOOP-BACK 10.180.0.2,tcp:80,10.180.0.2",
        ]
      ) assert.ok(members.includes(m), `${m} in:\n${members.join("\n")}`);
      const filter = await run(ns, "iptables-save", "-t", "filter");
      assert.match(
        filter,
        /-A KUBE-IPVS-OUT-FILTER -s 5\.6\.7\.8\/32 -m ipvs --vproto 6 --vaddr 5\.6\.7\.8 --vport 80 -j DROP/,
      );

      await assertReadsBack(ns, "IPv4", states, [NODE4]);
      // Quiet: nothing changed behind the dataplane's back.
      assert.equal(await dp.needsFullSync(), false);
      dp.stop();
    }),
});

Deno.test({
  name:
    "ipvs kernel: IPv6 virtual servers, kube-ipvs0 addresses (local while the link is down), KUBE-6- sets, -m ipvs",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await nodeLinks(ns);
      const dp6 = dataplane(ns, "IPv6");
      const dp4 = dataplane(ns, "IPv4");
      await dp4.sync(snapshot(services4().slice(0, 2), { nodeIPs: [NODE4] }));
      await dp6.sync(snapshot(services6(), { family: "IPv6", nodeIPs: [NODE6] }));
      assert.deepEqual(
        await savedVS(ns, "IPv6"),
        [
          "-A -t [fd00:96::1]:80 -s rr",
          "-a -t [fd00:96::1]:80 -r [fd00:180::1]:80 -m -w 1",
          "-a -t [fd00:96::1]:80 -r [fd00:180::2]:80 -m -w 1",
          "-A -t [fd00:96::2]:80 -s rr",
          "-a -t [fd00:96::2]:80 -r [fd00:180::3]:80 -m -w 1",
          "-A -t [2001:db8::5]:80 -s rr",
          "-a -t [2001:db8::5]:80 -r [fd00:180::3]:80 -m -w 1",
          `-A -t [${NODE6}]:30601 -s rr`,
          `-a -t [${NODE6}]:30601 -r [fd00:180::3]:80 -m -w 1`,
          "-A -u [fd00:96::3]:53 -s rr",
          "-a -u [fd00:96::3]:53 -r [fd00:180::4]:53 -m -w 1",
        ].sort(),
      );
      // The IPv4 dataplane's virtual servers are untouched by the IPv6 one, and the other way round.
      assert.equal((await savedVS(ns, "IPv4")).filter((l) => l.startsWith("-A")).length, 4);
      const addrs = await run(ns, "ip", "-6", "-o", "addr", "show", "dev", "kube-ipvs0");
      for (const ip of ["fd00:96::1", "fd00:96::2", "fd00:96::3", "2001:db8::5"]) {
        assert.match(addrs, new RegExp(` ${ip}/128 `));
      }
      assert.doesNotMatch(addrs, /tentative|dadfailed/, "usable at once (the dummy has no DAD)");
      const routes = await run(ns, "ip", "-6", "route", "show", "table", "local");
      assert.match(routes, /^local fd00:96::1 dev kube-ipvs0 /m);
      const sets = await run(ns, "ipset", "save");
      assert.match(sets, /^create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 /m);
      assert.match(sets, /^add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8::5,tcp:80,2001:db8:1::\/64$/m);
      assert.match(sets, /^add KUBE-6-CLUSTER-IP fd00:96::1,tcp:80$/m);
      assert.match(sets, /^add KUBE-6-IPVS-IPS fd00:96::3$/m);
      const filter = await run(ns, "ip6tables-save", "-t", "filter");
      assert.match(
        filter,
        /-A KUBE-IPVS-OUT-FILTER -s 2001:db8::5\/128 -m ipvs --vproto 6 --vaddr 2001:db8::5 /,
      );
      const nat = await run(ns, "ip6tables-save", "-t", "nat");
      assert.match(nat, /-A KUBE-SERVICES -s ::1\/128 -j RETURN/);
      assert.match(nat, /--match-set KUBE-6-CLUSTER-IP dst,dst -j ACCEPT/);
      await assertReadsBack(ns, "IPv6", services6(), [NODE6]);
      await assertReadsBack(ns, "IPv4", services4().slice(0, 2), [NODE4]);
      dp4.stop();
      dp6.stop();
    }),
});

Deno.test({
  name: "ipvs kernel: the mh scheduler with its flag, -E on an affinity change, partial syncs read back",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await nodeLinks(ns);
      const dp = dataplane(ns, "IPv4", { scheduler: "mh" });
      const svc = (affinity: number, eps: { ip: string }[]) =>
        makeState({ ns: "a", name: "m", clusterIP: "172.30.0.1", nodePort: 30001, affinity }, eps);
      await dp.sync(snapshot([svc(0, [{ ip: "10.180.0.1" }])], { nodeIPs: [NODE4] }));
      assert.ok(
        (await savedVS(ns, "IPv4")).includes("-A -t 172.30.0.1:80 -s mh -b mh-port"),
        (await savedVS(ns, "IPv4")).join("\n"),
      );
      const next = [svc(60, [{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])];
      const res = await dp.sync(snapshot(next, { nodeIPs: [NODE4], changed: ["a/m"] }));
      assert.equal(res.full, false);
      assert.match(dp.lastBatches!.ipvsadm, /^-E -t 172\.30\.0\.1:80 -s mh -p 60 -b mh-port$/m);
      let vs = await savedVS(ns, "IPv4");
      assert.ok(vs.includes("-A -t 172.30.0.1:80 -s mh -p 60 -b mh-port"), vs.join("\n"));
      await assertReadsBack(ns, "IPv4", next, [NODE4], { scheduler: "mh" });
      // Affinity off again: -E without -p clears the persistence.
      const back = [svc(0, [{ ip: "10.180.0.1" }, { ip: "10.180.0.2" }])];
      await dp.sync(snapshot(back, { nodeIPs: [NODE4], changed: ["a/m"] }));
      vs = await savedVS(ns, "IPv4");
      assert.ok(vs.includes("-A -t 172.30.0.1:80 -s mh -b mh-port"), vs.join("\n"));
      await assertReadsBack(ns, "IPv4", back, [NODE4], { scheduler: "mh" });
      dp.stop();
    }),
});

Deno.test({
  name:
    "ipvs kernel: partial syncs (endpoint removed and drained, Service removed, address unbound) read back",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await nodeLinks(ns);
      const dp = dataplane(ns, "IPv4");
      await dp.sync(snapshot(services4(), { nodeIPs: [NODE4] }));
      // 10.180.0.2 leaves a/cip (TCP: drained with weight 0), a/ext and a/udp go.
      const next = services4([{ ip: "10.180.0.1" }]).filter((s) =>
        !["a/ext", "a/udp"].includes(s.info.serviceKey)
      );
      const res = await dp.sync(snapshot(next, { nodeIPs: [NODE4], changed: ["a/cip", "a/ext", "a/udp"] }));
      assert.equal(res.full, false);
      const vs = await savedVS(ns, "IPv4");
      assert.ok(vs.includes("-a -t 172.30.0.1:80 -r 10.180.0.2:80 -m -w 0"), vs.join("\n"));
      assert.ok(!vs.some((l) => l.includes("198.51.100.33") || l.includes("172.30.0.7")), vs.join("\n"));
      const addrs = await run(ns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0");
      assert.doesNotMatch(addrs, / 198\.51\.100\.33\/| 172\.30\.0\.7\//);
      assert.deepEqual(dp.drainingRealServers(), ["-t 172.30.0.1:80 -r 10.180.0.2:80"]);
      await assertReadsBack(ns, "IPv4", next, [NODE4]);
      // No connection ever used it: the drain check (on the real `ipvsadm -L -n`) deletes it.
      assert.deepEqual(await dp.checkDraining(), ["-t 172.30.0.1:80 -r 10.180.0.2:80"]);
      assert.ok(!(await savedVS(ns, "IPv4")).some((l) => l.includes("10.180.0.2")));
      dp.stop();
    }),
});

Deno.test({
  name: "ipvs kernel: drift checks see a cleared IPVS table, a flushed nat KUBE-SERVICES, a lost address",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await nodeLinks(ns);
      const dp = dataplane(ns, "IPv4");
      const states = services4();
      const sync = async (full: boolean) => {
        const res = await dp.sync(snapshot(states, { nodeIPs: [NODE4], changed: [] }));
        assert.equal(res.full, full);
        assert.equal(await dp.needsFullSync(), false);
      };
      await dp.sync(snapshot(states, { nodeIPs: [NODE4] }));
      assert.equal(await dp.needsFullSync(), false);
      const before = await savedVS(ns, "IPv4");
      for (
        const [what, cmd] of [
          ["ipvsadm -C", ["ipvsadm", "-C"]],
          ["iptables -t nat -F KUBE-SERVICES", ["iptables", "-t", "nat", "-F", "KUBE-SERVICES"]],
          ["ip addr del", ["ip", "addr", "del", "172.30.0.5/32", "dev", "kube-ipvs0"]],
          ["ip link del kube-ipvs0", ["ip", "link", "del", "kube-ipvs0"]],
          ["ipset flush", ["ipset", "flush", "KUBE-CLUSTER-IP"]],
        ] as const
      ) {
        await ns.run({ cmd: cmd[0], args: [...cmd.slice(1)] });
        assert.equal(await dp.needsFullSync(), true, what);
        await sync(true);
        assert.deepEqual(await savedVS(ns, "IPv4"), before, `repaired after ${what}`);
        await assertReadsBack(ns, "IPv4", states, [NODE4]);
      }
      dp.stop();
    }),
});

Deno.test({
  name:
    "ipvs kernel: graceful termination on real connections: kept while open or closing, deleted once expired",
  ignore: unavailable !== undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async () => {
    await using sb = await Sandbox.create({ pods: ["pod-a", "pod-b"] });
    const [a, b] = [sb.pod("pod-a"), sb.pod("pod-b")];
    await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080] })));
    const ns = new NetnsRunner(sb.node);
    await ns.run({ cmd: "sysctl", args: ["-q", "-w", "net.ipv4.vs.conntrack=1", "net.ipv4.ip_forward=1"] });
    const dp = dataplane(ns, "IPv4", { localDetector: detectLocalByCIDR(sb.podCIDR) });
    const svc = (eps: { ip: string }[]) =>
      makeState({ ns: "a", name: "g", clusterIP: "172.30.0.1" }, eps.map((e) => ({ ...e, port: 8080 })));
    await dp.sync(snapshot([svc([{ ip: a.ip }])], { nodeIPs: [sb.nodeIP] }));
    const pc = await sb.probe(sb.client);
    await sb.ip(sb.client, "route", "add", "172.30.0.0/16", "via", sb.nodeIP);
    const held = await pc.open("172.30.0.1", 80, { timeoutMs: 3000 });
    assert.equal(held.result, "ok", JSON.stringify(held));
    assert.match(held.answer!, /^pod-a /);

    await dp.sync(snapshot([svc([{ ip: b.ip }])], { nodeIPs: [sb.nodeIP], changed: ["a/g"] }));
    const rs = `-t 172.30.0.1:80 -r ${a.ip}:8080`;
    assert.deepEqual(dp.drainingRealServers(), [rs]);
    const listed = async () => (await run(ns, "ipvsadm", "-L", "-n", "-t", "172.30.0.1:80"));
    // ActiveConn 1 in the real listing: kept.
    assert.deepEqual(await dp.checkDraining(), [], await listed());
    assert.match(await listed(), new RegExp(`-> ${a.ip.replaceAll(".", "\\.")}:8080 +Masq +0 +1 +0`));
    assert.equal((await pc.send(held.conn!)).answer?.split(" ")[0], "pod-a", "the old connection works");
    assert.equal((await pc.tcp("172.30.0.1", 80)).answer?.split(" ")[0], "pod-b", "new ones go to pod-b");
    // Reset: IPVS keeps the connection in CLOSE for 10 s (an inactive connection): still kept.
    await pc.closeConn(held.conn!, { reset: true });
    assert.deepEqual(await dp.checkDraining(), [], await listed());
    assert.match(await listed(), new RegExp(`-> ${a.ip.replaceAll(".", "\\.")}:8080 +Masq +0 +0 +1`));
    // Once IPVS has expired the connection, the next check deletes the real server.
    const deadline = Date.now() + 30_000;
    let deleted: string[] = [];
    while (deleted.length === 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 1000));
      deleted = await dp.checkDraining();
    }
    assert.deepEqual(deleted, [rs], await listed());
    assert.doesNotMatch(await listed(), new RegExp(a.ip.replaceAll(".", "\\.")));
    assert.deepEqual(dp.drainingRealServers(), []);
    dp.stop();
  },
});
