/**
 * Proof that the IPVS VM (scripts/ipvs_vm.sh) is a usable dataplane for the ipvs mode: inside the usual
 * sandbox, a virtual server built by hand the way kube-proxy's ipvs mode builds one (dummy `kube-ipvs0`
 * holding the VIP, ipvsadm NAT real servers, an ipset of cluster IP,port pairs and iptables rules that mark
 * and MASQUERADE traffic matching it) carries real TCP and UDP from outside, from a pod and from the node.
 *
 * Runs only where the kernel has IPVS, i.e. inside the VM (`*_vmtest.ts`; the host test
 * tests/dataplane/ipvs_vm_test.ts boots it). Standalone: `bash scripts/ipvs_vm.sh test tests/dataplane/ipvs/`.
 */

import assert from "node:assert/strict";
import { Sandbox, sandboxUnavailableReason } from "../../../testkit/sandbox.ts";
import type { Probe } from "../../../testkit/probe.ts";

const VIP = "10.96.0.10";
const MASQ_MARK = "0x4000";

function ipvsUnavailableReason(): string | undefined {
  const reason = sandboxUnavailableReason(["ip", "ipvsadm", "ipset", "iptables-restore", "sysctl"]);
  if (reason) return reason;
  try {
    Deno.statSync("/proc/net/ip_vs");
    return undefined;
  } catch {
    return "this kernel has no IPVS (run it in the VM: bash scripts/ipvs_vm.sh test tests/dataplane/ipvs/)";
  }
}

const unavailable = ipvsUnavailableReason();
if (unavailable) console.log(`ipvs smoke test skipped: ${unavailable}`);

/** kube-proxy's ipvs-mode nat rules, reduced to the cluster-IP path (pod CIDR 10.244.0.0/24). */
const NAT_RULES = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark ${MASQ_MARK}
-A KUBE-POSTROUTING -m comment --comment "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-POSTROUTING -m mark ! --mark ${MASQ_MARK}/${MASQ_MARK} -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark ${MASQ_MARK}
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES ! -s 10.244.0.0/24 -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
`;

/** `count` sequential probes; returns `<name> <source-ip>` per answer (the pod server's line minus the port). */
async function ask(probe: Probe, op: "tcp" | "udp", port: number, count: number): Promise<string[]> {
  const answers: string[] = [];
  for (let i = 0; i < count; i++) {
    const r = op === "tcp" ? await probe.tcp(VIP, port, { timeoutMs: 3000 }) : await probe.udp(VIP, port, {
      timeoutMs: 3000,
    });
    assert.equal(r.result, "ok", `${op} ${VIP}:${port} #${i}: ${JSON.stringify(r)}`);
    answers.push(r.answer!.replace(/:\d+$/, ""));
  }
  return answers;
}

/** Asserts that both pods answered, in strict alternation (round robin). */
function assertRoundRobin(answers: string[]): void {
  const names = answers.map((a) => a.split(" ")[0]);
  assert.deepEqual(new Set(names), new Set(["pod-a", "pod-b"]), answers.join(", "));
  for (let i = 1; i < names.length; i++) assert.notEqual(names[i], names[i - 1], answers.join(", "));
}

