/**
 * The fake's semantics: atomic transactions, the kernel's error classes (not found, exists, busy),
 * kernel side effects, listing, and the exact `nft list table` dump. (kernel_test.ts checks the same
 * behaviour against the real kernel.)
 */
import assert from "node:assert/strict";
import {
  FakeNftables,
  isAlreadyExists,
  isBusy,
  isNotFound,
  NftablesError,
  type Transaction,
} from "../../../lib/dataplane/nftables/mod.ts";

/** A fake with table `ip kube-proxy`, chains a, b, c, set s, map m (verdict) and vmap m → b. */
async function base(): Promise<FakeNftables> {
  const nft = new FakeNftables("ip", "kube-proxy");
  const tx = nft.newTransaction();
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  for (const name of ["a", "b", "c"]) tx.add({ kind: "chain", name });
  tx.add({ kind: "set", name: "s", type: "ipv4_addr", comment: "set s" });
  tx.add({ kind: "map", name: "m", type: "ipv4_addr . inet_proto . inet_service : verdict" });
  tx.add({ kind: "rule", chain: "a", rule: "ip daddr . meta l4proto . th dport vmap @m" });
  tx.add({ kind: "element", map: "m", key: ["10.0.0.1", "tcp", "80"], value: ["goto b"] });
  tx.add({ kind: "element", set: "s", key: ["10.0.0.9"], comment: "nine" });
  await nft.run(tx);
  return nft;
}

async function failure(nft: FakeNftables, build: (tx: Transaction) => void): Promise<NftablesError> {
  const before = nft.dump();
  const tx = nft.newTransaction();
  build(tx);
  const err = await nft.run(tx).then(() => undefined, (e) => e);
  assert.ok(err instanceof NftablesError, `expected an NftablesError, got ${err}`);
  assert.equal(nft.dump(), before, "a failed transaction must change nothing");
  return err;
}

Deno.test("fake: add of an existing object is a no-op, create of one fails with EEXIST", async () => {
  const nft = await base();
  const before = nft.dump();
  const tx = nft.newTransaction();
  tx.add({ kind: "table", comment: "another comment" });
  tx.add({ kind: "chain", name: "a", comment: "ignored" });
  tx.add({ kind: "set", name: "s", type: "ipv4_addr", comment: "ignored" });
  tx.add({ kind: "element", set: "s", key: ["10.0.0.9"], comment: "ignored" });
  tx.add({ kind: "element", map: "m", key: ["10.0.0.1", "tcp", "80"], value: ["goto b"] });
  await nft.run(tx);
  assert.equal(nft.dump(), before);
  for (
    const obj of [
      { kind: "table" },
      { kind: "chain", name: "a" },
      { kind: "set", name: "s", type: "ipv4_addr" },
      { kind: "map", name: "s", type: "ipv4_addr : verdict" }, // sets and maps share one namespace
      { kind: "element", set: "s", key: ["10.0.0.9"] },
    ] as const
  ) {
    const err = await failure(nft, (tx) => tx.create(obj));
    assert.ok(isAlreadyExists(err), `create ${obj.kind}: ${err.message}`);
    assert.equal(err.line, 1);
  }
});

