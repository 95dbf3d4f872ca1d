/**
 * The ipvs mode's start-up probe, kernel settings and cleanup against a real IPVS kernel (inside the IPVS VM:
 * `*_vmtest.ts`), in a throwaway network namespace: the real `ipset --version`, `ipvsadm` and `sysctl` output
 * the mode parses, the dummy virtual server of the scheduler probe (and that it is gone afterwards), the
 * sysctls and `ipvsadm --set` timeouts as the kernel reports them, and `cleanup` of a programmed node.
 *
 * Standalone: `bash scripts/ipvs_vm.sh test tests/dataplane/ipvs/mode_vmtest.ts`.
 */
import assert from "node:assert/strict";
import { newIpvsMode } from "../../../lib/dataplane/ipvs/mode.ts";
import { ModeUnavailableError } from "../../../lib/dataplane/mode.ts";
import { configureLogging, log } from "../../../lib/log.ts";
import { makeState, snapshot } from "../../../testkit/fixtures.ts";
import { ipvsKernelUnavailableReason } from "../../../testkit/ipvs_vm.ts";
import { type NetnsRunner, withNetns } from "../../../testkit/netns.ts";
import { modeContext } from "./helpers.ts";

configureLogging({ sink: () => {} });
const unavailable = ipvsKernelUnavailableReason(["iptables-save"]);
if (unavailable) console.log(`ipvs mode kernel tests skipped: ${unavailable}`);

async function out(ns: NetnsRunner, cmd: string, ...args: string[]): Promise<string> {
  return (await ns.run({ cmd, args })).stdout;
}

Deno.test({
  name: "ipvs mode, real kernel: the start-up probe passes for rr and mh and leaves no dummy virtual server",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      for (const scheduler of ["", "mh", "wrr"]) {
        const { ctx, events } = modeContext(ns, { scheduler });
        await newIpvsMode().checkHost(ctx);
        assert.equal(events.length, 1, "the deprecation Event");
        assert.equal((await out(ns, "ipvsadm", "-S", "-n")).trim(), "", `${scheduler}: no dummy left`);
      }
    }),
});

Deno.test({
  name: "ipvs mode, real kernel: an unknown scheduler is refused with the kernel's own reason",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      const err = await newIpvsMode().checkHost(modeContext(ns, { scheduler: "nosuch" }).ctx).catch((e) => e);
      assert.ok(err instanceof ModeUnavailableError, String(err));
      assert.match(
        err.message,
        /^can't use the IPVS proxier: could not create a dummy virtual server with scheduler "nosuch": .+ \(load the ip_vs_nosuch kernel module or choose another --ipvs-scheduler\)$/,
      );
      assert.equal((await out(ns, "ipvsadm", "-S", "-n")).trim(), "");
    }),
});

Deno.test({
  name: "ipvs mode, real kernel: sysctls (strict ARP) and --ipvs-*-timeout as the kernel reports them",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      const { ctx } = modeContext(ns, {
        strictARP: true,
        tcpTimeout: 900_000,
        tcpFinTimeout: 0,
        udpTimeout: 300_000,
      });
      const mode = newIpvsMode();
      await mode.checkHost(ctx);
      const dps = await mode.createDataplanes(ctx, ["IPv4"]);
      assert.equal(dps.size, 1);
      const get = async (key: string) => (await out(ns, "sysctl", "-n", key)).trim();
      assert.equal(await get("net.ipv4.vs.conntrack"), "1");
      assert.equal(await get("net.ipv4.vs.expire_nodest_conn"), "1");
      assert.equal(await get("net.ipv4.vs.expire_quiescent_template"), "1");
      assert.equal(await get("net.ipv4.ip_forward"), "1");
      assert.equal(await get("net.ipv4.conf.all.arp_ignore"), "1");
      assert.equal(await get("net.ipv4.conf.all.arp_announce"), "2");
      // Kernel 6.1 (≥ 5.9): conn_reuse_mode is left at the kernel's default, as upstream.
      assert.equal(await get("net.ipv4.vs.conn_reuse_mode"), "1");
      // 0 keeps the kernel's value (FIN_WAIT: 120 s).
      assert.match(await out(ns, "ipvsadm", "-L", "--timeout"), /Timeout \(tcp tcpfin udp\): 900 120 300/);
      for (const dp of dps.values()) dp.stop?.();
    }),
});

Deno.test({
  name: "ipvs mode, real kernel: cleanup removes the virtual servers, kube-ipvs0, the ipsets and the chains",
  ignore: unavailable !== undefined,
  fn: () =>
    withNetns(async (ns) => {
      await ns.run({ cmd: "ip", args: ["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"] });
      await ns.run({ cmd: "ip", args: ["addr", "add", "192.168.0.2/24", "dev", "eth0"] });
      const { ctx } = modeContext(ns);
      const mode = newIpvsMode();
      await mode.checkHost(ctx);
      const dp = (await mode.createDataplanes(ctx, ["IPv4"])).get("IPv4")!;
      const svc = makeState({
        ns: "a",
        name: "b",
        clusterIP: "172.30.0.1",
        nodePort: 30001,
        lbVIPs: ["5.6.7.8"],
      }, [
        { ip: "10.244.0.5" },
      ]);
      await dp.sync(snapshot([svc], { nodeIPs: ["192.168.0.2"] }));
      dp.stop?.();
      assert.notEqual((await out(ns, "ipvsadm", "-S", "-n")).trim(), "");
      // A stranger's set survives: only the mode's own names go.
      await ns.run({ cmd: "ipset", args: ["create", "KUBE-SOMEONE-ELSE", "hash:ip"] });
      const report = await mode.cleanup(ns, null, log);
      assert.equal(report.failed, false, JSON.stringify(report));
      assert.ok(report.removed.includes("IPVS virtual servers"), report.removed.join(", "));
      assert.equal((await out(ns, "ipvsadm", "-S", "-n")).trim(), "");
      assert.notEqual((await ns.tryRun({ cmd: "ip", args: ["link", "show", "kube-ipvs0"] })).code, 0);
      assert.deepEqual((await out(ns, "ipset", "list", "-n")).trim().split("\n"), ["KUBE-SOMEONE-ELSE"]);
      for (const table of ["nat", "filter"]) {
        const save = await out(ns, "iptables-save", "-t", table);
        assert.deepEqual(save.split("\n").filter((l) => l.includes("KUBE-")), [], `${table}:\n${save}`);
      }
    }),
});