Deno.test({
  name: "ipvs in the VM: a kube-ipvs0 VIP with two masquerade real servers carries TCP and UDP round robin",
  ignore: unavailable !== undefined,
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    await using sb = await Sandbox.create({ pods: ["pod-a", "pod-b", "pod-c"] });
    const [a, b, c] = [sb.pod("pod-a"), sb.pod("pod-b"), sb.pod("pod-c")];
    const node = (cmd: string, ...args: string[]) => sb.exec(sb.node, cmd, args);

    await node(
      "sysctl",
      "-q",
      "-w",
      "net.ipv4.vs.conntrack=1",
      "net.ipv4.vs.expire_nodest_conn=1",
      "net.ipv4.vs.expire_quiescent_template=1",
    );
    await sb.ip(sb.node, "link", "add", "kube-ipvs0", "type", "dummy");
    await sb.ip(sb.node, "addr", "add", `${VIP}/32`, "dev", "kube-ipvs0"); // left down, as kube-proxy does
    await node("ipvsadm", "-A", "-t", `${VIP}:80`, "-s", "rr");
    await node("ipvsadm", "-A", "-u", `${VIP}:53`, "-s", "rr");
    for (const pod of [a, b]) {
      await node("ipvsadm", "-a", "-t", `${VIP}:80`, "-r", `${pod.ip}:8080`, "-m", "-w", "1");
      await node("ipvsadm", "-a", "-u", `${VIP}:53`, "-r", `${pod.ip}:8081`, "-m", "-w", "1");
    }
    await sb.exec(
      sb.node,
      "ipset",
      ["restore"],
      [
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536",
        `add KUBE-CLUSTER-IP ${VIP},tcp:80`,
        `add KUBE-CLUSTER-IP ${VIP},udp:53`,
        "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536",
        ...[a, b].map((p) => `add KUBE-LOOP-BACK ${p.ip},tcp:8080,${p.ip}`),
        "",
      ].join("\n"),
    );
    await sb.exec(sb.node, "iptables-restore", ["--noflush", "--counters"], NAT_RULES);

    const listing = (await node("ipvsadm", "-Ln")).stdout;
    assert.match(listing, new RegExp(`TCP  ${VIP}:80 rr`));
    assert.match(listing, new RegExp(`-> ${a.ip}:8080 +Masq +1`));
    assert.match(listing, new RegExp(`-> ${b.ip}:8081 +Masq +1`));

    await Promise.all([
      sb.startServer(a.ns, { tcp: [8080], udp: [8081] }),
      sb.startServer(b.ns, { tcp: [8080], udp: [8081] }),
    ]);
    const [client, inPod, onNode] = await Promise.all([
      sb.probe(sb.client),
      sb.probe(c.ns),
      sb.probe(sb.node),
    ]);

    await t.step("TCP from outside alternates between both pods and is masqueraded to the node", async () => {
      const answers = await ask(client, "tcp", 80, 6);
      assertRoundRobin(answers);
      for (const answer of answers) assert.match(answer, new RegExp(` ${sb.bridgeIP}$`), answers.join(", "));
    });

    await t.step("UDP from outside alternates between both pods and is masqueraded", async () => {
      const answers = await ask(client, "udp", 53, 4);
      assertRoundRobin(answers);
      for (const answer of answers) assert.match(answer, new RegExp(` ${sb.bridgeIP}$`), answers.join(", "));
    });

    await t.step(
      "TCP from a pod keeps the pod's source address (no masquerade inside the pod CIDR)",
      async () => {
        const answers = await ask(inPod, "tcp", 80, 4);
        assertRoundRobin(answers);
        for (const answer of answers) assert.match(answer, new RegExp(` ${c.ip}$`), answers.join(", "));
      },
    );

    await t.step("TCP and UDP from the node itself reach both pods", async () => {
      assertRoundRobin(await ask(onNode, "tcp", 80, 4));
      assertRoundRobin(await ask(onNode, "udp", 53, 4));
    });

    await t.step("without the VIP in the ipset nothing is masqueraded", async () => {
      await node("ipset", "del", "KUBE-CLUSTER-IP", `${VIP},tcp:80`);
      const answers = await ask(client, "tcp", 80, 2);
      for (const answer of answers) assert.match(answer, new RegExp(` ${sb.clientIP}$`), answers.join(", "));
    });

    await t.step("a deleted real server gets no more connections", async () => {
      await node("ipvsadm", "-d", "-t", `${VIP}:80`, "-r", `${b.ip}:8080`);
      const names = (await ask(client, "tcp", 80, 4)).map((x) => x.split(" ")[0]);
      assert.deepEqual(names, ["pod-a", "pod-a", "pod-a", "pod-a"]);
    });
  },
});
