/**
 * The fake's printing helpers against what nft 1.0.6 printed here: rule canonicalization, references,
 * priorities, durations, element wrapping and address forms.
 */
import assert from "node:assert/strict";
import {
  canonicalAddr,
  formatInterval,
  formatIPv6,
  mergeIntervals,
  parseInterval,
  parseIPv4,
  parseIPv6,
} from "../../../lib/dataplane/nftables/addr.ts";
import {
  canonicalValue,
  elementsPerLine,
  formatDuration,
  formatElementList,
  formatPriority,
  setDatatypes,
} from "../../../lib/dataplane/nftables/nft_format.ts";
import { canonicalRule, ruleReferences, tokenize } from "../../../lib/dataplane/nftables/rule_text.ts";

// Each pair: what kube-proxy (or a test) writes, and what `nft list` printed for it on this host.
const printed: [string, string][] = [
  ["mark set mark or 0x4000", "meta mark set meta mark | 0x00004000"],
  ["mark and 0x4000 == 0 return", "meta mark & 0x00004000 == 0x00000000 return"],
  ["mark set mark xor 0x4000", "meta mark set meta mark ^ 0x00004000"],
  ["mark set mark or 16384", "meta mark set meta mark | 0x00004000"],
  ["meta mark set 0x4000", "meta mark set 0x00004000"],
  ["mark and 0x4000 != 0 accept", "meta mark & 0x00004000 != 0x00000000 accept"],
  ["masquerade fully-random", "masquerade fully-random"],
  ["ip daddr { 172.30.0.0/16 } drop", "ip daddr 172.30.0.0/16 drop"],
  ["ip6 daddr { fd00::/108 } drop", "ip6 daddr fd00::/108 drop"],
  ["ip daddr { 172.30.0.0/16, 10.96.0.0/12 } drop", "ip daddr { 10.96.0.0/12, 172.30.0.0/16 } drop"],
  ["ip saddr != { 1.2.3.0/24, 5.6.7.8 } drop", "ip saddr != { 1.2.3.0/24, 5.6.7.8 } drop"],
  ["ip6 saddr != { 2001:db8::/32, fd00::1 } drop", "ip6 saddr != { 2001:db8::/32, fd00::1 } drop"],
  ["ip daddr { 10.0.0.0/24, 10.0.1.0/24 } drop", "ip daddr { 10.0.0.0/23 } drop"],
  ["ip daddr { 10.0.0.0/8, 10.1.0.0/16 } drop", "ip daddr { 10.0.0.0/8 } drop"],
  ["ip daddr { 10.0.0.1/32, 10.0.0.3 } drop", "ip daddr { 10.0.0.1, 10.0.0.3 } drop"],
  ["ip daddr { 10.0.0.9, 10.0.0.3, 10.0.0.5 } drop", "ip daddr { 10.0.0.3, 10.0.0.5, 10.0.0.9 } drop"],
  ["ip daddr { 10.0.0.1, 10.0.0.2 } drop", "ip daddr { 10.0.0.1, 10.0.0.2 } drop"],
  ["ip daddr 10.1.2.3/8 drop", "ip daddr 10.0.0.0/8 drop"],
  ["ip saddr != 10.0.0.0/8 ip daddr 1.2.3.4/32 accept", "ip saddr != 10.0.0.0/8 ip daddr 1.2.3.4 accept"],
  ["ip daddr == 1.2.3.4 accept", "ip daddr 1.2.3.4 accept"],
  ["meta l4proto 6 accept", "meta l4proto tcp accept"],
  ["iifname eth0 accept", 'iifname "eth0" accept'],
  ['iifname "veth*" goto d', 'iifname "veth*" goto d'],
  ["tcp dport { 443, 80, 8080 } accept", "tcp dport { 80, 443, 8080 } accept"],
  ["meta l4proto { udp, tcp } accept", "meta l4proto { tcp, udp } accept"],
  ["numgen random mod 1 vmap { 0 : goto d }", "numgen random mod 1 vmap { 0 : goto d }"],
  [
    "numgen random mod 3 vmap { 0 : goto a , 1 : goto b , 2 : goto c }",
    "numgen random mod 3 vmap { 0 : goto a, 1 : goto b, 2 : goto c }",
  ],
  ["numgen random mod 2 vmap { 1 : goto a , 0 : drop }", "numgen random mod 2 vmap { 0 : drop, 1 : goto a }"],
  [
    "ip daddr . meta l4proto . th dport vmap { 1.2.3.4 . tcp . 80 : drop }",
    "ip daddr . meta l4proto . th dport vmap { 1.2.3.4 . tcp . 80 : drop }",
  ],
  ["update @affinity-X { ip saddr }", "update @affinity-X { ip saddr }"],
  ["meta l4proto tcp dnat to 10.180.0.1:80", "meta l4proto tcp dnat to 10.180.0.1:80"],
  ["meta l4proto tcp dnat to [fd00:0::5]:80", "meta l4proto tcp dnat to [fd00::5]:80"],
  ["ip6 daddr != ::1 return", "ip6 daddr != ::1 return"],
  ["fib saddr type local jump d", "fib saddr type local jump d"],
  [
    "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
    "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
  ],
  ["ct state new jump d", "ct state new jump d"],
  ["counter", "counter packets 0 bytes 0"],
  ["counter name cnt", 'counter name "cnt"'],
  ["reject", "reject"],
];

