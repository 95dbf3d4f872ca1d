/**
 * The API server's own rules for the fields kube-proxy reads (k8s.io/apimachinery `pkg/util/validation`,
 * `pkg/api/validate/content`, and the Service / EndpointSlice validation of `pkg/apis/core` and
 * `pkg/apis/discovery`), with their messages. A real API server keeps objects that break them out, but
 * objects can come from an older or aggregated API server, or from manifests nobody validated (`render`);
 * the model checks them where objects enter it, so that nothing unchecked reaches a kernel tool's input.
 *
 * Each check returns the list of messages (empty when valid), as Go's `IsDNS1123Label` and friends do;
 * {@linkcode fieldError} formats one the way `field.Invalid(...).Error()` does.
 * @module
 */

import { ipv4Number, ipValue } from "../net/ip.ts";

const DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG =
  "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT = `${DNS1123_LABEL_FMT}(\\.${DNS1123_LABEL_FMT})*`;
const DNS1123_SUBDOMAIN_MSG =
  "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_MSG =
  "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const LABEL_VALUE_FMT = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG =
  "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

const dns1123Label = new RegExp(`^${DNS1123_LABEL_FMT}$`);
const dns1123Subdomain = new RegExp(`^${DNS1123_SUBDOMAIN_FMT}$`);
const dns1035Label = new RegExp(`^${DNS1035_LABEL_FMT}$`);
const labelValue = new RegExp(`^${LABEL_VALUE_FMT}$`);

/** Go's `MaxLenError`. */
function maxLenError(n: number): string {
  return `must be no more than ${n} characters`;
}

/** Go's `RegexError`. */
function regexError(msg: string, fmt: string, ...examples: string[]): string {
  if (examples.length === 0) return `${msg} (regex used for validation is '${fmt}')`;
  return `${msg} (e.g. ${examples.map((e) => `'${e}', `).join("or ")}regex used for validation is '${fmt}')`;
}

/** Byte length as Go's `len(string)` (UTF-8). */
function byteLength(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff) {
      n += 4;
      i++;
    } else n += 3;
  }
  return n;
}

/** `IsDNS1123Label`: namespaces, port names of Services and EndpointSlices, endpoint hostnames. */
export function isDNS1123Label(value: string): string[] {
  const errs: string[] = [];
  if (byteLength(value) > 63) errs.push(maxLenError(63));
  if (!dns1123Label.test(value)) {
    if (dns1123Subdomain.test(value)) errs.push("must not contain dots");
    else errs.push(regexError(DNS1123_LABEL_MSG, DNS1123_LABEL_FMT, "my-name", "123-abc"));
  }
  return errs;
}

/** `IsDNS1123Subdomain`: EndpointSlice names, node names. */
export function isDNS1123Subdomain(value: string): string[] {
  const errs: string[] = [];
  if (byteLength(value) > 253) errs.push(maxLenError(253));
  if (!dns1123Subdomain.test(value)) {
    errs.push(regexError(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, "example.com"));
  }
  return errs;
}

/** `IsDNS1035Label`: Service names (`ValidateServiceName`). */
export function isDNS1035Label(value: string): string[] {
  const errs: string[] = [];
  if (byteLength(value) > 63) errs.push(maxLenError(63));
  if (!dns1035Label.test(value)) {
    errs.push(regexError(DNS1035_LABEL_MSG, DNS1035_LABEL_FMT, "my-name", "abc-123"));
  }
  return errs;
}

/** `IsValidLabelValue`: zones (endpoint zone, zone hints, the Node's zone label). */
export function isLabelValue(value: string): string[] {
  const errs: string[] = [];
  if (byteLength(value) > 63) errs.push(maxLenError(63));
  if (!labelValue.test(value)) {
    errs.push(regexError(LABEL_VALUE_MSG, LABEL_VALUE_FMT, "MyValue", "my_value", "12345"));
  }
  return errs;
}