Deno.test("fake: missing objects and references fail with ENOENT and the failing line", async () => {
  const nft = await base();
  const cases: [string, (tx: Transaction) => void][] = [
    ["delete missing chain", (tx) => tx.delete({ kind: "chain", name: "nope" })],
    ["flush missing set", (tx) => tx.flush({ kind: "set", name: "nope" })],
    ["rule in missing chain", (tx) => tx.add({ kind: "rule", chain: "nope", rule: "accept" })],
    ["jump to missing chain", (tx) => tx.add({ kind: "rule", chain: "c", rule: "jump nope" })],
    [
      "goto inside vmap",
      (tx) => tx.add({ kind: "rule", chain: "c", rule: "numgen random mod 1 vmap { 0 : goto nope }" }),
    ],
    ["missing @set", (tx) => tx.add({ kind: "rule", chain: "c", rule: "ip saddr @nope drop" })],
    ["missing counter", (tx) => tx.add({ kind: "rule", chain: "c", rule: "counter name nope" })],
    ["element of missing map", (tx) => tx.add({ kind: "element", map: "nope", key: ["1"], value: ["drop"] })],
    [
      "element going to missing chain",
      (tx) => tx.add({ kind: "element", map: "m", key: ["10.0.0.2", "udp", "53"], value: ["goto nope"] }),
    ],
    ["delete missing element", (tx) => tx.delete({ kind: "element", set: "s", key: ["10.0.0.8"] })],
    ["rule index out of range", (tx) => tx.add({ kind: "rule", chain: "a", rule: "drop", index: 1 })],
    ["missing rule handle", (tx) => tx.delete({ kind: "rule", chain: "a", handle: 999 })],
    ["replace missing handle", (tx) => tx.replace({ kind: "rule", chain: "a", rule: "drop", handle: 999 })],
  ];
  for (const [name, build] of cases) {
    const err = await failure(nft, (tx) => {
      tx.add({ kind: "chain", name: "d" }); // line 1 succeeds and must be rolled back
      build(tx);
    });
    assert.ok(isNotFound(err), `${name}: ${err.message}`);
    assert.equal(err.line, 2, name);
    assert.ok(err.inputLine && err.message.includes(err.inputLine), name);
  }
  const notMap = await failure(nft, (tx) => tx.add({ kind: "rule", chain: "c", rule: "ip daddr vmap @s" }));
  assert.equal(notMap.code, undefined);
  assert.match(notMap.message, /Expression is not a map/);
  const noTable = new FakeNftables("ip6", "kube-proxy");
  const tx = noTable.newTransaction();
  tx.add({ kind: "chain", name: "x" });
  assert.ok(isNotFound(await noTable.run(tx).catch((e) => e)));
});

Deno.test("fake: deleting a chain, set or counter still referenced fails with EBUSY", async () => {
  const nft = await base();
  // b is referenced by m's element, m by a's rule.
  assert.ok(isBusy(await failure(nft, (tx) => tx.delete({ kind: "chain", name: "b" }))));
  assert.ok(isBusy(await failure(nft, (tx) => tx.delete({ kind: "map", name: "m" }))));
  const tx = nft.newTransaction();
  tx.add({ kind: "counter", name: "cnt" });
  tx.add({ kind: "rule", chain: "c", rule: "ip saddr @s counter name cnt jump b" });
  await nft.run(tx);
  assert.equal(nft.defaultTable!.chains.get("b")!.refs, 2);
  assert.ok(isBusy(await failure(nft, (tx) => tx.delete({ kind: "set", name: "s" }))));
  assert.ok(isBusy(await failure(nft, (tx) => tx.delete({ kind: "counter", name: "cnt" }))));
  // Removing the references in the same transaction frees them, as in the kernel.
  const ok = nft.newTransaction();
  ok.flush({ kind: "chain", name: "c" });
  ok.delete({ kind: "element", map: "m", key: ["10.0.0.1", "tcp", "80"] });
  ok.delete({ kind: "chain", name: "b" });
  ok.delete({ kind: "set", name: "s" });
  ok.delete({ kind: "counter", name: "cnt" });
  ok.delete({ kind: "chain", name: "a" }); // a chain with rules can be deleted; its rules go with it
  ok.delete({ kind: "map", name: "m" });
  await nft.run(ok);
  assert.deepEqual(await nft.listAll(), { chain: ["c"], set: [], map: [], counter: [] });
});

Deno.test("fake: a failed transaction leaves no partial change and check() never changes anything", async () => {
  const nft = await base();
  const before = nft.dump();
  const tx = nft.newTransaction();
  tx.flush({ kind: "map", name: "m" });
  tx.delete({ kind: "rule", chain: "a", handle: nft.defaultTable!.chains.get("a")!.rules[0].handle });
  tx.delete({ kind: "chain", name: "c" });
  tx.add({ kind: "chain", name: "new" });
  tx.add({ kind: "element", set: "s", key: ["10.0.0.10"] });
  tx.add({ kind: "set", name: "s2", type: "ipv4_addr" });
  tx.add({ kind: "rule", chain: "new", rule: "jump nope" });
  const err = await nft.run(tx).catch((e) => e);
  assert.ok(isNotFound(err));
  assert.equal(err.line, 7);
  assert.equal(nft.dump(), before);
  assert.equal(nft.defaultTable!.chains.get("b")!.refs, 1, "refcounts are restored too");
  assert.equal(nft.defaultTable!.maps.get("m")!.refs, 1);
  const good = nft.newTransaction();
  good.add({ kind: "chain", name: "new" });
  await nft.check(good);
  assert.equal(nft.dump(), before);
  assert.equal(nft.lastTransaction, tx, "check() does not record lastTransaction");
  const invalid = nft.newTransaction();
  invalid.add({ kind: "chain", name: "" });
  const e2 = await nft.run(invalid).catch((e) => e);
  assert.ok(e2 instanceof NftablesError && e2.invalid);
});