Deno.test("canonicalRule() prints kube-proxy's rule shapes as nft list does", async (t) => {
  for (const [i, [input, want]] of printed.entries()) {
    await t.step(`case ${i}: ${input}`, () => assert.equal(canonicalRule(input), want, `case ${i}`));
  }
});

Deno.test("ruleReferences() finds jump/goto targets, @sets, @maps and named counters", () => {
  const refs = ruleReferences(
    "ip saddr @affinity-X goto ep-1 numgen random mod 2 vmap { 0 : goto ep-1 , 1 : jump ep-2 }",
  );
  assert.deepEqual(refs.chains, ["ep-1", "ep-1", "ep-2"]);
  assert.deepEqual(refs.sets, [{ name: "affinity-X", map: false, dynamic: false }]);
  assert.deepEqual(ruleReferences("ip daddr . meta l4proto . th dport vmap @service-ips").sets, [
    { name: "service-ips", map: true, dynamic: false },
  ]);
  assert.deepEqual(ruleReferences("update @aff { ip saddr }").sets, [{
    name: "aff",
    map: false,
    dynamic: true,
  }]);
  assert.deepEqual(ruleReferences('counter name "c1" accept').counters, ["c1"]);
  assert.deepEqual(ruleReferences("goto a,").chains, ["a"]);
  assert.deepEqual(tokenize('iifname "a b" { 1, 2 }'), ["iifname", '"a b"', "{", "1", ",", "2", "}"]);
});

Deno.test("formatPriority() prints named priorities only where nft allows the name", () => {
  assert.equal(formatPriority("ip", "prerouting", -110), "dstnat - 10");
  assert.equal(formatPriority("ip", "output", -110), "-110");
  assert.equal(formatPriority("ip", "output", -100), "-100");
  assert.equal(formatPriority("ip", "prerouting", -100), "dstnat");
  assert.equal(formatPriority("ip", "input", 0), "filter");
  assert.equal(formatPriority("ip", "forward", -10), "filter - 10");
  assert.equal(formatPriority("ip", "postrouting", 100), "srcnat");
  assert.equal(formatPriority("ip", "postrouting", 111), "111");
  assert.equal(formatPriority("ip", "input", -310), "raw - 10");
  assert.equal(formatPriority("ip", "output", 55), "security + 5");
  assert.equal(formatPriority("bridge", "prerouting", -300), "dstnat");
});

Deno.test("formatDuration() prints as nft's time_print", () => {
  assert.equal(formatDuration(10800_000), "3h");
  assert.equal(formatDuration(60_000), "1m");
  assert.equal(formatDuration(93784_000), "1d2h3m4s");
  assert.equal(formatDuration(3599_996), "59m59s996ms");
});

