/**
 * Exact `nft -f -` lines for every object and verb (knftables' spelling), the validation errors, and
 * priority parsing.
 */
import assert from "node:assert/strict";
import {
  concat,
  type NftObject,
  parsePriority,
  Transaction,
  validateObject,
  type Verb,
  writeObject,
} from "../../../lib/dataplane/nftables/mod.ts";

const cases: { verb: Verb; obj: NftObject; line: string }[] = [
  { verb: "add", obj: { kind: "table" }, line: "add table ip kube-proxy" },
  {
    verb: "add",
    obj: { kind: "table", comment: "rules for kube-proxy" },
    line: 'add table ip kube-proxy { comment "rules for kube-proxy" ; }',
  },
  {
    verb: "create",
    obj: { kind: "table", comment: "c", flags: ["dormant"] },
    line: 'create table ip kube-proxy { comment "c" ; flags dormant ; }',
  },
  { verb: "flush", obj: { kind: "table" }, line: "flush table ip kube-proxy" },
  { verb: "delete", obj: { kind: "table" }, line: "delete table ip kube-proxy" },
  { verb: "delete", obj: { kind: "table", handle: 7 }, line: "delete table ip handle 7" },
  { verb: "destroy", obj: { kind: "table" }, line: "destroy table ip kube-proxy" },
  { verb: "add", obj: { kind: "chain", name: "services" }, line: "add chain ip kube-proxy services" },
  {
    verb: "add",
    obj: {
      kind: "chain",
      name: "reject-chain",
      comment: "helper for @no-endpoint-services / @no-endpoint-nodeports",
    },
    line:
      'add chain ip kube-proxy reject-chain { comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ; }',
  },
  {
    verb: "add",
    obj: { kind: "chain", name: "nat-prerouting", type: "nat", hook: "prerouting", priority: "dstnat" },
    line: "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
  },
  {
    verb: "add",
    obj: {
      kind: "chain",
      name: "filter-output-pre-dnat",
      type: "filter",
      hook: "output",
      priority: "dstnat-10",
    },
    line: "add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }",
  },
  {
    verb: "create",
    obj: {
      kind: "chain",
      name: "fwd",
      type: "filter",
      hook: "forward",
      priority: "filter + 5",
      policy: "drop",
      comment: "x",
    },
    line:
      'create chain ip kube-proxy fwd { type filter hook forward priority 5 ; policy drop ; comment "x" ; }',
  },
  {
    verb: "add",
    obj: { kind: "chain", name: "in", type: "filter", hook: "ingress", priority: -5, device: "eth0" },
    line: 'add chain ip kube-proxy in { type filter hook ingress device "eth0" priority -5 ; }',
  },
  // Properties other than the name are not written for flush/delete.
  {
    verb: "flush",
    obj: { kind: "chain", name: "nat-output", type: "nat", hook: "output", priority: "dstnat" },
    line: "flush chain ip kube-proxy nat-output",
  },
  { verb: "delete", obj: { kind: "chain", name: "services" }, line: "delete chain ip kube-proxy services" },
  {
    verb: "delete",
    obj: { kind: "chain", handle: 4, name: "" },
    line: "delete chain ip kube-proxy handle 4",
  },
  {
    verb: "add",
    obj: { kind: "rule", chain: "services", rule: "ip daddr . meta l4proto . th dport vmap @service-ips" },
    line: "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
  },
  {
    verb: "add",
    obj: {
      kind: "rule",
      chain: "cluster-ips-check",
      rule: "ip daddr @cluster-ips reject",
      comment: "Reject traffic to invalid ports of ClusterIPs",
    },
    line:
      'add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"',
  },
  {
    verb: "add",
    obj: { kind: "rule", chain: "c", rule: "drop", index: 2 },
    line: "add rule ip kube-proxy c index 2 drop",
  },
  {
    verb: "insert",
    obj: { kind: "rule", chain: "c", rule: "drop", handle: 9 },
    line: "insert rule ip kube-proxy c handle 9 drop",
  },
  {
    verb: "insert",
    obj: { kind: "rule", chain: "c", rule: "accept" },
    line: "insert rule ip kube-proxy c accept",
  },
  {
    verb: "replace",
    obj: { kind: "rule", chain: "c", rule: "accept", handle: 9, comment: "r" },
    line: 'replace rule ip kube-proxy c handle 9 accept comment "r"',
  },
  {
    verb: "delete",
    obj: { kind: "rule", chain: "c", handle: 9 },
    line: "delete rule ip kube-proxy c handle 9",
  },
  {
    verb: "add",
    obj: { kind: "set", name: "cluster-ips", type: "ipv4_addr", comment: "Active ClusterIPs" },
    line: 'add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }',
  },
  {
    verb: "add",
    obj: {
      kind: "set",
      name: "affinity-X",
      type: "ipv4_addr",
      flags: ["dynamic", "timeout"],
      timeout: 10800,
    },
    line: "add set ip kube-proxy affinity-X { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }",
  },
  {
    verb: "create",
    obj: {
      kind: "set",
      name: "s",
      typeof: "ip saddr",
      flags: ["interval"],
      gcInterval: 30,
      size: 1000,
      policy: "memory",
      autoMerge: true,
      comment: "all",
    },
    line:
      'create set ip kube-proxy s { typeof ip saddr ; flags interval ; gc-interval 30s ; size 1000 ; policy memory ; auto-merge ; comment "all" ; }',
  },
  { verb: "flush", obj: { kind: "set", name: "s" }, line: "flush set ip kube-proxy s" },
  { verb: "delete", obj: { kind: "set", name: "s" }, line: "delete set ip kube-proxy s" },
  { verb: "delete", obj: { kind: "set", name: "", handle: 3 }, line: "delete set ip kube-proxy handle 3" },
  {
    verb: "add",
    obj: {
      kind: "map",
      name: "service-ips",
      type: "ipv4_addr . inet_proto . inet_service : verdict",
      comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic",
    },
    line:
      'add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ; }',
  },
  { verb: "flush", obj: { kind: "map", name: "service-ips" }, line: "flush map ip kube-proxy service-ips" },
  {
    verb: "add",
    obj: { kind: "element", set: "cluster-ips", key: ["172.30.0.41"] },
    line: "add element ip kube-proxy cluster-ips { 172.30.0.41 }",
  },
  {
    verb: "add",
    obj: {
      kind: "element",
      map: "service-ips",
      key: ["172.30.0.41", "tcp", "80"],
      value: ["goto service-ULMVA6XW-ns1/svc1/tcp/p80"],
    },
    line:
      "add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }",
  },
  {
    verb: "add",
    obj: {
      kind: "element",
      map: "no-endpoint-services",
      key: ["172.30.0.42", "udp", "53"],
      value: ["goto reject-chain"],
      comment: "ns2/svc2:p53",
    },
    line:
      'add element ip kube-proxy no-endpoint-services { 172.30.0.42 . udp . 53 comment "ns2/svc2:p53" : goto reject-chain }',
  },
  {
    verb: "create",
    obj: { kind: "element", set: "affinity-X", key: ["10.0.0.1"], timeout: 60, comment: "c" },
    line: 'create element ip kube-proxy affinity-X { 10.0.0.1 timeout 60s comment "c" }',
  },
  // The value, comment and timeout are not written for delete.
  {
    verb: "delete",
    obj: {
      kind: "element",
      map: "service-ips",
      key: ["172.30.0.41", "tcp", "80"],
      value: ["drop"],
      comment: "x",
    },
    line: "delete element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 }",
  },
  { verb: "add", obj: { kind: "counter", name: "c1" }, line: "add counter ip kube-proxy c1" },
  {
    verb: "add",
    obj: { kind: "counter", name: "c1", comment: "x", packets: 1, bytes: 2 },
    line: 'add counter ip kube-proxy c1 { packets 1 bytes 2 ; comment "x" ; }',
  },
  { verb: "reset", obj: { kind: "counter", name: "c1" }, line: "reset counter ip kube-proxy c1" },
  { verb: "delete", obj: { kind: "counter", name: "c1" }, line: "delete counter ip kube-proxy c1" },
];

