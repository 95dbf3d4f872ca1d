/**
 * The typed write side of iptables rules (`lib/dataplane/iptables_rule.ts`): a rule's arguments come back
 * unchanged when its line is read as iptables-restore reads it (the model's word splitter), quoted exactly where
 * `iptables-save` quotes; what iptables would refuse or read differently is refused with the reason.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import {
  chainLine,
  checkChainName,
  comment,
  deleteChainLine,
  insertLine,
  IptablesRuleError,
  jump,
  protocol,
  ruleLine,
} from "../../lib/dataplane/iptables_rule.ts";
import { parseRule, ruleComment, splitWords } from "../../lib/dataplane/iptables/model.ts";

Deno.test("iptables rule: arguments are quoted where iptables-save quotes them and read back unchanged", () => {
  const line = ruleLine(
    "KUBE-SVC-ABCDEFGHIJKLMNOP",
    comment("demo/web:http cluster IP"),
    protocol("tcp"),
    ["-d", "10.96.0.10", "--dport", "80"],
    jump("KUBE-SEP-X"),
  );
  assert.equal(
    line,
    '-A KUBE-SVC-ABCDEFGHIJKLMNOP -m comment --comment "demo/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 ' +
      "--dport 80 -j KUBE-SEP-X\n",
  );
  const words = splitWords(line.trimEnd());
  assert.deepEqual(words.slice(0, 2), ["-A", "KUBE-SVC-ABCDEFGHIJKLMNOP"]);
  const rule = parseRule(words[1], words.slice(2));
  assert.equal(ruleComment(rule), "demo/web:http cluster IP");
  assert.equal(rule.target, "KUBE-SEP-X");
  // A comment without whitespace is written bare, as iptables-save prints it.
  assert.equal(
    ruleLine("KUBE-SEP-X", comment("demo/web:http"), jump("KUBE-MARK-MASQ")),
    "-A KUBE-SEP-X -m comment --comment demo/web:http -j KUBE-MARK-MASQ\n",
  );
  assert.equal(insertLine("INPUT", 1, jump("KUBE-FIREWALL")), "-I INPUT 1 -j KUBE-FIREWALL\n");
  assert.equal(chainLine("KUBE-SERVICES"), ":KUBE-SERVICES - [0:0]\n");
  assert.equal(deleteChainLine("KUBE-SVC-X"), "-X KUBE-SVC-X\n");
});

Deno.test("iptables rule: what iptables would refuse or read differently is refused with the reason", () => {
  const refused = (f: () => unknown, re: RegExp) =>
    assert.throws(f, (e) => e instanceof IptablesRuleError && re.test(e.message));
  refused(() => ruleLine("A".repeat(29), jump("ACCEPT")), /invalid iptables chain name/);
  refused(() => chainLine("KUBE SVC"), /invalid iptables chain name/);
  refused(() => ruleLine("-A", jump("ACCEPT")), /invalid iptables chain name/);
  refused(() => ruleLine("", jump("ACCEPT")), /invalid iptables chain name/);
  refused(() => ruleLine("KUBE-X", ["-d", ""]), /empty iptables argument/);
  refused(() => ruleLine("KUBE-X", comment('a "quoted" word')), /cannot carry/);
  refused(() => ruleLine("KUBE-X", comment("two\nlines")), /cannot carry/);
  refused(() => comment("x".repeat(256)), /longer than 255/);
  assert.equal(checkChainName("A".repeat(28)), "A".repeat(28));
  assert.ok(comment("x".repeat(255)));
  // The limit is the kernel's, in bytes: 128 two-byte characters are 256 bytes.
  refused(() => comment("é".repeat(128)), /longer than 255/);
  assert.ok(comment("é".repeat(127)));
});

Deno.test("iptables rule: any arguments it accepts read back as written (property)", () => {
  const argArb = fc.stringMatching(/^[A-Za-z0-9/:.,!\- ]{1,20}$/);
  fc.assert(
    fc.property(fc.array(argArb, { minLength: 1, maxLength: 8 }), (args) => {
      const words = splitWords(ruleLine("KUBE-TEST", args).trimEnd());
      assert.deepEqual(words, ["-A", "KUBE-TEST", ...args]);
    }),
    { seed: 20261207, numRuns: 300 },
  );
});
