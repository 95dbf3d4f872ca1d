/** ensureSysctl: writes only what differs, and believes only a value it reads back. */
import assert from "node:assert/strict";
import { RecordingCommandRunner } from "../lib/exec.ts";
import { configureLogging } from "../lib/log.ts";
import { ensureSysctl, readIntSysctl } from "../lib/sysctl.ts";
import { netnsUnavailableReason, withNetns } from "../testkit/netns.ts";
import { privilegedTest } from "../testkit/privileged.ts";

/** A fake `sysctl` over a table of values; `readOnly` keys accept a write with exit 0 and keep their value. */
function fakeSysctl(values: Record<string, string>, readOnly: string[] = []) {
  return new RecordingCommandRunner((c) => {
    if (c.args[0] === "-n") {
      return c.args[1] in values
        ? { stdout: values[c.args[1]] + "\n" }
        : { code: 255, stderr: "cannot stat" };
    }
    const [key, value] = c.args[1].split("=");
    if (!readOnly.includes(key)) values[key] = value;
    return { stdout: `${key} = ${value}\n` };
  });
}

type LogRecord = { msg: string; [key: string]: unknown };

function captureLogs(): LogRecord[] {
  const records: LogRecord[] = [];
  configureLogging({ format: "json", sink: (line) => records.push(JSON.parse(line)) });
  return records;
}

Deno.test("ensureSysctl() leaves an equal value alone and writes a different one", async () => {
  captureLogs();
  const values = { "net.a": "1", "net.b": "0" };
  const runner = fakeSysctl(values);
  assert.equal(await ensureSysctl(runner, "net.a", 1), "unchanged");
  assert.equal(await ensureSysctl(runner, "net.b", 1), "set");
  assert.deepEqual(runner.callsOf("sysctl").filter((c) => c.args[0] === "-w").map((c) => c.args[1]), [
    "net.b=1",
  ]);
  assert.equal(values["net.b"], "1");
});

Deno.test("ensureSysctl() reports a write that exits 0 but does not take effect, without 'Set sysctl'", async () => {
  const logs = captureLogs();
  const runner = fakeSysctl({ "net.netfilter.nf_conntrack_max": "262144" }, [
    "net.netfilter.nf_conntrack_max",
  ]);
  assert.equal(await ensureSysctl(runner, "net.netfilter.nf_conntrack_max", 131072), "failed");
  assert.ok(!logs.some((r) => r.msg === "Set sysctl"));
  const err = logs.find((r) => r.msg === "Failed to set sysctl");
  assert.ok(err, "an error is logged");
  assert.equal(err.current, 262144);
});

Deno.test("ensureSysctl() reports a key that cannot be written", async () => {
  captureLogs();
  const runner = new RecordingCommandRunner((c) => c.args[0] === "-n" ? { stdout: "0" } : { code: 255 });
  assert.equal(await ensureSysctl(runner, "net.x", 1), "failed");
});

privilegedTest(netnsUnavailableReason(), {
  name:
    "ensureSysctl() in a network namespace: a per-namespace key is set, nf_conntrack_max is not (read-only there)",
  fn: () =>
    withNetns(async (runner) => {
      const logs = captureLogs();
      assert.equal(await ensureSysctl(runner, "net.ipv4.conf.all.route_localnet", 1), "set");
      assert.equal(await readIntSysctl(runner, "net.ipv4.conf.all.route_localnet"), 1);
      const before = await readIntSysctl(runner, "net.netfilter.nf_conntrack_max");
      assert.ok(before !== null && before > 1);
      // `sysctl -w` exits 0 here with "Invalid argument" on stderr and the value stays: a read-back catches it.
      assert.equal(await ensureSysctl(runner, "net.netfilter.nf_conntrack_max", before - 1), "failed");
      assert.equal(await readIntSysctl(runner, "net.netfilter.nf_conntrack_max"), before);
      assert.ok(logs.some((r) => r.msg === "Set sysctl" && r.name === "net.ipv4.conf.all.route_localnet"));
      assert.ok(!logs.some((r) => r.msg === "Set sysctl" && r.name === "net.netfilter.nf_conntrack_max"));
    }),
});