Deno.test("writeObject() writes each object and verb as knftables does", async (t) => {
  for (const [i, c] of cases.entries()) {
    await t.step(`case ${i}: ${c.verb} ${c.obj.kind}`, () => {
      assert.equal(validateObject(c.verb, c.obj, "ip"), undefined, `case ${i} should be valid`);
      assert.equal(writeObject(c.verb, c.obj, "ip", "kube-proxy"), c.line, `case ${i}`);
    });
  }
});

const invalid: { verb: Verb; obj: NftObject; error: RegExp }[] = [
  { verb: "insert", obj: { kind: "table" }, error: /insert is not implemented for tables/ },
  { verb: "add", obj: { kind: "table", handle: 3 }, error: /cannot specify handle in add/ },
  { verb: "add", obj: { kind: "chain", name: "" }, error: /no name specified for chain/ },
  { verb: "add", obj: { kind: "chain", name: "a b" }, error: /contains a character nft cannot parse/ },
  { verb: "add", obj: { kind: "chain", name: "x".repeat(256) }, error: /longer than 255 bytes/ },
  {
    verb: "add",
    obj: { kind: "chain", name: "c", type: "nat", priority: 0 },
    error: /must not specify type/,
  },
  { verb: "add", obj: { kind: "chain", name: "c", policy: "drop" }, error: /must not specify policy/ },
  { verb: "add", obj: { kind: "chain", name: "c", hook: "input" }, error: /must specify type and priority/ },
  {
    verb: "add",
    obj: { kind: "chain", name: "c", type: "nat", hook: "input", priority: "dnat" },
    error: /unknown priority "dnat"/,
  },
  { verb: "delete", obj: { kind: "chain", name: "" }, error: /either name or handle/ },
  { verb: "add", obj: { kind: "chain", name: "c", comment: 'say "hi"' }, error: /quote or line break/ },
  { verb: "add", obj: { kind: "chain", name: "c", comment: "é".repeat(65) }, error: /longer than 128 bytes/ },
  { verb: "add", obj: { kind: "rule", chain: "c" }, error: /no rule specified/ },
  { verb: "add", obj: { kind: "rule", chain: "", rule: "x" }, error: /no chain name specified/ },
  { verb: "add", obj: { kind: "rule", chain: "c", rule: "a\nb" }, error: /line break/ },
  {
    verb: "add",
    obj: { kind: "rule", chain: "c", rule: "x", index: 1, handle: 2 },
    error: /both index and handle/,
  },
  {
    verb: "replace",
    obj: { kind: "rule", chain: "c", rule: "x" },
    error: /must specify handle with replace/,
  },
  { verb: "delete", obj: { kind: "rule", chain: "c" }, error: /must specify handle with delete/ },
  {
    verb: "flush",
    obj: { kind: "rule", chain: "c" } as NftObject,
    error: /flush is not implemented for rules/,
  },
  { verb: "add", obj: { kind: "set", name: "s" }, error: /either type or typeof/ },
  { verb: "add", obj: { kind: "set", name: "s", type: "a", typeof: "b" }, error: /either type or typeof/ },
  { verb: "add", obj: { kind: "map", name: "m", type: "ipv4_addr" }, error: /no " : " value type/ },
  { verb: "add", obj: { kind: "set", name: "s", type: "ipv4_addr : verdict" }, error: /use a map/ },
  { verb: "add", obj: { kind: "set", name: "s", type: "ipv4_addr", timeout: 1.5 }, error: /whole number/ },
  { verb: "add", obj: { kind: "element", key: ["1"] }, error: /no set\/map name/ },
  {
    verb: "add",
    obj: { kind: "element", set: "s", map: "m", key: ["1"] },
    error: /both a set name and a map/,
  },
  { verb: "add", obj: { kind: "element", set: "s", key: [] }, error: /no key specified/ },
  {
    verb: "add",
    obj: { kind: "element", set: "s", key: ["1"], value: ["drop"] },
    error: /map value specified/,
  },
  { verb: "add", obj: { kind: "element", map: "m", key: ["1"] }, error: /no map value specified/ },
  { verb: "add", obj: { kind: "element", set: "s", key: ["1 }"] }, error: /invalid key part/ },
  { verb: "add", obj: { kind: "counter", name: "c", packets: 1 }, error: /packets without bytes/ },
];

