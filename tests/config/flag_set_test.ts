import assert from "node:assert/strict";
import { FlagError, FlagSet, HelpRequested } from "../../lib/config/flag_set.ts";

function newSet() {
  const v = {
    b: false,
    s: "",
    n: 0,
    d: 1000,
    list: [] as string[],
    gates: {} as Record<string, boolean>,
    level: 0,
  };
  const fs = new FlagSet("test");
  fs.output = () => {};
  fs.bool("masquerade-all", () => v.b, (x) => v.b = x, "bool flag");
  fs.string("kubeconfig", () => v.s, (x) => v.s = x, "string flag");
  fs.int32("oom-score-adj", () => v.n, (x) => v.n = x, "int flag");
  fs.duration("iptables-sync-period", () => v.d, (x) => v.d = x, "duration flag");
  fs.stringSlice("nodeport-addresses", () => v.list, (x) => v.list = x, "slice flag");
  fs.mapStringBool("feature-gates", () => v.gates, (x) => v.gates = x, "map flag");
  fs.int32("v", () => v.level, (x) => v.level = x, "level", { shorthand: "v" });
  return { fs, v };
}

Deno.test("flag values are accepted in every pflag syntax form", () => {
  const forms: [string[], (v: ReturnType<typeof newSet>["v"]) => unknown, unknown][] = [
    [["--kubeconfig=/k"], (v) => v.s, "/k"],
    [["--kubeconfig", "/k"], (v) => v.s, "/k"],
    [["--kubeconfig", "-dash"], (v) => v.s, "-dash"],
    [["-v=4"], (v) => v.level, 4],
    [["-v4"], (v) => v.level, 4],
    [["-v", "4"], (v) => v.level, 4],
    [["--v=4"], (v) => v.level, 4],
    [["--v", "4"], (v) => v.level, 4],
    [["--masquerade-all"], (v) => v.b, true],
    [["--masquerade-all=false"], (v) => v.b, false],
    [["--masquerade-all=1"], (v) => v.b, true],
    [["--masquerade_all"], (v) => v.b, true],
    [["--oom-score-adj=-5"], (v) => v.n, -5],
    [["--oom-score-adj=0x10"], (v) => v.n, 16],
    [["--iptables-sync-period=1h2m3.5s"], (v) => v.d, 3_723_500],
    [["--iptables-sync-period", "0"], (v) => v.d, 0],
    [["--nodeport-addresses=a,b", "--nodeport-addresses", "c"], (v) => v.list, ["a", "b", "c"]],
    [["--nodeport-addresses="], (v) => v.list, []],
    [["--feature-gates=A=true,B=false"], (v) => v.gates, { A: true, B: false }],
    [["--feature-gates=A=true", "--feature-gates=B=false"], (v) => v.gates, { A: true, B: false }],
  ];
  for (const [argv, get, want] of forms) {
    const { fs, v } = newSet();
    fs.parse(argv);
    assert.deepEqual(get(v), want, argv.join(" "));
  }
});

Deno.test("changed is tracked per flag and -- ends flag parsing", () => {
  const { fs, v } = newSet();
  fs.parse(["--kubeconfig=/k", "pos", "--", "--masquerade-all"]);
  assert.equal(fs.changed("kubeconfig"), true);
  assert.equal(fs.changed("masquerade-all"), false);
  assert.equal(v.b, false);
  assert.deepEqual(fs.args, ["pos", "--masquerade-all"]);
});

Deno.test("parse errors use pflag's messages", () => {
  const cases: [string[], string][] = [
    [["--bogus"], "unknown flag: --bogus"],
    [["--bogus=1"], "unknown flag: --bogus"],
    [["-x"], "unknown shorthand flag: 'x' in -x"],
    [["-vx"], 'invalid argument "x" for "-v, --v" flag: strconv.ParseInt: parsing "x": invalid syntax'],
    [["--kubeconfig"], "flag needs an argument: --kubeconfig"],
    [["-v"], "flag needs an argument: 'v' in -v"],
    [["---x"], "bad flag syntax: ---x"],
    [
      ["--iptables-sync-period=x"],
      'invalid argument "x" for "--iptables-sync-period" flag: time: invalid duration "x"',
    ],
    [
      ["--masquerade-all=maybe"],
      'invalid argument "maybe" for "--masquerade-all" flag: strconv.ParseBool: parsing "maybe": invalid syntax',
    ],
    [
      ["--oom-score-adj=99999999999"],
      'invalid argument "99999999999" for "--oom-score-adj" flag: strconv.ParseInt: parsing "99999999999": value out of range',
    ],
    [
      ["--feature-gates=A"],
      'invalid argument "A" for "--feature-gates" flag: malformed pair, expect string=bool',
    ],
  ];
  for (const [argv, msg] of cases) {
    const { fs } = newSet();
    assert.throws(
      () => fs.parse(argv),
      (e: unknown) => e instanceof FlagError && e.message === msg,
      argv.join(" "),
    );
  }
});

Deno.test("--help and -h request help when not defined as flags", () => {
  for (const a of ["--help", "-h"]) {
    const { fs } = newSet();
    assert.throws(() => fs.parse([a]), HelpRequested);
  }
});

Deno.test("deprecated flags still work, print pflag's notice and are hidden from help", () => {
  const fs = new FlagSet("t");
  const out: string[] = [];
  fs.output = (s) => out.push(s);
  let port = 1;
  fs.int32("healthz-port", () => port, (x) => port = x, "old", { deprecated: "use --healthz-bind-address" });
  fs.parse(["--healthz-port=5"]);
  assert.equal(port, 5);
  assert.deepEqual(out, ["Flag --healthz-port has been deprecated, use --healthz-bind-address\n"]);
  assert.equal(fs.usages(), "");
});

Deno.test("help lines follow pflag's FlagUsages layout", () => {
  const { fs } = newSet();
  const lines = fs.usages().split("\n");
  assert.deepEqual(lines, [
    "      --feature-gates mapStringBool     map flag",
    "      --iptables-sync-period duration   duration flag (default 1s)",
    "      --kubeconfig string               string flag",
    "      --masquerade-all                  bool flag",
    "      --nodeport-addresses strings      slice flag",
    "      --oom-score-adj int32             int flag",
    "  -v, --v int32                         level",
    "",
  ]);
});
