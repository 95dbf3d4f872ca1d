/**
 * The traffic probe's verdicts on a busy machine: a probe process that was not scheduled when its timer was due
 * still sees a connection the kernel established meanwhile (issue 20's restart-step timeout).
 */
import assert from "node:assert/strict";
import { type NetnsRunner, netnsUnavailableReason, withNetns } from "../../testkit/netns.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { Probe, STARVED_MS } from "../../testkit/probe.ts";
import { eventually, sleep } from "../packets/helpers.ts";

/** A listener that accepts TCP connections on 127.0.0.1:8080 in `ns` and never writes. */
function silentListener(ns: string): Deno.ChildProcess {
  const code = `const l = Deno.listen({ hostname: "127.0.0.1", port: 8080 });
console.log("ready");
const held = [];
for await (const c of l) held.push(c);`;
  return new Deno.Command("ip", {
    args: ["netns", "exec", ns, Deno.execPath(), "eval", code],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
}

async function firstLine(child: Deno.ChildProcess): Promise<string> {
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const { value } = await reader.read();
  reader.releaseLock();
  return value ?? "";
}

async function synDrops(r: NetnsRunner): Promise<number> {
  const out = (await r.run({ cmd: "nft", args: ["list", "chain", "inet", "t", "c"] })).stdout;
  return Number(/counter packets (\d+)/.exec(out)?.[1] ?? 0);
}

privilegedTest(netnsUnavailableReason(), {
  name:
    "probe: a timer that fires late still sees the connection the kernel completed while the probe was stopped",
  fn: () =>
    withNetns(async (r, ns) => {
      const listener = silentListener(ns);
      let probeChild: Deno.ChildProcess | undefined;
      const probe = new Probe((cmd, args, opts) => {
        probeChild = new Deno.Command("ip", {
          args: ["netns", "exec", ns, cmd, ...args],
          ...opts,
          stdout: "piped",
          stderr: "inherit",
        }).spawn();
        return probeChild;
      });
      try {
        assert.equal((await firstLine(listener)).trim(), "ready");
        await probe.ready();
        // The first SYN is dropped, so the handshake completes with the kernel's retransmission about 1 s later.
        await r.run({
          cmd: "nft",
          args: ["-f", "-"],
          stdin: "table inet t { chain c {\n type filter hook input priority 0;\n" +
            "  tcp dport 8080 tcp flags & (syn | ack) == syn counter drop\n}\n}\n",
        });
        const timeoutMs = 1500;
        const sent = performance.now();
        const answer = probe.tcp("127.0.0.1", 8080, { timeoutMs });
        await eventually(
          "the first SYN dropped",
          async () => (await synDrops(r)) >= 1 ? true : undefined,
          10_000,
          20,
        );
        // The probe process stops with its connect pending; the retransmitted SYN goes through meanwhile.
        Deno.kill(probeChild!.pid, "SIGSTOP");
        await r.run({ cmd: "nft", args: ["delete", "table", "inet", "t"] });
        await eventually(
          "the handshake completed in the kernel",
          async () => {
            const ss = await r.run({ cmd: "ss", args: ["-Htn", "state", "established", "dport", "8080"] });
            return ss.stdout.trim() !== "" ? true : undefined;
          },
          10_000,
          50,
        );
        // Keep it stopped until its timer is well overdue (the timer's lateness is what is under test).
        const overdue = timeoutMs + 2 * STARVED_MS - (performance.now() - sent);
        if (overdue > 0) await sleep(overdue);
        Deno.kill(probeChild!.pid, "SIGCONT");
        const res = await answer;
        assert.equal(res.result, "timeout", JSON.stringify(res));
        assert.equal(res.connected, true, `the established connection is seen: ${JSON.stringify(res)}`);
        assert.ok((res.timerLateMs ?? 0) >= STARVED_MS, `timer lateness recorded: ${JSON.stringify(res)}`);
      } finally {
        if (probeChild) {
          try {
            Deno.kill(probeChild.pid, "SIGCONT");
          } catch { /* exited */ }
        }
        await probe.close();
        listener.kill();
        await listener.status;
      }
    }),
});