Deno.test("formatElementList() wraps as nft: 2 IPv4 addresses, 5 ports, 1 concatenation per line", () => {
  assert.equal(elementsPerLine(["ipv4_addr"]), 2);
  assert.equal(elementsPerLine(["inet_service"]), 5);
  assert.equal(elementsPerLine(["ipv6_addr"]), 1);
  assert.equal(elementsPerLine(["inet_proto", "inet_service"]), 1);
  assert.equal(
    formatElementList(["172.30.0.5", "172.30.0.41", '172.30.0.100 comment "x y"'], 2),
    '{ 172.30.0.5, 172.30.0.41,\n\t\t\t     172.30.0.100 comment "x y" }',
  );
  assert.equal(
    formatElementList(["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12"], 5),
    "{ 1, 2, 3, 4, 5,\n\t\t\t     6, 7, 8, 9, 10,\n\t\t\t     11, 12 }",
  );
  assert.equal(formatElementList(["udp . 53", "tcp . 80"], 1), "{ udp . 53,\n\t\t\t     tcp . 80 }");
});

Deno.test("setDatatypes() and canonicalValue() read types and store values as nft prints them", () => {
  assert.deepEqual(setDatatypes("ipv4_addr . inet_proto . inet_service : verdict", false), {
    key: ["ipv4_addr", "inet_proto", "inet_service"],
    value: ["verdict"],
  });
  assert.deepEqual(setDatatypes("ip saddr . th dport", true), { key: ["ipv4_addr", "inet_service"] });
  assert.deepEqual(canonicalValue("ipv6_addr", "fd00:0:0::4", false), { text: "fd00::4" });
  assert.deepEqual(canonicalValue("ipv4_addr", "10.0.0.0-10.255.255.255", true), { text: "10.0.0.0/8" });
  assert.match(canonicalValue("ipv4_addr", "10.0.0.0/8", false).error!, /no interval flag/);
  assert.match(canonicalValue("ipv4_addr", "fd00::1", false).error!, /invalid ipv4_addr/);
  assert.deepEqual(canonicalValue("inet_proto", "6", false), { text: "tcp" });
  assert.match(canonicalValue("inet_service", "http", false).error!, /invalid inet_service/);
  assert.deepEqual(canonicalValue("mark", "0x4000", false), { text: "0x00004000" });
  assert.deepEqual(canonicalValue("verdict", "goto  x", false), { text: "goto x" });
  assert.match(canonicalValue("verdict", "gotox", false).error!, /invalid verdict/);
});

Deno.test("addresses parse and print as inet_pton / inet_ntop", () => {
  assert.equal(parseIPv4("01.2.3.4"), undefined);
  assert.equal(parseIPv4("1.2.3.256"), undefined);
  assert.equal(parseIPv6("1::2::3"), undefined);
  assert.equal(formatIPv6(parseIPv6("FD00:0000:0000:0000:0000:0000:0000:0001")!), "fd00::1");
  assert.equal(formatIPv6(parseIPv6("2001:db8:0:0:1:0:0:1")!), "2001:db8::1:0:0:1");
  assert.equal(formatIPv6(parseIPv6("::ffff:1.2.3.4")!), "::ffff:1.2.3.4");
  assert.equal(formatIPv6(parseIPv6("::")!), "::");
  assert.equal(formatIPv6(parseIPv6("::1")!), "::1");
  assert.equal(formatIPv6(parseIPv6("1:0:1:1:1:1:1:1")!), "1:0:1:1:1:1:1:1");
  assert.equal(canonicalAddr("fd00:10:96:0::a", 6), "fd00:10:96::a");
  assert.equal(formatInterval(parseInterval("192.168.0.0-192.168.255.255", 4)!), "192.168.0.0/16");
  assert.equal(formatInterval(parseInterval("2001:db8::1-2001:db8::ff", 6)!), "2001:db8::1-2001:db8::ff");
  assert.equal(parseInterval("10.0.0.5-10.0.0.1", 4), undefined);
  const merged = mergeIntervals([
    parseInterval("10.0.0.0/24", 4)!,
    parseInterval("10.0.3.6", 4)!,
    parseInterval("10.0.1.0/24", 4)!,
    parseInterval("10.0.3.5", 4)!,
  ]).map(formatInterval);
  assert.deepEqual(merged, ["10.0.0.0/23", "10.0.3.5-10.0.3.6"]);
});
