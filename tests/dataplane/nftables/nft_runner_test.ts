/**
 * The real runner against a recording command runner: exact argv and stdin, nft's error output (captured
 * from nft 1.0.6 here) turned into classified errors with the failing line, JSON listings, and the
 * version checks.
 */
import assert from "node:assert/strict";
import { CommandError, type RecordedCall, RecordingCommandRunner } from "../../../lib/exec.ts";
import {
  checkNftVersion,
  errorFromNft,
  isAlreadyExists,
  isBusy,
  isNotFound,
  kernelVersionProblem,
  NftablesError,
  NftablesRunner,
  parseKernelVersion,
  parseNftErrors,
  parseNftVersion,
} from "../../../lib/dataplane/nftables/mod.ts";

function runnerWith(
  respond: (call: RecordedCall) => { code?: number; stdout?: string; stderr?: string } | undefined,
) {
  const rec = new RecordingCommandRunner(respond);
  return { rec, nft: new NftablesRunner({ family: "ip", table: "kube-proxy", runner: rec }) };
}

Deno.test("NftablesRunner.run() sends the transaction to nft -f - in one call", async () => {
  const { rec, nft } = runnerWith(() => undefined);
  const tx = nft.newTransaction();
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  tx.add({ kind: "chain", name: "services" });
  tx.flush({ kind: "chain", name: "services" });
  await nft.run(tx);
  await nft.check(tx);
  assert.deepEqual(rec.calls, [
    {
      cmd: "nft",
      args: ["-f", "-"],
      stdin: 'add table ip kube-proxy { comment "rules for kube-proxy" ; }\n' +
        "add chain ip kube-proxy services\nflush chain ip kube-proxy services\n",
    },
    { cmd: "nft", args: ["--check", "-f", "-"], stdin: rec.calls[0].stdin },
  ]);
  await nft.run(nft.newTransaction());
  assert.equal(rec.calls.length, 2, "an empty transaction runs nothing");
  const bad = nft.newTransaction();
  bad.add({ kind: "rule", chain: "c" });
  const err = await nft.run(bad).catch((e) => e);
  assert.ok(err instanceof NftablesError && err.invalid);
  assert.equal(rec.calls.length, 2, "an invalid transaction runs nothing");
});

Deno.test("NftablesRunner.runOperations() streams the operations to nft -f - and returns the input's size", async () => {
  const { rec, nft } = runnerWith(() => undefined);
  const chain = (i: number) => ({ kind: "chain" as const, name: `endpoint-${"X".repeat(200)}-${i}` });
  function* ops() {
    yield { verb: "add" as const, obj: { kind: "table" as const, comment: "rules for kube-proxy" } };
    // More than one 256 KiB chunk.
    for (let i = 0; i < 2000; i++) yield { verb: "add" as const, obj: chain(i) };
  }
  const bytes = await nft.runOperations(ops());
  const tx = nft.newTransaction();
  for (const o of ops()) tx.push(o);
  assert.equal(rec.calls.length, 1);
  assert.deepEqual(rec.calls[0].args, ["-f", "-"]);
  assert.equal(rec.calls[0].stdin, tx.toString(), "the same text as the transaction");
  assert.equal(bytes, tx.byteLength());
  assert.ok(bytes > 256 * 1024);
});

Deno.test("NftablesRunner.runOperations(): an invalid operation or a failing producer stops the run, nft's error is classified", async () => {
  const { nft } = runnerWith((c) =>
    c.stdin.includes("nope") ? { code: 1, stderr: ENOENT_STDERR } : undefined
  );
  function* invalid() {
    yield { verb: "add" as const, obj: { kind: "table" as const } };
    yield { verb: "add" as const, obj: { kind: "rule" as const, chain: "c" } };
  }
  const err = await nft.runOperations(invalid()).catch((e) => e);
  assert.ok(err instanceof NftablesError && err.invalid, String(err));
  assert.match(err.message, /^invalid operation 2 \(add rule\)/);
  const boom = new Error("producer failed");
  function* failing() {
    yield { verb: "add" as const, obj: { kind: "table" as const } };
    throw boom;
  }
  assert.equal(await nft.runOperations(failing()).catch((e) => e), boom);
  function* rejected() {
    yield { verb: "add" as const, obj: { kind: "rule" as const, chain: "nope", rule: "accept" } };
  }
  const e2 = await nft.runOperations(rejected()).catch((e) => e);
  assert.ok(e2 instanceof NftablesError && isNotFound(e2), String(e2));
  assert.equal(e2.inputLine, "add rule ip t nope accept", "the line nft echoes");
  assert.equal(e2.line, 2);
});