Deno.test("fake: map elements clash on another value; interval sets reject overlaps unless auto-merge", async () => {
  const nft = await base();
  const clash = await failure(
    nft,
    (tx) => tx.add({ kind: "element", map: "m", key: ["10.0.0.1", "tcp", "80"], value: ["drop"] }),
  );
  assert.ok(isAlreadyExists(clash));
  const tx = nft.newTransaction();
  tx.add({ kind: "set", name: "iv", type: "ipv4_addr", flags: ["interval"] });
  tx.add({ kind: "set", name: "am", type: "ipv4_addr", flags: ["interval"], autoMerge: true });
  tx.add({ kind: "element", set: "iv", key: ["10.0.0.0/8"] });
  tx.add({ kind: "element", set: "iv", key: ["192.168.0.0-192.168.255.255"] });
  for (const k of ["10.0.0.0/24", "10.0.3.6", "10.0.1.0/24", "10.0.3.5", "10.0.2.0/24"]) {
    tx.add({ kind: "element", set: "am", key: [k] });
  }
  await nft.run(tx);
  const overlap = await failure(nft, (tx) => tx.add({ kind: "element", set: "iv", key: ["10.1.0.0/16"] }));
  assert.equal(overlap.code, undefined);
  assert.match(overlap.message, /interval overlaps with an existing one/);
  assert.match(
    (await failure(nft, (tx) => tx.delete({ kind: "element", set: "iv", key: ["10.0.0.0/16"] }))).message,
    /element does not exist/,
  );
  const del = nft.newTransaction();
  del.delete({ kind: "element", set: "iv", key: ["192.168.0.0/16"] }); // the same interval, written as a prefix
  await nft.run(del);
  assert.deepEqual((await nft.listElements("set", "iv")).map((e) => e.key), [["10.0.0.0/8"]]);
  assert.deepEqual((await nft.listElements("set", "am")).map((e) => e.key), [["10.0.0.0-10.0.2.255"], [
    "10.0.3.5-10.0.3.6",
  ]]);
});

Deno.test("fake: kernel side effects (dynset size and flag, set re-add, flush table, chain re-add)", async () => {
  const nft = await base();
  const tx = nft.newTransaction();
  tx.add({ kind: "set", name: "aff", type: "ipv4_addr", flags: ["timeout"], timeout: 60 });
  tx.add({ kind: "rule", chain: "c", rule: "update @aff { ip saddr }" });
  tx.add({ kind: "chain", name: "nat-pre", type: "nat", hook: "prerouting", priority: "dstnat" });
  await nft.run(tx);
  const aff = nft.defaultTable!.sets.get("aff")!;
  assert.deepEqual(aff.flags, ["dynamic", "timeout"]);
  assert.equal(aff.size, 65535);
  // The set is now dynamic, so re-adding it as declared fails (upstream's comment about RHEL8).
  assert.ok(isAlreadyExists(
    await failure(
      nft,
      (tx) => tx.add({ kind: "set", name: "aff", type: "ipv4_addr", flags: ["timeout"], timeout: 60 }),
    ),
  ));
  const readd = nft.newTransaction();
  readd.add({
    kind: "set",
    name: "aff",
    type: "ipv4_addr",
    flags: ["dynamic", "timeout"],
    timeout: 30,
    size: 100,
  });
  await nft.run(readd);
  assert.equal(aff.timeout, 30);
  assert.equal(aff.size, 100);
  const prio = await failure(
    nft,
    (tx) => tx.add({ kind: "chain", name: "nat-pre", type: "nat", hook: "prerouting", priority: -90 }),
  );
  assert.equal(prio.code, undefined);
  assert.match(prio.message, /Operation not supported/);
  assert.ok(isAlreadyExists(
    await failure(
      nft,
      (tx) => tx.add({ kind: "chain", name: "c", type: "filter", hook: "input", priority: 0 }),
    ),
  ));
  const same = nft.newTransaction();
  same.add({ kind: "chain", name: "nat-pre", type: "nat", hook: "prerouting", priority: -100 });
  same.add({ kind: "chain", name: "nat-pre" });
  same.flush({ kind: "table" });
  await nft.run(same);
  const t = nft.defaultTable!;
  assert.ok([...t.chains.values()].every((c) => c.rules.length === 0));
  assert.equal(t.sets.get("s")!.elements.size, 1, "flush table keeps set elements");
  assert.equal(t.chains.get("b")!.refs, 1, "the map element still refers to b");
  const timeout = await failure(
    nft,
    (tx) => tx.add({ kind: "element", set: "s", key: ["1.1.1.1"], timeout: 5 }),
  );
  assert.match(timeout.message, /Invalid argument/);
});