Deno.test("validateObject() rejects what nft cannot take, naming the problem", async (t) => {
  for (const [i, c] of invalid.entries()) {
    await t.step(`case ${i}: ${c.verb} ${c.obj.kind}`, () => {
      const problem = validateObject(c.verb, c.obj, "ip");
      assert.ok(problem !== undefined, `case ${i} should be invalid`);
      assert.match(problem, c.error, `case ${i}`);
    });
  }
});

Deno.test("parsePriority() reads numbers, names and name±offset as knftables.ParsePriority", () => {
  assert.equal(parsePriority("ip", -110), -110);
  assert.equal(parsePriority("ip", "-110"), -110);
  assert.equal(parsePriority("ip", "dstnat"), -100);
  assert.equal(parsePriority("ip", "dstnat-10"), -110);
  assert.equal(parsePriority("ip", "dstnat - 10"), -110);
  assert.equal(parsePriority("ip6", "filter+5"), 5);
  assert.equal(parsePriority("ip", "srcnat"), 100);
  assert.equal(parsePriority("ip", "raw"), -300);
  assert.equal(parsePriority("ip", "security"), 50);
  assert.equal(parsePriority("bridge", "dstnat"), -300);
  assert.equal(parsePriority("bridge", "out"), 100);
  assert.equal(parsePriority("ip", "out"), undefined);
  assert.equal(parsePriority("ip", "dstnat-"), undefined);
  assert.equal(parsePriority("ip", 1.5), undefined);
});

