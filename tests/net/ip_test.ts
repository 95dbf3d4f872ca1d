/** lib/net/ip.ts: the one IP/CIDR module of the agent (validation, ranges, host:port). */
import assert from "node:assert/strict";
import { cidrContains, ipValue, isIP, isIPv4, isIPv6, isLoopback, splitHostPort } from "../../lib/net/ip.ts";
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