Deno.test("fake: rules go where add/insert/replace put them, by index or handle", async () => {
  const nft = await base();
  const tx = nft.newTransaction();
  tx.add({ kind: "rule", chain: "c", rule: "accept" });
  tx.add({ kind: "rule", chain: "c", rule: "drop" });
  tx.add({ kind: "rule", chain: "c", rule: "counter", index: 0 });
  tx.insert({ kind: "rule", chain: "c", rule: "return", index: 0 });
  tx.insert({ kind: "rule", chain: "c", rule: "jump a", comment: "first" });
  await nft.run(tx);
  const c = nft.defaultTable!.chains.get("c")!;
  assert.deepEqual(c.rules.map((r) => r.rule), ["jump a", "return", "accept", "counter", "drop"]);
  const h = c.rules[2].handle;
  const tx2 = nft.newTransaction();
  tx2.replace({ kind: "rule", chain: "c", rule: "jump b", handle: h });
  tx2.add({ kind: "rule", chain: "c", rule: "reject", handle: h });
  tx2.delete({ kind: "rule", chain: "c", handle: c.rules[0].handle });
  await nft.run(tx2);
  const c2 = nft.defaultTable!.chains.get("c")!;
  assert.deepEqual(c2.rules.map((r) => r.rule), ["return", "jump b", "reject", "counter", "drop"]);
  assert.equal(c2.rules[1].handle, h, "replace keeps the handle");
  assert.equal(nft.defaultTable!.chains.get("a")!.refs, 0);
  assert.equal(nft.defaultTable!.chains.get("b")!.refs, 2);
});

Deno.test("fake: listing returns names in kernel order and elements as nft prints them", async () => {
  const nft = await base();
  const tx = nft.newTransaction();
  tx.add({ kind: "set", name: "v6", type: "ipv4_addr", flags: ["timeout"] });
  tx.add({ kind: "element", set: "v6", key: ["10.1.1.1"], timeout: 30, comment: "c" });
  tx.add({
    kind: "element",
    map: "m",
    key: ["10.0.0.2", "6", "053"],
    value: ["drop"],
    comment: "ns/svc:dns",
  });
  await nft.run(tx);
  assert.deepEqual(await nft.list("set"), ["s", "v6"]);
  assert.deepEqual(await nft.list("chain"), ["a", "b", "c"]);
  assert.deepEqual(await nft.listElements("map", "m"), [
    { kind: "element", map: "m", key: ["10.0.0.1", "tcp", "80"], value: ["goto b"] },
    { kind: "element", map: "m", key: ["10.0.0.2", "tcp", "53"], value: ["drop"], comment: "ns/svc:dns" },
  ]);
  assert.deepEqual(await nft.listElements("set", "v6"), [
    { kind: "element", set: "v6", key: ["10.1.1.1"], comment: "c", timeout: 30 },
  ]);
  assert.ok(nft.defaultTable!.maps.get("m")!.find(["10.0.0.2", "tcp", "53"]));
  assert.ok(isNotFound(await nft.listElements("set", "nope").catch((e) => e)));
  assert.equal(await nft.tableExists(), true);
  assert.equal(await nft.deleteTable(), true);
  assert.equal(await nft.deleteTable(), false);
  assert.ok(isNotFound(await nft.listAll().catch((e) => e)));
  assert.equal(nft.dump(), "");
});

