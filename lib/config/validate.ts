/**
 * Upstream's KubeProxyConfiguration validation (`pkg/proxy/apis/config/validation`), returning every error with
 * its field path. Paths are the v1alpha1 JSON paths (`iptables.masqueradeBit`, `nodePortAddresses[1]`), as in
 * upstream's `TestValidateV1Alpha1FieldPaths`; messages are apimachinery's `field.Error` wording:
 * `iptables.masqueradeBit: Invalid value: 40: must be within the range [0, 31]`.
 * @module
 */

import { formatDuration } from "./duration.ts";
import { isIP, isIPv4, isIPv6, splitHostPort } from "../net/ip.ts";
import type { KubeProxyConfiguration } from "./types.ts";
import { previousMinorVersion } from "./version.ts";

/** apimachinery field.ErrorType strings. */
export type FieldErrorType =
  | "Invalid value"
  | "Unsupported value"
  | "Required value"
  | "Forbidden"
  | "Duplicate value";

/** One validation error (field.Error). */
export class FieldError {
  constructor(
    readonly type: FieldErrorType,
    /** JSON field path, e.g. `iptables.masqueradeBit`. */
    readonly field: string,
    /** The bad value already rendered as upstream prints it (strings quoted, numbers and durations bare). */
    readonly value: string | undefined,
    readonly detail: string,
  ) {}

  /** `field: Type: value: detail`, as field.Error.Error(). */
  toString(): string {
    let body: string = this.type;
    if (this.value !== undefined) body += `: ${this.value}`;
    if (this.detail) body += `: ${this.detail}`;
    return `${this.field}: ${body}`;
  }
}

/** Renders a bad value as field.Error does. */
function q(s: string): string {
  return JSON.stringify(s);
}
function goSlice(a: string[]): string {
  return `[]string{${a.map(q).join(", ")}}`;
}

/** The `nodePortAddresses` keywords of v1.37 (`primary`, `localhost`, `all`). */
export const NODE_PORT_ADDRESS_KEYWORDS: readonly string[] = ["primary", "localhost", "all"];

const invalid = (field: string, value: string, detail: string) =>
  new FieldError("Invalid value", field, value, detail);

/** utilerrors.NewAggregate(errs).Error(): one message, or `[a, b]` (duplicates removed). */
export function aggregateMessage(errs: FieldError[]): string {
  const msgs = [...new Set(errs.map((e) => e.toString()))];
  return msgs.length === 1 ? msgs[0] : `[${msgs.join(", ")}]`;
}

/** net.ParseCIDR-compatible check (IPv4 or IPv6 address, `/`, prefix length in range, no leading zeros). */
export function isCIDR(s: string): boolean {
  const slash = s.indexOf("/");
  if (slash < 0) return false;
  const ip = s.slice(0, slash);
  const bits = s.slice(slash + 1);
  if (!/^(0|[1-9][0-9]{0,2})$/.test(bits)) return false;
  if (isIPv4(ip)) return Number(bits) <= 32;
  if (isIPv6(ip)) return Number(bits) <= 128;
  return false;
}

function isIPv6CIDR(s: string): boolean {
  return isCIDR(s) && isIPv6(s.slice(0, s.indexOf("/")));
}

function validateHostPort(input: string, field: string): FieldError[] {
  let host: string, port: string;
  try {
    [host, port] = splitHostPort(input);
  } catch {
    return [invalid(field, q(input), "must be IP:port")];
  }
  const errs: FieldError[] = [];
  if (!isIP(host)) errs.push(invalid(field, q(host), "must be a valid IP"));
  if (!/^[+-]?[0-9]+$/.test(port) || Number(port) < 1 || Number(port) > 65535) {
    errs.push(invalid(field, q(port), "must be a valid port"));
  }
  return errs;
}