/**
 * `IsValidPortName` (IANA service name, RFC 6335, lower case only): what container ports and a Service's
 * `targetPort` names follow. Service and EndpointSlice port names themselves are DNS-1123 labels (as the API
 * validates them), which {@linkcode isDNS1123Label} checks.
 */
export function isIANAServiceName(port: string): string[] {
  const errs: string[] = [];
  if (byteLength(port) > 15) errs.push(maxLenError(15));
  if (!/^[-a-z0-9]+$/.test(port)) {
    errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
  }
  if (!/[a-z]/.test(port)) errs.push("must contain at least one letter (a-z)");
  if (port.includes("--")) errs.push("must not contain consecutive hyphens");
  if (port.length > 0 && (port[0] === "-" || port[port.length - 1] === "-")) {
    errs.push("must not begin or end with a hyphen");
  }
  return errs;
}

/** The protocols a Service or EndpointSlice port may carry. */
export const SUPPORTED_PROTOCOLS: readonly string[] = ["SCTP", "TCP", "UDP"];

/** Go's `%q` of a string, short enough for a log line or an Event note (long values are cut). */
export function quoteValue(value: unknown): string {
  const s = typeof value === "string" ? value : String(value);
  const cut = s.length > 80 ? `${s.slice(0, 80)}...` : s;
  return JSON.stringify(cut);
}

/** `field.Invalid(path, value, detail).Error()`: `spec.ports[0].name: Invalid value: "x": detail`. */
export function fieldError(path: string, value: unknown, details: readonly string[]): string {
  return `${path}: Invalid value: ${quoteValue(value)}: ${details.join(", ")}`;
}

/** `field.NotSupported(path, value, supported).Error()`. */
export function notSupportedError(path: string, value: unknown, supported: readonly string[]): string {
  return `${path}: Unsupported value: ${quoteValue(value)}: supported values: ${
    supported.map((s) => JSON.stringify(s)).join(", ")
  }`;
}

/** {@linkcode endpointIPErrors} for an IPv4 address given as its number (no allocation when it is valid). */
export function endpointIPv4Errors(raw: string, v: number): readonly string[] {
  const a = v >>> 24, b = (v >>> 16) & 255, c = (v >>> 8) & 255;
  if (v !== 0 && a !== 127 && !(a === 169 && b === 254) && !(a === 224 && b === 0 && c === 0)) {
    return NO_ERRORS;
  }
  const errs: string[] = [];
  if (v === 0) errs.push(`may not be unspecified (${raw})`);
  if (a === 127) errs.push("may not be in the loopback range (127.0.0.0/8, ::1/128)");
  if (a === 169 && b === 254) errs.push("may not be in the link-local range (169.254.0.0/16, fe80::/10)");
  if (a === 224 && b === 0 && c === 0) {
    errs.push("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)");
  }
  return errs;
}

const NO_ERRORS: readonly string[] = Object.freeze([]);

/**
 * `ValidateEndpointIP` (after the family check): an endpoint may not be unspecified, loopback, link-local
 * unicast or link-local multicast. `ip` is a parsed address of `family`.
 */
export function endpointIPErrors(raw: string, ip: string, family: "IPv4" | "IPv6"): readonly string[] {
  if (family === "IPv4") {
    const v = ipv4Number(ip);
    return v === null ? ["must be a valid IP address"] : endpointIPv4Errors(raw, v);
  }
  const v = ipValue(ip);
  if (!v) return ["must be a valid IP address"];
  const errs: string[] = [];
  const top = Number(v.value >> 112n);
  if (v.value === 0n) errs.push(`may not be unspecified (${raw})`);
  if (v.value === 1n) errs.push("may not be in the loopback range (127.0.0.0/8, ::1/128)");
  if ((top & 0xffc0) === 0xfe80) errs.push("may not be in the link-local range (169.254.0.0/16, fe80::/10)");
  if ((top & 0xff0f) === 0xff02) {
    errs.push("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)");
  }
  return errs;
}
