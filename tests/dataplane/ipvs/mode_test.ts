/** The ipvs mode's start-up probe, kernel settings, deprecation Event and dataplanes, with a recording runner. */
import assert from "node:assert/strict";
import { RecordingCommandRunner } from "../../../lib/exec.ts";
import {
  connReuseModeFor,
  IPVS_DEPRECATION_MESSAGE,
  newIpvsMode,
  versionAtLeast,
} from "../../../lib/dataplane/ipvs/mode.ts";
import { ModeUnavailableError } from "../../../lib/dataplane/mode.ts";
import { configureLogging } from "../../../lib/log.ts";
import { modeContext } from "./helpers.ts";

const logs: string[] = [];
configureLogging({ sink: (l) => logs.push(l) });

const healthy = (
  extra: (cmd: string, args: string) => { code?: number; stdout?: string; stderr?: string } | undefined =
    () => undefined,
) =>
  new RecordingCommandRunner((c) => {
    const a = c.args.join(" ");
    const x = extra(c.cmd, a);
    if (x) return x;
    if (c.cmd === "ipset" && a === "--version") return { stdout: "ipset v7.17, protocol version: 7\n" };
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: "1\n" };
    return undefined;
  });

Deno.test("versions and conn_reuse_mode by kernel release, as upstream", () => {
  assert.ok(versionAtLeast("v7.17", "6.0"));
  assert.ok(versionAtLeast("6.0", "6.0"));
  assert.ok(!versionAtLeast("v5.9", "6.0"));
  assert.equal(connReuseModeFor("4.19.0-amd64"), 0);
  assert.equal(connReuseModeFor("5.8.1"), 0);
  assert.equal(connReuseModeFor("5.9.0"), null);
  assert.equal(connReuseModeFor("6.18.44-fc-v1147"), null);
  assert.equal(connReuseModeFor("3.10.0"), null);
});

Deno.test("checkHost: a kernel without IPVS is a clear ModeUnavailableError", async () => {
  const r = healthy((cmd) =>
    cmd === "ipvsadm"
      ? {
        code: 1,
        stderr:
          "Can't initialize ipvs: Protocol not available\nAre you sure that IP Virtual Server is built in the kernel or as module?\n",
      }
      : undefined
  );
  const { ctx, events } = modeContext(r);
  const err = await newIpvsMode().checkHost(ctx).catch((e) => e);
  assert.ok(err instanceof ModeUnavailableError);
  assert.equal(
    err.message,
    "can't use the IPVS proxier: IPVS is not available in this kernel (ipvsadm: Can't initialize ipvs: " +
      "Protocol not available); load the ip_vs kernel module (modprobe ip_vs ip_vs_rr) or choose another --proxy-mode",
  );
  assert.deepEqual(events, []);
});

Deno.test("checkHost: an old ipset and a missing scheduler are refused with upstream's reasons", async () => {
  const old = healthy((cmd, a) =>
    cmd === "ipset" && a === "--version" ? { stdout: "ipset v5.4\n" } : undefined
  );
  let err = await newIpvsMode().checkHost(modeContext(old).ctx).catch((e) => e);
  assert.equal(
    err.message,
    "can't use the IPVS proxier: ipset version: v5.4 is less than min required version: 6.0",
  );
  const noSched = healthy((cmd, a) =>
    cmd === "ipvsadm" && a.startsWith("-A")
      ? { code: 2, stderr: "Scheduler or persistence engine not found\n" }
      : undefined
  );
  err = await newIpvsMode().checkHost(modeContext(noSched, { scheduler: "mh" }).ctx).catch((e) => e);
  assert.match(
    err.message,
    /dummy virtual server with scheduler "mh": Scheduler or persistence engine not found/,
  );
});

Deno.test("checkHost: probes the scheduler with a dummy virtual server, warns of the deprecation with an Event", async () => {
  const r = healthy();
  const { ctx, events } = modeContext(r);
  await newIpvsMode().checkHost(ctx);
  const lines = r.calls.map((c) => [c.cmd, ...c.args].join(" "));
  assert.deepEqual(lines.slice(0, 4), [
    "ipset --version",
    "ipvsadm -S -n",
    "ipvsadm -A -t 198.51.100.0:20000 -s rr",
    "ipvsadm -D -t 198.51.100.0:20000",
  ]);
  assert.deepEqual(events, [["IPVSDeprecation", IPVS_DEPRECATION_MESSAGE]]);
  assert.ok(logs.some((l) => l.includes("The ipvs proxier is now deprecated")));
});

Deno.test("checkHost: an existing virtual server with the scheduler skips the dummy one (restart)", async () => {
  const r = healthy((cmd, a) =>
    cmd === "ipvsadm" && a === "-S -n" ? { stdout: "-A -t 10.96.0.1:443 -s rr\n" } : undefined
  );
  await newIpvsMode().checkHost(modeContext(r).ctx);
  assert.ok(!r.calls.some((c) => c.args[0] === "-A"));
});

Deno.test("createDataplanes: upstream's sysctls (strict ARP), conn_reuse_mode on 5.4, ipvsadm --set timeouts", async () => {
  const r = new RecordingCommandRunner((c) => {
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: "9\n" };
    return undefined;
  });
  // Reads answer 9 then the written value: make the read-back match by remembering writes.
  const written = new Map<string, string>();
  r.responder = (c) => {
    if (c.cmd === "sysctl" && c.args[0] === "-w") {
      const [k, v] = c.args[1].split("=");
      written.set(k, v);
    }
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: (written.get(c.args[1]) ?? "9") + "\n" };
    return undefined;
  };
  const { ctx } = modeContext(r, {
    strictARP: true,
    tcpTimeout: 900_000,
    tcpFinTimeout: 0,
    udpTimeout: 300_000,
  });
  const dps = await newIpvsMode({ kernelRelease: () => "5.4.0-100-generic" }).createDataplanes(ctx, ["IPv4"]);
  assert.equal(dps.size, 1);
  const writes = r.calls.filter((c) => c.args[0] === "-w" || c.args[0] === "--set").map((c) =>
    [c.cmd, ...c.args].join(" ")
  );
  assert.deepEqual(writes, [
    "sysctl -w net.ipv4.vs.conntrack=1",
    "sysctl -w net.ipv4.vs.conn_reuse_mode=0",
    "sysctl -w net.ipv4.vs.expire_nodest_conn=1",
    "sysctl -w net.ipv4.vs.expire_quiescent_template=1",
    "sysctl -w net.ipv4.ip_forward=1",
    "sysctl -w net.ipv4.conf.all.arp_ignore=1",
    "sysctl -w net.ipv4.conf.all.arp_announce=2",
    "ipvsadm --set 900 0 300",
  ]);
});