Deno.test("concat() joins words as knftables.Concat, gluing '@' to the set name", () => {
  assert.equal(concat("ip", "daddr", "@", "cluster-ips", "reject"), "ip daddr @cluster-ips reject");
  assert.equal(concat("", "jump", "services"), "jump services");
  assert.equal(
    concat("numgen random mod", 2, "vmap", "{", ["0", ":", "goto", "a", ",", "1", ":", "goto", "b"], "}"),
    "numgen random mod 2 vmap { 0 : goto a , 1 : goto b }",
  );
});

Deno.test("Transaction keeps the first invalid operation and reports it in toString()", () => {
  const tx = new Transaction("ip", "kube-proxy");
  tx.add({ kind: "table" });
  tx.add({ kind: "chain", name: "" });
  tx.add({ kind: "chain", name: "later" }); // ignored after the error
  assert.equal(tx.numOperations, 1);
  assert.ok(tx.error?.invalid);
  assert.match(tx.error!.message, /^invalid operation 2 \(add chain\): no name specified for chain$/);
  assert.equal(
    tx.toString(),
    "add table ip kube-proxy\n# ERROR: invalid operation 2 (add chain): no name specified for chain",
  );
});

Deno.test("Transaction renders one line per operation and encodes the same bytes", () => {
  const tx = new Transaction("ip6", "kube-proxy");
  tx.add({ kind: "table", comment: "rules for kube-proxy" });
  tx.add({ kind: "set", name: "cluster-ips", type: "ipv6_addr", comment: "Active ClusterIPs" });
  tx.add({ kind: "element", set: "cluster-ips", key: ["fd00:10:96::1"], comment: "ns/é" });
  const text = tx.toString();
  assert.equal(text.split("\n").length, 4);
  assert.deepEqual(tx.lines(), text.trimEnd().split("\n"));
  assert.equal(tx.line(2), 'add element ip6 kube-proxy cluster-ips { fd00:10:96::1 comment "ns/é" }');
  const bytes = tx.encode();
  assert.equal(new TextDecoder().decode(bytes), text);
  assert.equal(bytes.length, text.length + 1); // "é" is two bytes
  assert.equal(tx.byteLength(), bytes.length);
  const wide = new Transaction("ip", "t");
  wide.add({ kind: "rule", chain: "c", rule: "accept", comment: "€ 😀 ü" });
  assert.equal(wide.byteLength(), wide.encode().length);
  assert.equal(new Transaction("ip", "t").toString(), "");
});

Deno.test("Transaction with a bad family or table name is invalid from the start", () => {
  assert.match(new Transaction("ipx" as "ip", "t").error!.message, /invalid nftables family/);
  assert.match(new Transaction("ip", "bad name").error!.message, /invalid table name/);
});