const ENOENT_STDERR = `/dev/stdin:2:15-18: Error: Could not process rule: No such file or directory
add rule ip t nope accept
              ^^^^
/dev/stdin:3:15-19: Error: Could not process rule: No such file or directory
add rule ip t nope2 accept
              ^^^^^
`;

Deno.test("NftablesRunner.run() reports the failing line and classifies nft's message", async () => {
  const stderrs: [string, string | undefined, number | undefined][] = [
    [ENOENT_STDERR, "ENOENT", 2],
    [
      "/dev/stdin:1:19-19: Error: Could not process rule: Device or resource busy\ndelete chain ip t b\n                  ^\n",
      "EBUSY",
      1,
    ],
    [
      "/dev/stdin:3:14-14: Error: Could not process rule: File exists\nadd set ip t s { type ipv6_addr ; }\n             ^\n",
      "EEXIST",
      3,
    ],
    // nft's own lookup failure, without "Could not process rule".
    [
      "/dev/stdin:3:41-42: Error: No such file or directory; did you mean chain ‘x2’ in table ip6 ‘t’?\nadd rule ip6 t x jump x2\n                                        ^^\n",
      "ENOENT",
      3,
    ],
    // knftables' "misleading" case: the echoed input mentions ENOENT, the error itself is a syntax error.
    [
      '/dev/stdin:1:23-29: Error: syntax error, unexpected comment\nadd rule ip t c bogus comment "No such file or directory"\n                      ^^^^^^^\n',
      undefined,
      1,
    ],
    [
      "/dev/stdin:1:1-67: Error: Could not process rule: Operation not supported\nadd chain ip t c { type nat hook prerouting priority -90 ; }\n^^^\n",
      undefined,
      1,
    ],
  ];
  for (const [stderr, code, line] of stderrs) {
    const { nft } = runnerWith(() => ({ code: 1, stderr }));
    const tx = nft.newTransaction();
    tx.add({ kind: "table" });
    tx.add({ kind: "chain", name: "c2" });
    tx.add({ kind: "rule", chain: "c3", rule: "accept" });
    const err = await nft.run(tx).catch((e) => e);
    assert.ok(err instanceof NftablesError, stderr);
    assert.equal(err.code, code, stderr);
    assert.equal(err.line, line, stderr);
    assert.equal(err.inputLine, tx.line(line! - 1), "the failing line comes from our own input");
    assert.ok(err.message.includes(`line ${line}: ${err.inputLine}`), err.message);
    assert.equal(err.stderr, stderr);
  }
  const two = errorFromNft(ENOENT_STDERR, 1, ["add table ip t", "add rule ip t nope accept"]);
  assert.equal(
    two.message,
    "nft: Could not process rule: No such file or directory (line 2: add rule ip t nope accept) (and 1 more error(s))",
  );
  assert.ok(isNotFound(two) && !isAlreadyExists(two) && !isBusy(two));
  const plain = errorFromNft("netlink: Error: cache initialization failed: Operation not permitted\n", 1, []);
  assert.equal(plain.line, undefined);
  assert.equal(plain.message, "nft: cache initialization failed: Operation not permitted");
  assert.equal(errorFromNft("", 124, []).message, "nft failed (exit 124): no error output");
  assert.deepEqual(parseNftErrors('add rule ip t c accept comment "x:3:4: Error: y"\n'), []);
});

Deno.test("NftablesRunner reports an nft that cannot start as an NftablesError", async () => {
  const rec = new RecordingCommandRunner();
  rec.tryRun = (spec) => Promise.reject(new CommandError(spec, 127, "nft: command not found"));
  const nft = new NftablesRunner({ family: "ip", table: "kube-proxy", runner: rec });
  const tx = nft.newTransaction();
  tx.add({ kind: "table" });
  const err = await nft.run(tx).catch((e) => e);
  assert.ok(err instanceof NftablesError);
  assert.match(err.message, /^failed to run nft: nft -f - failed \(exit 127\)/);
  assert.ok(err.cause instanceof CommandError);
});

// Captured from `nft -j ...` (nft 1.0.6).
const TERSE_TABLE =
  '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "ip", "name": "t", "handle": 80}}, {"counter": {"family": "ip", "name": "cnt", "table": "t", "handle": 5, "packets": 0, "bytes": 0}}, {"set": {"family": "ip", "name": "to", "table": "t", "type": "ipv4_addr", "handle": 1, "flags": ["timeout"]}}, {"map": {"family": "ip", "name": "mm", "table": "t", "type": "ipv4_addr", "handle": 2, "map": "ipv4_addr"}}, {"map": {"family": "ip", "name": "vm", "table": "t", "type": ["inet_proto", "inet_service"], "handle": 4, "map": "verdict"}}, {"chain": {"family": "ip", "table": "t", "name": "c", "handle": 3}}]}';
