/**
 * The iptables rule model: what the agent writes and what `iptables-save` reads back parse to the same rules
 * (checked against the real tools in a network namespace), restore's `--noflush` semantics, quoting.
 */
import assert from "node:assert/strict";
import { parseRenderOutput } from "../../../lib/cli/render_output.ts";
import {
  IptablesParseError,
  IptablesTables,
  parseRule,
  splitWords,
} from "../../../lib/dataplane/iptables/model.ts";
import { configureLogging } from "../../../lib/log.ts";
import { netnsUnavailableReason, withNetns } from "../../../testkit/netns.ts";
import { privilegedTest } from "../../../testkit/privileged.ts";
import { CORPUS_FLAGS, corpusYaml, runCli } from "../../cli/helpers.ts";

configureLogging({ sink: () => {} });

Deno.test("iptables model: words split as the shell does, with quoted comments", () => {
  assert.deepEqual(splitWords(`-A X -m comment --comment "a \\"b\\" c" -j Y`), [
    "-A",
    "X",
    "-m",
    "comment",
    "--comment",
    'a "b" c',
    "-j",
    "Y",
  ]);
  assert.throws(() => splitWords(`-m comment --comment "open`), IptablesParseError);
});

Deno.test("iptables model: the spellings of the tools compare equal, real differences do not", () => {
  const written = parseRule(
    "KUBE-SVC-X",
    splitWords(
      `-m comment --comment "ns/s:p -> 10.0.0.1:80" -m tcp -p tcp -d 10.96.0.1 --dport 80 -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-A`,
    ),
  );
  const saved = parseRule(
    "KUBE-SVC-X",
    splitWords(
      `-d 10.96.0.1/32 -p tcp -m comment --comment "ns/s:p -> 10.0.0.1:80" -m tcp --dport 80 -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-A`,
    ),
  );
  assert.equal(written.key, saved.key);
  const otherPort = parseRule(
    "KUBE-SVC-X",
    splitWords(`-d 10.96.0.1/32 -p tcp -m tcp --dport 81 -j KUBE-SEP-A`),
  );
  const otherIP = parseRule(
    "KUBE-SVC-X",
    splitWords(`-d 10.96.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SEP-A`),
  );
  const negated = parseRule(
    "KUBE-SVC-X",
    splitWords(`! -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SEP-A`),
  );
  const base = parseRule("KUBE-SVC-X", splitWords(`-d 10.96.0.1 -p tcp -m tcp --dport 80 -j KUBE-SEP-A`));
  for (const r of [otherPort, otherIP, negated]) assert.notEqual(r.key, base.key, r.text);
  // iptables loads the protocol's match for --dport by itself; iptables-save prints it.
  assert.equal(
    parseRule("C", splitWords("-p tcp --dport 80 -j ACCEPT")).key,
    parseRule("C", splitWords("-p tcp -m tcp --dport 80 -j ACCEPT")).key,
  );
  assert.throws(() => parseRule("C", splitWords("--dport 80 -j ACCEPT")), IptablesParseError);
  assert.equal(
    parseRule("C", splitWords("-j MARK --or-mark 0x00004000")).key,
    parseRule("C", splitWords("-j MARK --or-mark 0x4000")).key,
  );
  assert.equal(
    parseRule("C", splitWords("-j REJECT")).key,
    parseRule("C", splitWords("-j REJECT --reject-with icmp-port-unreachable")).key,
  );
});

Deno.test("iptables model: restore --noflush keeps other chains, flushes declared ones, inserts at the front", () => {
  const t = IptablesTables.parse(
    "*filter\n:INPUT ACCEPT [0:0]\n:OTHER - [0:0]\n-A INPUT -j OTHER\n-A OTHER -j ACCEPT\nCOMMIT\n",
  );
  t.restore("*filter\n:KUBE-A - [0:0]\n-A KUBE-A -j DROP\n-I INPUT 1 -j KUBE-A\nCOMMIT\n");
  assert.deepEqual(t.chain("filter", "INPUT")!.rules.map((r) => r.target), ["KUBE-A", "OTHER"]);
  assert.equal(t.chain("filter", "OTHER")!.rules.length, 1);
  t.restore("*filter\n:KUBE-A - [0:0]\nCOMMIT\n");
  assert.equal(t.chain("filter", "KUBE-A")!.rules.length, 0);
  t.restore("*filter\n-D INPUT -j KUBE-A\n-X KUBE-A\nCOMMIT\n");
  assert.equal(t.chain("filter", "KUBE-A"), undefined);
  assert.throws(() => t.restore("*filter\n-A NOPE -j DROP\nCOMMIT\n"), /NOPE does not exist/);
  assert.match(t.dump(), /^\*filter\n:INPUT ACCEPT \[0:0\]\n/);
});

function keysByChain(t: IptablesTables, chains: Iterable<[string, string]>): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const [table, chain] of chains) {
    out.set(`${table}/${chain}`, t.chain(table, chain)?.rules.map((r) => r.key) ?? []);
  }
  return out;
}

privilegedTest(netnsUnavailableReason(), {
  name:
    "iptables model: the corpus as written and as iptables-save reads it back are the same rules (nft and legacy, both families)",
  fn: async () => {
    const r = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=iptables"], corpusYaml());
    assert.equal(r.code, 0, r.stderr);
    const commands = parseRenderOutput(r.stdout);
    for (const backend of ["nft", "legacy"] as const) {
      for (const family of ["IPv4", "IPv6"] as const) {
        const restore = commands.find((c) => c.family === family && /tables-nft-restore$/.test(c.cmd))!;
        assert.ok(restore, `${family}: a restore payload`);
        const v6 = family === "IPv6" ? "6" : "";
        await withNetns(async (runner) => {
          // The rules count in nfacct objects the agent creates first.
          for (const c of commands.filter((c) => c.cmd === "nfacct")) {
            await runner.run({ cmd: c.cmd, args: [...c.args] });
          }
          await runner.run({
            cmd: `ip${v6}tables-${backend}-restore`,
            args: ["--noflush"],
            stdin: restore.stdin,
          });
          const saved = (await runner.run({ cmd: `ip${v6}tables-${backend}-save`, args: [] })).stdout;
          const written = new IptablesTables();
          written.restore(restore.stdin);
          const read = IptablesTables.parse(saved);
          const chains: [string, string][] = [];
          for (const [table, cs] of written.tables) for (const c of cs.keys()) chains.push([table, c]);
          assert.ok(chains.length > 20, `${family}: ${chains.length} chains`);
          assert.deepEqual(keysByChain(read, chains), keysByChain(written, chains), `${backend} ${family}`);
        });
      }
    }
  },
});
