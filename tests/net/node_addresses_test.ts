/** `nodePortAddresses` parsing per family, with v1.37's keywords (upstream `Test_expandNodePortAddressKeywords`). */
import assert from "node:assert/strict";
import { newNodePortAddresses } from "../../lib/net/node_addresses.ts";

const NODE_IPS = ["192.168.1.1", "fd00::1"];

Deno.test("nodePortAddresses: 'localhost' is 127.0.0.0/8 and ::1/128, and allows IPv4 localhost NodePorts", () => {
  const v4 = newNodePortAddresses("IPv4", ["localhost"], NODE_IPS);
  assert.deepEqual(v4.cidrs, ["127.0.0.0/8"]);
  assert.equal(v4.matchAll, false);
  assert.equal(v4.containsIPv4Loopback, true);
  assert.deepEqual(newNodePortAddresses("IPv6", ["localhost"], NODE_IPS).cidrs, ["::1/128"]);
});

Deno.test("nodePortAddresses: 'all' is the zero CIDR of each family and matches every address", () => {
  for (const [family, zero] of [["IPv4", "0.0.0.0/0"], ["IPv6", "::/0"]] as const) {
    const npa = newNodePortAddresses(family, ["10.0.0.0/8", "fd00:1::/64", "all"], NODE_IPS);
    assert.deepEqual(npa.cidrs, [zero]);
    assert.equal(npa.matchAll, true);
  }
});

Deno.test("nodePortAddresses: 'primary' combines with CIDRs and keywords, in the order given", () => {
  assert.deepEqual(
    newNodePortAddresses("IPv4", ["10.0.0.0/8", "primary", "localhost"], NODE_IPS).cidrs,
    ["10.0.0.0/8", "192.168.1.1/32", "127.0.0.0/8"],
  );
  assert.deepEqual(
    newNodePortAddresses("IPv6", ["primary", "fd00:2::/64", "10.0.0.0/8"], NODE_IPS).cidrs,
    ["fd00::1/128", "fd00:2::/64"],
  );
  // A family whose node IP is loopback has nothing to pin to: no CIDR of that family, so every address.
  const v6 = newNodePortAddresses("IPv6", ["primary"], ["192.168.1.1", "::1"]);
  assert.deepEqual(v6.cidrs, ["::/0"]);
  assert.equal(v6.matchAll, true);
});