const LINUX_MODES = ["iptables", "ipvs", "nftables"];
const LOCAL_MODES = ["ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""];
const LOG_FORMATS = ["json", "text"];

/** Validates a defaulted configuration; returns every error (empty when valid). */
export function validateConfiguration(c: KubeProxyConfiguration): FieldError[] {
  const errs: FieldError[] = [];
  const d = formatDuration;
  const nonNegDuration = (field: string, v: number) => {
    if (v < 0) errs.push(invalid(field, d(v), "must be greater than or equal to 0"));
  };
  const masqBit = (field: string, v: number) => {
    if (v < 0 || v > 31) errs.push(invalid(field, String(v), "must be within the range [0, 31]"));
  };

  // featureGates: values are checked at decode time; unknown names only warn (see feature_gates.ts).

  masqBit("iptables.masqueradeBit", c.iptables.masqueradeBit);
  if (c.mode === "ipvs") {
    nonNegDuration("ipvs.tcpTimeout", c.ipvs.tcpTimeout);
    nonNegDuration("ipvs.tcpFinTimeout", c.ipvs.tcpFinTimeout);
    nonNegDuration("ipvs.udpTimeout", c.ipvs.udpTimeout);
    c.ipvs.excludeCIDRs.forEach((cidr, i) => {
      if (!isCIDR(cidr)) errs.push(invalid(`ipvs.excludeCIDRs[${i}]`, q(cidr), "must be a valid CIDR"));
    });
  } else if (c.mode === "nftables") {
    masqBit("nftables.masqueradeBit", c.nftables.masqueradeBit);
  }

  // Linux: conntrack and oomScoreAdj.
  if (c.conntrack.maxPerCore < 0) {
    errs.push(
      invalid("conntrack.maxPerCore", String(c.conntrack.maxPerCore), "must be greater than or equal to 0"),
    );
  }
  if (c.conntrack.min < 0) {
    errs.push(invalid("conntrack.min", String(c.conntrack.min), "must be greater than or equal to 0"));
  }
  nonNegDuration("conntrack.tcpEstablishedTimeout", c.conntrack.tcpEstablishedTimeout);
  nonNegDuration("conntrack.tcpCloseWaitTimeout", c.conntrack.tcpCloseWaitTimeout);
  nonNegDuration("conntrack.udpTimeout", c.conntrack.udpTimeout);
  nonNegDuration("conntrack.udpStreamTimeout", c.conntrack.udpStreamTimeout);
  if (c.oomScoreAdj < -1000 || c.oomScoreAdj > 1000) {
    errs.push(invalid("oomScoreAdj", String(c.oomScoreAdj), "must be within the range [-1000, 1000]"));
  }

  if (c.mode !== "" && !LINUX_MODES.includes(c.mode)) {
    errs.push(invalid(
      "mode",
      q(c.mode),
      `must be ${
        LINUX_MODES.join(", ")
      } or blank (blank means the best-available proxy [currently iptables])`,
    ));
  }

  if (c.clientConnection.burst < 0) {
    errs.push(
      invalid(
        "clientConnection.burst",
        String(c.clientConnection.burst),
        "must be greater than or equal to 0",
      ),
    );
  }
  // Not checked upstream; a negative QPS would silently disable client-side rate limiting.
  if (c.clientConnection.qps < 0) {
    errs.push(
      invalid("clientConnection.qps", String(c.clientConnection.qps), "must be greater than or equal to 0"),
    );
  }

  if (c.configSyncPeriod <= 0) {
    errs.push(invalid("configSyncPeriod", d(c.configSyncPeriod), "must be greater than 0"));
  }

  const prefix = c.mode === "ipvs" ? "ipvs" : c.mode === "nftables" ? "nftables" : "iptables";
  const block = c[prefix];
  if (block.syncPeriod <= 0) {
    errs.push(invalid(`${prefix}.syncPeriod`, d(block.syncPeriod), "must be greater than 0"));
  }
  if (block.minSyncPeriod < 0) {
    errs.push(
      invalid(`${prefix}.minSyncPeriod`, d(block.minSyncPeriod), "must be greater than or equal to 0"),
    );
  }
  if (block.minSyncPeriod > block.syncPeriod) {
    errs.push(invalid(
      `${prefix}.syncPeriod`,
      d(block.minSyncPeriod),
      `must be greater than or equal to ${prefix}.minSyncPeriod`,
    ));
  }

  for (const addr of c.bindAddress.split(",")) {
    if (!isIP(addr)) {
      errs.push(
        invalid("bindAddress", q(c.bindAddress), "not a valid textual representation of an IP address"),
      );
      break;
    }
  }
  if (c.healthzBindAddress !== "") errs.push(...validateHostPort(c.healthzBindAddress, "healthzBindAddress"));
  if (c.metricsBindAddress !== "") errs.push(...validateHostPort(c.metricsBindAddress, "metricsBindAddress"));

  // v1.37 (#138427): the keywords combine with each other and with CIDRs, each at most once.
  const seenKeywords = new Set<string>();
  for (let i = 0; i < c.nodePortAddresses.length; i++) {
    const a = c.nodePortAddresses[i];
    if (NODE_PORT_ADDRESS_KEYWORDS.includes(a)) {
      if (seenKeywords.has(a)) {
        errs.push(new FieldError("Duplicate value", `nodePortAddresses[${i}]`, q(a), ""));
      }
      seenKeywords.add(a);
      continue;
    }
    if (!isCIDR(a)) {
      errs.push(
        invalid(
          `nodePortAddresses[${i}]`,
          q(a),
          "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'",
        ),
      );
    }
  }

  const hidden = c.showHiddenMetricsForVersion;
  if (hidden !== "" && hidden !== previousMinorVersion()) {
    errs.push(invalid(
      "showHiddenMetricsForVersion",
      q(hidden),
      `--show-hidden-metrics-for-version must be omitted or have the value '${previousMinorVersion()}'. ` +
        "Only the previous minor version is allowed",
    ));
  }

  if (!LOCAL_MODES.includes(c.detectLocalMode)) {
    errs.push(
      new FieldError(
        "Unsupported value",
        "detectLocalMode",
        q(c.detectLocalMode),
        `supported values: ${LOCAL_MODES.map(q).join(", ")}`,
      ),
    );
  }
  switch (c.detectLocalMode === "" ? "ClusterCIDR" : c.detectLocalMode) {
    case "BridgeInterface":
      if (c.detectLocal.bridgeInterface === "") {
        errs.push(invalid("detectLocal.bridgeInterface", q(""), "must not be empty"));
      }
      break;
    case "InterfaceNamePrefix":
      if (c.detectLocal.interfaceNamePrefix === "") {
        errs.push(invalid("detectLocal.interfaceNamePrefix", q(""), "must not be empty"));
      }
      break;
    case "ClusterCIDR":
      if (c.clusterCIDR !== "") errs.push(...validateClusterCIDR(c.clusterCIDR));
      break;
  }

  errs.push(...validateLogging(c));
  return errs;
}

function validateClusterCIDR(value: string): FieldError[] {
  const cidrs = value.split(",");
  const pairMsg =
    "must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]";
  if (cidrs.length > 2) return [invalid("clusterCIDR", goSlice(cidrs), pairMsg)];
  const errs: FieldError[] = [];
  for (const cidr of cidrs) {
    if (!isCIDR(cidr)) {
      errs.push(
        invalid(
          "clusterCIDR",
          q(cidr),
          "must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)",
        ),
      );
    }
  }
  if (errs.length === 0 && cidrs.length === 2 && isIPv6CIDR(cidrs[0]) === isIPv6CIDR(cidrs[1])) {
    errs.push(invalid("clusterCIDR", goSlice(cidrs), pairMsg));
  }
  return errs;
}

function validateLogging(c: KubeProxyConfiguration): FieldError[] {
  const errs: FieldError[] = [];
  const l = c.logging;
  if (!LOG_FORMATS.includes(l.format)) {
    errs.push(invalid("logging.format", q(l.format), "Unsupported log format"));
  }
  if (l.verbosity < 0) {
    errs.push(invalid("logging.verbosity", String(l.verbosity), "must be greater than or equal to 0"));
  }
  if (l.vmodule.length > 0 && l.format !== "" && l.format !== "text") {
    errs.push(
      new FieldError("Forbidden", "logging.vmodule", undefined, "Only supported for text log format"),
    );
  }
  l.vmodule.forEach((item, i) => {
    if (item.filePattern === "") {
      errs.push(
        new FieldError(
          "Required value",
          `logging.vmodule[${i}]`,
          undefined,
          "File pattern must not be empty",
        ),
      );
    }
    if (/[=,]/.test(item.filePattern)) {
      errs.push(
        invalid(
          `logging.vmodule[${i}]`,
          q(item.filePattern),
          "File pattern must not contain equal sign or comma",
        ),
      );
    }
  });
  return errs;
}