const SET_TO =
  '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"set": {"family": "ip", "name": "to", "table": "t", "type": "ipv4_addr", "handle": 1, "flags": ["timeout"], "elem": [{"elem": {"val": "1.2.3.4", "timeout": 3600, "expires": 3599, "comment": "c"}}, "1.2.3.5"]}}]}';
const MAP_VM =
  '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"map": {"family": "ip", "name": "vm", "table": "t", "type": ["inet_proto", "inet_service"], "handle": 4, "map": "verdict", "elem": [[{"concat": ["udp", 53]}, {"accept": null}], [{"concat": ["tcp", 80]}, {"jump": {"target": "c"}}]]}}]}';
const MAP_CONCAT_COMMENT =
  '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"map": {"family": "ip", "name": "m", "table": "t", "type": ["ipv4_addr", "inet_proto", "inet_service"], "handle": 4, "map": "verdict", "elem": [[{"elem": {"val": {"concat": ["1.2.3.5", "udp", 53]}, "comment": "x"}}, {"drop": null}], [{"concat": ["1.2.3.4", "tcp", 80]}, {"goto": {"target": "c"}}]]}}]}';
const SET_INTERVAL =
  '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"set": {"family": "ip", "name": "iv", "table": "t", "type": "ipv4_addr", "handle": 6, "flags": ["interval"], "elem": [{"range": ["1.1.1.1", "1.1.1.5"]}, {"prefix": {"addr": "10.0.0.0", "len": 8}}]}}]}';
const NO_TABLE = "Error: No such file or directory\nlist table ip t\n              ^\n";

Deno.test("NftablesRunner lists names and elements from nft's JSON", async () => {
  const outputs: Record<string, string> = {
    "--json --terse list table ip kube-proxy": TERSE_TABLE,
    "--json list set ip kube-proxy to": SET_TO,
    "--json list map ip kube-proxy vm": MAP_VM,
    "--json list map ip kube-proxy m": MAP_CONCAT_COMMENT,
    "--json list set ip kube-proxy iv": SET_INTERVAL,
    "list flowtables ip": "table ip filter {\n}\ntable ip kube-proxy {\n}\n",
    // `list maps <family>` lists every table's maps: only kube-proxy's count.
    "--json list maps ip":
      '{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"map": {"family": "ip", "name": "other", "table": "filter", "type": "ipv4_addr", "map": "verdict"}}, {"map": {"family": "ip", "name": "mm", "table": "kube-proxy", "type": "ipv4_addr", "map": "ipv4_addr"}}, {"map": {"family": "ip", "name": "vm", "table": "kube-proxy", "type": ["inet_proto", "inet_service"], "map": "verdict"}}]}',
  };
  const { nft } = runnerWith((call) => ({ stdout: outputs[call.args.join(" ")] ?? "" }));
  assert.deepEqual(await nft.listAll(), { chain: ["c"], set: ["to"], map: ["mm", "vm"], counter: ["cnt"] });
  assert.deepEqual(await nft.list("map"), ["mm", "vm"]);
  assert.deepEqual(await nft.listElements("set", "to"), [
    { kind: "element", set: "to", key: ["1.2.3.4"], comment: "c", timeout: 3600 },
    { kind: "element", set: "to", key: ["1.2.3.5"] },
  ]);
  assert.deepEqual(await nft.listElements("map", "vm"), [
    { kind: "element", map: "vm", key: ["udp", "53"], value: ["accept"] },
    { kind: "element", map: "vm", key: ["tcp", "80"], value: ["jump c"] },
  ]);
  assert.deepEqual(await nft.listElements("map", "m"), [
    { kind: "element", map: "m", key: ["1.2.3.5", "udp", "53"], value: ["drop"], comment: "x" },
    { kind: "element", map: "m", key: ["1.2.3.4", "tcp", "80"], value: ["goto c"] },
  ]);
  assert.deepEqual((await nft.listElements("set", "iv")).map((e) => e.key), [["1.1.1.1-1.1.1.5"], [
    "10.0.0.0/8",
  ]]);
  assert.equal(await nft.tableExists(), true);
});

