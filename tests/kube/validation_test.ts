/** The API's field rules as the model applies them (messages as k8s.io/apimachinery's). */
import assert from "node:assert/strict";
import {
  endpointIPErrors,
  fieldError,
  isDNS1035Label,
  isDNS1123Label,
  isDNS1123Subdomain,
  isIANAServiceName,
  isLabelValue,
} from "../../lib/kube/validation.ts";

Deno.test("isDNS1123Label() accepts the API's labels and refuses the rest with apimachinery's messages", () => {
  for (const ok of ["a", "0", "my-name", "123-abc", "a".repeat(63)]) {
    assert.deepEqual(isDNS1123Label(ok), [], ok);
  }
  assert.deepEqual(isDNS1123Label("a".repeat(64)), ["must be no more than 63 characters"]);
  assert.deepEqual(isDNS1123Label("a.b"), ["must not contain dots"]);
  // Go's RegexError: "(e.g. 'x', or 'y', regex used for validation is '...')".
  assert.deepEqual(isDNS1123Label("A"), [
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end " +
    "with an alphanumeric character (e.g. 'my-name', or '123-abc', regex used for validation is " +
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
  ]);
  for (const bad of ["", "-a", "a-", "a b", 'a"b', "a\nb", "a;b", "é"]) {
    assert.notDeepEqual(isDNS1123Label(bad), [], bad);
  }
});

Deno.test("isDNS1035Label() (Service names) refuses a leading digit; isDNS1123Subdomain() takes dots up to 253", () => {
  assert.deepEqual(isDNS1035Label("svc-1"), []);
  assert.notDeepEqual(isDNS1035Label("1svc"), []);
  assert.deepEqual(isDNS1123Subdomain("a.b-c.d"), []);
  assert.deepEqual(
    isDNS1123Subdomain(`${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(61)}`),
    [],
  );
  assert.ok(isDNS1123Subdomain("a".repeat(254)).includes("must be no more than 253 characters"));
  assert.notDeepEqual(isDNS1123Subdomain("a..b"), []);
});

Deno.test("isLabelValue() (zones) allows upper case, '_' and '.', and the empty string", () => {
  for (const ok of ["", "Zone_A.1", "us-east-1a"]) assert.deepEqual(isLabelValue(ok), [], ok);
  for (const bad of ["-a", "a b", "a/b", "x".repeat(64)]) assert.notDeepEqual(isLabelValue(bad), [], bad);
});

Deno.test("isIANAServiceName() follows IsValidPortName", () => {
  assert.deepEqual(isIANAServiceName("http"), []);
  assert.deepEqual(isIANAServiceName("123"), ["must contain at least one letter (a-z)"]);
  assert.deepEqual(isIANAServiceName("a--b"), ["must not contain consecutive hyphens"]);
  assert.deepEqual(isIANAServiceName("a".repeat(16)), ["must be no more than 15 characters"]);
});

Deno.test("endpointIPErrors() refuses unspecified, loopback and link-local endpoints as ValidateEndpointIP", () => {
  assert.deepEqual(endpointIPErrors("10.0.0.1", "10.0.0.1", "IPv4"), []);
  assert.deepEqual(endpointIPErrors("0.0.0.0", "0.0.0.0", "IPv4"), ["may not be unspecified (0.0.0.0)"]);
  assert.deepEqual(endpointIPErrors("127.0.0.5", "127.0.0.5", "IPv4"), [
    "may not be in the loopback range (127.0.0.0/8, ::1/128)",
  ]);
  assert.equal(endpointIPErrors("169.254.1.1", "169.254.1.1", "IPv4").length, 1);
  assert.equal(endpointIPErrors("224.0.0.9", "224.0.0.9", "IPv4").length, 1);
  assert.equal(endpointIPErrors("::1", "::1", "IPv6").length, 1);
  assert.equal(endpointIPErrors("fe80::1", "fe80::1", "IPv6").length, 1);
  assert.equal(endpointIPErrors("ff02::1", "ff02::1", "IPv6").length, 1);
  assert.deepEqual(endpointIPErrors("fd00::1", "fd00::1", "IPv6"), []);
});

Deno.test("fieldError() formats as field.Invalid().Error(), quoting control characters", () => {
  assert.equal(fieldError("metadata.name", 'a"\n', ["x"]), 'metadata.name: Invalid value: "a\\"\\n": x');
});
