/** lib/net/ip.ts: the one IP/CIDR module of the agent (validation, ranges, host:port). */
import assert from "node:assert/strict";
import fc from "fast-check";
import {
  cidrContains,
  ipv4Number,
  ipValue,
  isIP,
  isIPv4,
  isIPv6,
  isLoopback,
  parseIP,
  splitHostPort,
} from "../../lib/net/ip.ts";
import { familyNodeIP } from "../../lib/net/node_addresses.ts";

Deno.test("isIPv4/isIPv6/isIP accept Go's sloppy forms; an IPv4-mapped address is IPv4", () => {
  assert.ok(isIPv4("010.0.0.1"));
  assert.ok(isIPv6("fd00::1") && isIPv6("::") && isIPv6("1:2:3:4:5:6:7:8"));
  assert.ok(isIPv4("::ffff:1.2.3.4") && !isIPv6("::ffff:1.2.3.4"));
  for (const bad of ["1.2.3", "1.2.3.256", "fd00::1::2", "fe80::1%eth0", "", "1:2:3:4:5:6:7:8:9"]) {
    assert.ok(!isIP(bad), bad);
  }
});

Deno.test("cidrContains() matches within the prefix and only within the family", () => {
  assert.ok(cidrContains("10.0.0.0/8", "10.255.1.2"));
  assert.ok(!cidrContains("10.0.0.0/8", "11.0.0.1"));
  assert.ok(cidrContains("0.0.0.0/0", "203.0.113.9"));
  assert.ok(cidrContains("fd00::/64", "fd00::abcd"));
  assert.ok(!cidrContains("fd00::/64", "fd00:0:0:1::1"));
  assert.ok(!cidrContains("::/0", "10.0.0.1"), "no cross-family match");
  assert.ok(cidrContains("192.168.0.2", "192.168.0.2"), "a bare address is a /32");
  assert.ok(!cidrContains("10.0.0.0/33", "10.0.0.1"));
});

Deno.test("isLoopback() and ipValue()", () => {
  assert.ok(isLoopback("127.0.0.1") && isLoopback("127.9.9.9") && isLoopback("::1"));
  assert.ok(!isLoopback("128.0.0.1") && !isLoopback("::2"));
  assert.deepEqual(ipValue("fe80::1%eth0"), { family: "IPv6", value: (0xfe80n << 112n) | 1n });
  assert.deepEqual(ipValue("1.2.3.4"), { family: "IPv4", value: 0x01020304n });
});

Deno.test("splitHostPort() is Go's net.SplitHostPort, messages included", () => {
  assert.deepEqual(splitHostPort("0.0.0.0:10256"), ["0.0.0.0", "10256"]);
  assert.deepEqual(splitHostPort("[::1]:80"), ["::1", "80"]);
  assert.deepEqual(splitHostPort(":80"), ["", "80"]);
  assert.throws(() => splitHostPort("1.2.3.4"), /address 1.2.3.4: missing port in address/);
  assert.throws(() => splitHostPort("::1:80"), /too many colons in address/);
  assert.throws(() => splitHostPort("[::1]80"), /missing port in address/);
});

Deno.test("familyNodeIP(): a specific bindAddress of the family wins, a wildcard does not", () => {
  assert.equal(familyNodeIP("IPv4", "192.168.9.9", ["10.0.0.1"]), "192.168.9.9");
  assert.equal(familyNodeIP("IPv4", "0.0.0.0", ["10.0.0.1"]), "10.0.0.1");
  assert.equal(familyNodeIP("IPv6", "192.168.9.9", ["10.0.0.1", "fd00::1"]), "fd00::1");
  assert.equal(familyNodeIP("IPv6", "::", ["10.0.0.1"]), null);
});

/** Go's sloppy dotted quad, spelled out: four dot-separated runs of 1-3 digits, each at most 255. */
function referenceIPv4(s: string): string | null {
  const parts = s.split(".");
  if (parts.length !== 4 || !parts.every((p) => /^[0-9]{1,3}$/.test(p) && Number(p) <= 255)) return null;
  return parts.map(Number).join(".");
}

Deno.test("parseIP() on dotted-quad text agrees with the spelled-out rule (canonical text without leading zeros)", () => {
  const quadish = fc.stringMatching(/^[0-9.]{0,17}$/);
  const octet = fc.oneof(
    fc.integer({ min: 0, max: 300 }).map(String),
    fc.stringMatching(/^0{1,2}[0-9]{1,2}$/),
  );
  const quad = fc.tuple(octet, octet, octet, octet).map((o) => o.join("."));
  fc.assert(
    fc.property(fc.oneof(quadish, quad), (s) => {
      const want = referenceIPv4(s);
      const got = parseIP(s);
      assert.deepEqual(got, want === null ? null : { ip: want, family: "IPv4" }, s);
      assert.equal(ipv4Number(s), want === null ? null : Number(ipValue(want)!.value), s);
    }),
    { seed: 20261206, numRuns: 5000 },
  );
});