Deno.test("fake: element keys are checked against the set's datatypes", async () => {
  const nft = await base();
  for (
    const [key, msg] of [
      [["10.0.0.1", "tcp"], /2 part\(s\) but the type has 3/],
      [["fd00::1", "tcp", "80"], /invalid ipv4_addr/],
      [["10.0.0.1", "tcp", "99999"], /invalid inet_service/],
      [["10.0.0.1", "bogus", "80"], /invalid inet_proto/],
    ] as const
  ) {
    const err = await failure(nft, (tx) => tx.add({ kind: "element", map: "m", key, value: ["drop"] }));
    assert.match(err.message, msg);
  }
  assert.match(
    (await failure(
      nft,
      (tx) => tx.add({ kind: "element", map: "m", key: ["10.0.0.1", "tcp", "1"], value: ["goto"] }),
    )).message,
    /invalid verdict/,
  );
});

Deno.test("fake: dump() prints the table exactly as nft list table", async () => {
  const nft = new FakeNftables("ip", "kube-proxy");
  const tx = nft.newTransaction();
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  tx.add({ kind: "chain", name: "nat-prerouting", type: "nat", hook: "prerouting", priority: "dstnat" });
  tx.add({
    kind: "chain",
    name: "filter-output-pre-dnat",
    type: "filter",
    hook: "output",
    priority: "dstnat-10",
  });
  tx.add({ kind: "chain", name: "reject-chain", comment: "helper" });
  tx.add({ kind: "rule", chain: "reject-chain", rule: "reject" });
  tx.add({ kind: "rule", chain: "nat-prerouting", rule: "mark set mark or 0x4000", comment: "m" });
  tx.add({ kind: "set", name: "cluster-ips", type: "ipv4_addr", comment: "Active ClusterIPs" });
  tx.add({ kind: "map", name: "np", type: "inet_proto . inet_service : verdict" });
  tx.add({ kind: "set", name: "aff", type: "ipv4_addr", flags: ["dynamic", "timeout"], timeout: 10800 });
  tx.add({ kind: "counter", name: "cnt", comment: "cc" });
  for (const ip of ["172.30.0.41", "172.30.0.5", "172.30.0.100"]) {
    tx.add({ kind: "element", set: "cluster-ips", key: [ip] });
  }
  tx.add({
    kind: "element",
    map: "np",
    key: ["tcp", "30080"],
    value: ["goto reject-chain"],
    comment: "ns/a:p",
  });
  tx.add({ kind: "element", map: "np", key: ["udp", "30053"], value: ["drop"] });
  tx.add({ kind: "element", set: "aff", key: ["1.2.3.5"], timeout: 5 });
  tx.add({ kind: "element", set: "aff", key: ["1.2.3.4"], timeout: 10800 });
  await nft.run(tx);
  assert.equal(
    nft.dump(),
    `table ip kube-proxy {
	comment "rules for kube-proxy"
	counter cnt {
		comment "cc"
		packets 0 bytes 0
	}

	set cluster-ips {
		type ipv4_addr
		comment "Active ClusterIPs"
		elements = { 172.30.0.41, 172.30.0.5,
			     172.30.0.100 }
	}

	map np {
		type inet_proto . inet_service : verdict
		elements = { tcp . 30080 comment "ns/a:p" : goto reject-chain,
			     udp . 30053 : drop }
	}

	set aff {
		type ipv4_addr
		flags dynamic,timeout
		timeout 3h
		elements = { 1.2.3.5 timeout 5s, 1.2.3.4 }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		meta mark set meta mark | 0x00004000 comment "m"
	}

	chain filter-output-pre-dnat {
		type filter hook output priority -110; policy accept;
	}

	chain reject-chain {
		comment "helper"
		reject
	}
}
`,
  );
  assert.equal(new FakeNftables("ip", "other").dump(), "");
});