Deno.test("NftablesRunner: a missing table is ENOENT for listing and false for deleteTable()", async () => {
  const { rec, nft } = runnerWith((call) =>
    call.args[0] === "list" ? { stdout: "table ip filter {\n}\n" } : { code: 1, stderr: NO_TABLE }
  );
  assert.equal(await nft.tableExists(), false);
  const err = await nft.listAll().catch((e) => e);
  assert.ok(isNotFound(err), String(err));
  assert.match(
    err.message,
    /^failed to run nft --json --terse list table ip kube-proxy: No such file or directory/,
  );
  assert.equal(await nft.deleteTable(), false);
  assert.deepEqual(rec.calls.at(-1), {
    cmd: "nft",
    args: ["-f", "-"],
    stdin: "delete table ip kube-proxy\n",
  });
  const garbage = runnerWith(() => ({ stdout: "{not json" })).nft;
  assert.match((await garbage.listAll().catch((e) => e)).message, /^could not parse nft output/);
  const noMeta = runnerWith(() => ({ stdout: '{"nftables": [{"table": {}}]}' })).nft;
  assert.match((await noMeta.listAll().catch((e) => e)).message, /json_schema_version/);
});

Deno.test("nft and kernel version checks follow upstream", async () => {
  assert.deepEqual(parseNftVersion("nftables v1.0.6 (Lester Gooch #5)\n"), [1, 0, 6]);
  assert.equal(parseNftVersion("garbage"), undefined);
  const ok = new RecordingCommandRunner(() => ({ stdout: "nftables v1.0.6 (Lester Gooch #5)\n" }));
  assert.equal(await checkNftVersion(ok), "1.0.6");
  assert.deepEqual(ok.calls[0], { cmd: "nft", args: ["--version"], stdin: "" });
  const old = new RecordingCommandRunner(() => ({ stdout: "nftables v1.0.0 (Fearless Fosdick #2)\n" }));
  assert.equal(
    (await checkNftVersion(old).catch((e) => e)).message,
    "nft version must be v1.0.1 or later (got nftables v1.0.0 (Fearless Fosdick #2))",
  );
  const older = new RecordingCommandRunner(() => ({ stdout: "nftables v0.9.8 (E.D.S.)\n" }));
  assert.match((await checkNftVersion(older).catch((e) => e)).message, /must be v1.0.1 or later/);
  assert.equal(
    await checkNftVersion(new RecordingCommandRunner(() => ({ stdout: "nftables v1.1.0 (x)" }))),
    "1.1.0",
  );

  assert.deepEqual(parseKernelVersion("6.18.44-fc-v1147"), [6, 18, 44]);
  assert.deepEqual(parseKernelVersion("5.13"), [5, 13]);
  assert.equal(parseKernelVersion("6"), undefined);
  assert.equal(kernelVersionProblem("6.18.44-fc-v1147", undefined), undefined);
  assert.equal(kernelVersionProblem("5.13.0-1-generic", undefined), undefined);
  assert.equal(
    kernelVersionProblem("5.10.0-21-amd64", undefined),
    "kube-proxy in nftables mode requires kernel 5.13 or later",
  );
  assert.equal(kernelVersionProblem("5.10.0-21-amd64", ""), kernelVersionProblem("5.10.0", undefined));
  assert.equal(
    kernelVersionProblem("5.10.0-21-amd64", "1"),
    undefined,
    "any non-empty value skips the check",
  );
  assert.match(kernelVersionProblem("weird", undefined)!, /^could not check kernel version: /);
});

Deno.test("NftablesRunner: the table's existence is read without nft fetching its rules and elements", async () => {
  // `list tables` makes nft 1.0.6 fetch the whole ruleset (3.2 s at 10k Services); `list flowtables` does not.
  const { rec, nft } = runnerWith((call) =>
    call.args.join(" ") === "list flowtables ip" ? { stdout: "table ip kube-proxy {\n}\n" } : { code: 1 }
  );
  assert.equal(await nft.tableExists(), true);
  assert.deepEqual(rec.calls.map((c) => c.args.join(" ")), ["list flowtables ip"]);
  // An nft that lists only tables with flowtables: the chain declarations decide.
  const older = runnerWith((call) =>
    call.args.join(" ") === "list chains ip"
      ? { stdout: "table ip kube-proxy {\n\tchain services {\n\t}\n}\n" }
      : { stdout: "" }
  );
  assert.equal(await older.nft.tableExists(), true);
  assert.deepEqual(older.rec.calls.map((c) => c.args.join(" ")), ["list flowtables ip", "list chains ip"]);
});
