/**
 * The packet suite in ipvs mode, inside the IPVS VM (`*_vmtest.ts`: the host kernel has no IPVS; the host
 * test tests/dataplane/ipvs_vm_test.ts boots the VM and runs it), plus what only this mode has: the
 * deprecation warning, kube-ipvs0 and the virtual servers as upstream writes them, `--ipvs-strict-arp`, and
 * graceful termination of a removed TCP real server.
 *
 * Where upstream's ipvs mode behaves unlike the iptables mode, the suite asserts upstream's ipvs behaviour:
 * externalTrafficPolicy Local without a local endpoint falls back to the cluster endpoints (kubernetes#97081,
 * pkg/proxy/ipvs/proxier.go syncEndpoint). A Service without endpoints is refused at once as in the other
 * modes: IPVS answers a packet it cannot schedule with ICMP port unreachable (ip_vs_leave).
 *
 * Standalone: `bash scripts/ipvs_vm.sh test tests/packets/ipvs_vmtest.ts`.
 */
import assert from "node:assert/strict";
import { ipvsKernelUnavailableReason } from "../../testkit/ipvs_vm.ts";
import type { Sandbox } from "../../testkit/sandbox.ts";
import { endpointSlice, eventually, service } from "./helpers.ts";
import { definePacketSuite, type StepContext } from "./suite.ts";

const unavailable = ipvsKernelUnavailableReason();
if (unavailable) console.log(`ipvs packet suite skipped: ${unavailable}`);

async function node(sb: Sandbox, cmd: string, ...args: string[]): Promise<string> {
  return (await sb.exec(sb.node, cmd, args)).stdout;
}

async function asUpstream({ sb, agent }: StepContext): Promise<void> {
  assert.match(agent.output, /The ipvs proxier is now deprecated and may be removed in a future release/);
  const addrs = await node(sb, "ip", "-o", "addr", "show", "dev", "kube-ipvs0");
  for (const ip of ["10.96.0.10", "10.96.0.11", "10.96.0.17", "172.30.0.10", "172.30.0.20"]) {
    assert.ok(addrs.includes(` ${ip}/32 `), `${ip} on kube-ipvs0:\n${addrs}`);
  }
  // Left down, as upstream (an UP dummy would answer ARP for every service IP).
  assert.doesNotMatch(await node(sb, "ip", "link", "show", "kube-ipvs0"), /[<,]UP[,>]/);
  const vs = await node(sb, "ipvsadm", "-S", "-n");
  for (
    const line of [
      "-A -t 10.96.0.10:80 -s rr",
      `-A -t ${sb.nodeIP}:30080 -s rr`,
      "-A -t 10.96.0.14:80 -s rr -p 60",
      "-A -u 10.96.0.18:53 -s rr",
      "-A -t 172.30.0.10:80 -s rr",
      "-A -t 172.30.0.20:80 -s rr",
      "-A -t 10.96.0.17:80 -s rr",
      `-a -t 10.96.0.10:80 -r ${sb.pod("pod-a").ip}:8080 -m -w 1`,
    ]
  ) {
    assert.ok(vs.split("\n").includes(line), `${line} in ipvsadm -S -n:\n${vs}`);
  }
  const sets = await node(sb, "ipset", "list", "-n");
  for (const name of ["KUBE-CLUSTER-IP", "KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP", "KUBE-IPVS-IPS"]) {
    assert.ok(sets.split("\n").includes(name), `${name} in ipset list -n:\n${sets}`);
  }
  const nat = await node(sb, "iptables-save", "-t", "nat");
  assert.match(nat, /-A KUBE-SERVICES .*-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT/);
  assert.doesNotMatch(nat, /KUBE-SVC-/, "no iptables-mode service chains");
}

async function strictArp({ sb }: StepContext): Promise<void> {
  assert.equal((await node(sb, "sysctl", "-n", "net.ipv4.conf.all.arp_ignore")).trim(), "1");
  assert.equal((await node(sb, "sysctl", "-n", "net.ipv4.conf.all.arp_announce")).trim(), "2");
  assert.equal((await node(sb, "sysctl", "-n", "net.ipv4.vs.conntrack")).trim(), "1");
  assert.equal((await node(sb, "sysctl", "-n", "net.ipv4.vs.expire_nodest_conn")).trim(), "1");
}

/** `ActiveConn InActConn` of one real server in `ipvsadm -L -n -t VS`, or undefined when it is absent. */
async function realServer(sb: Sandbox, vs: string, rs: string) {
  const out = await node(sb, "ipvsadm", "-L", "-n", "-t", vs);
  const line = out.split("\n").find((l) => l.trim().startsWith(`-> ${rs} `));
  if (!line) return undefined;
  const w = line.trim().split(/\s+/);
  return { weight: Number(w[3]), active: Number(w[4]), inactive: Number(w[5]), out };
}

async function gracefulTermination({ sb, sim, pc }: StepContext): Promise<void> {
  const a = sb.pod("pod-a"), b = sb.pod("pod-b");
  const local = (ip: string) => ({ ip, node: "node1" });
  await sim.upsert(service({ name: "drain", clusterIP: "10.96.0.19" }));
  await sim.upsert(endpointSlice("drain", [local(a.ip)]));
  await eventually(
    "10.96.0.19 to serve",
    async () => {
      const r = await pc.tcp("10.96.0.19", 80, { timeoutMs: 500 });
      return r.result === "ok" ? r : undefined;
    },
    10_000,
    200,
  );
  const held = await pc.open("10.96.0.19", 80);
  assert.equal(held.result, "ok", JSON.stringify(held));
  assert.match(held.answer!, /^pod-a /);

  await sim.upsert(endpointSlice("drain", [local(b.ip)]));
  await eventually(
    "new connections to reach pod-b",
    async () => {
      const r = await pc.tcp("10.96.0.19", 80, { timeoutMs: 500 });
      return r.answer?.startsWith("pod-b ") ? r : undefined;
    },
    10_000,
    200,
  );
  const names = await pc.repeat({ op: "tcp", host: "10.96.0.19", port: 80, timeoutMs: 1000 }, 20);
  assert.deepEqual(new Set(names), new Set(["pod-b"]), "no new connection reaches the removed endpoint");
  // The removed endpoint stays as a weight-0 real server while its connection lives.
  const drained = await realServer(sb, "10.96.0.19:80", `${a.ip}:8080`);
  assert.ok(drained, "the removed real server is kept while a connection uses it");
  assert.equal(drained.weight, 0, drained.out);
  assert.equal(drained.active, 1, drained.out);
  for (let i = 0; i < 3; i++) {
    const r = await pc.send(held.conn!);
    assert.equal(r.result, "ok", `the established connection still works: ${JSON.stringify(r)}`);
    assert.match(r.answer!, /^pod-a /);
  }
  await pc.closeConn(held.conn!);
  await eventually(
    "the closed connection to leave ActiveConn",
    async () => {
      const s = await realServer(sb, "10.96.0.19:80", `${a.ip}:8080`);
      return s === undefined || s.active === 0 ? true : undefined;
    },
    5000,
    200,
  );
}

definePacketSuite({
  mode: "ipvs",
  tools: ["ipvsadm", "ipset", "iptables", "iptables-save"],
  unavailable,
  extraArgs: ["--ipvs-strict-arp"],
  externalLocalWithoutLocalEndpoints: "clusterEndpoints",
  extraSteps: [
    ["deprecation warning, kube-ipvs0, virtual servers, ipsets and iptables rules as upstream", asUpstream],
    ["--ipvs-strict-arp sets arp_ignore=1 and arp_announce=2; the IPVS sysctls are set", strictArp],
    [
      "graceful termination: a removed endpoint keeps its established connection (weight 0), gets no new one",
      gracefulTermination,
    ],
  ],
  partialFlush: {
    // Beyond upstream's periodic full sync: the agent checks nat KUBE-SERVICES every syncPeriod.
    name: "iptables -t nat -F KUBE-SERVICES",
    run: async (sb) =>
      void await sb.exec(sb.node, "iptables", ["-w", "5", "-t", "nat", "-F", "KUBE-SERVICES"]),
    // IPVS still carries the NodePort without the chain, but nothing marks it for masquerade any more.
    inEffect: async ({ sb, pc }) => {
      const r = await pc.tcp(sb.nodeIP, 30080, { timeoutMs: 500 });
      return r.result !== "ok" || r.answer!.includes(` ${sb.clientIP}:`);
    },
  },
  // A firewall reload (every iptables chain flushed and deleted) and a cleared IPVS table (`ipvsadm -C`).
  wipe: async (sb) => {
    for (const table of ["nat", "filter", "mangle"]) {
      await sb.exec(sb.node, "iptables", ["-w", "5", "-t", table, "-F"]);
      await sb.exec(sb.node, "iptables", ["-w", "5", "-t", table, "-X"]);
    }
    await sb.exec(sb.node, "ipvsadm", ["-C"]);
  },
  leftovers: async (sb) => {
    const left: string[] = [];
    const vs = (await sb.exec(sb.node, "ipvsadm", ["-S", "-n"])).stdout.trim();
    if (vs !== "") left.push(...vs.split("\n").map((l) => `ipvsadm: ${l}`));
    const link = await sb.tryExec(sb.node, "ip", ["link", "show", "kube-ipvs0"]);
    if (link.code === 0) left.push("interface kube-ipvs0");
    const sets = (await sb.exec(sb.node, "ipset", ["list", "-n"])).stdout.split("\n");
    left.push(...sets.filter((s) => s.startsWith("KUBE-")).map((s) => `ipset ${s}`));
    for (const save of ["iptables-legacy-save", "iptables-nft-save"]) {
      const out = await sb.tryExec(sb.node, save, []);
      if (out.code === 127) continue;
      left.push(
        ...out.stdout.split("\n").filter((l) => l.includes("KUBE-") && !l.includes("KUBE-FIREWALL"))
          .map((l) => `${save}: ${l}`),
      );
    }
    return left;
  },
});
