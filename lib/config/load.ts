/**
 * Reading and writing KubeProxyConfiguration files (YAML or JSON), as upstream's `loadConfig` and
 * `writeConfigFile` do.
 *
 * Decoding is strict first: unknown and duplicate fields are collected into one "strict decoding error", which is
 * logged as a warning (upstream logs "Using lenient decoding as strict decoding failed"); decoding then continues
 * leniently (unknown fields ignored, the last duplicate wins). Type errors, a wrong `apiVersion` or `kind`, and YAML
 * syntax errors are fatal (`ConfigLoadError`). The decoded object is defaulted with upstream's v1alpha1 defaults.
 * @module
 */

import { isMap, isScalar, isSeq, parseDocument, stringify } from "yaml";
import type { Node as YamlNode } from "yaml";
import { log } from "../log.ts";
import { applyDefaults, zeroConfiguration } from "./defaults.ts";
import { formatDuration, parseDuration } from "./duration.ts";
import { API_VERSION, KIND, type KubeProxyConfiguration } from "./types.ts";

/** A configuration file could not be decoded (exit 1 upstream, "failed to decode: ..."). */
export class ConfigLoadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConfigLoadError";
  }
}

/** The outcome of decoding: the defaulted configuration plus the strict-decoding complaints, if any. */
export interface DecodeResult {
  config: KubeProxyConfiguration;
  /** e.g. `unknown field "iptables.foo"`, `duplicate field "mode"`; empty when strict decoding succeeded. */
  strictErrors: string[];
}

type Leaf =
  | "string"
  | "bool"
  | "boolPtr"
  | "int32"
  | "int32Ptr"
  | "float32"
  | "duration"
  | "durationPtr"
  | "timeOrDuration"
  | "stringList"
  | "boolMap"
  | "vmodule"
  | "quantity";
interface Schema {
  [field: string]: Leaf | Schema;
}

const FORMAT_OPTIONS: Schema = { splitStream: "bool", infoBufferSize: "quantity" };

/** Known fields of v1alpha1 and their types; the Go struct names are used in type-error messages. */
const SCHEMA: Schema = {
  apiVersion: "string",
  kind: "string",
  featureGates: "boolMap",
  clientConnection: {
    kubeconfig: "string",
    acceptContentTypes: "string",
    contentType: "string",
    qps: "float32",
    burst: "int32",
  },
  logging: {
    format: "string",
    flushFrequency: "timeOrDuration",
    verbosity: "int32",
    vmodule: "vmodule",
    options: { text: FORMAT_OPTIONS, json: FORMAT_OPTIONS },
  },
  hostnameOverride: "string",
  bindAddress: "string",
  healthzBindAddress: "string",
  metricsBindAddress: "string",
  bindAddressHardFail: "bool",
  enableProfiling: "bool",
  showHiddenMetricsForVersion: "string",
  mode: "string",
  iptables: {
    masqueradeBit: "int32Ptr",
    masqueradeAll: "bool",
    localhostNodePorts: "boolPtr",
    syncPeriod: "duration",
    minSyncPeriod: "duration",
  },
  ipvs: {
    syncPeriod: "duration",
    minSyncPeriod: "duration",
    scheduler: "string",
    excludeCIDRs: "stringList",
    strictARP: "bool",
    tcpTimeout: "duration",
    tcpFinTimeout: "duration",
    udpTimeout: "duration",
  },
  nftables: {
    masqueradeBit: "int32Ptr",
    masqueradeAll: "bool",
    syncPeriod: "duration",
    minSyncPeriod: "duration",
  },
  winkernel: {
    networkName: "string",
    sourceVip: "string",
    enableDSR: "bool",
    rootHnsEndpointName: "string",
    forwardHealthCheckVip: "bool",
  },
  detectLocalMode: "string",
  detectLocal: { bridgeInterface: "string", interfaceNamePrefix: "string" },
  clusterCIDR: "string",
  nodePortAddresses: "stringList",
  oomScoreAdj: "int32Ptr",
  conntrack: {
    maxPerCore: "int32Ptr",
    min: "int32Ptr",
    tcpEstablishedTimeout: "durationPtr",
    tcpCloseWaitTimeout: "durationPtr",
    tcpBeLiberal: "bool",
    udpTimeout: "duration",
    udpStreamTimeout: "duration",
  },
  configSyncPeriod: "duration",
  portRange: "string",
  windowsRunAsService: "bool",
};

const GO_TYPES: Record<Leaf, string> = {
  string: "string",
  bool: "bool",
  boolPtr: "bool",
  int32: "int32",
  int32Ptr: "int32",
  float32: "float32",
  duration: "string",
  durationPtr: "string",
  timeOrDuration: "string",
  stringList: "[]string",
  boolMap: "map[string]bool",
  vmodule: "v1.VModuleConfiguration",
  quantity: "resource.Quantity",
};

function jsonType(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "object") return "object";
  return typeof v; // string, number, boolean
}

function typeError(v: unknown, path: string, leaf: Leaf): ConfigLoadError {
  const t = jsonType(v);
  const what = t === "number" ? `number ${String(v)}` : t;
  return new ConfigLoadError(
    `json: cannot unmarshal ${what} into Go struct field KubeProxyConfiguration.${path} of type ${
      GO_TYPES[leaf]
    }`,
  );
}

function convertLeaf(v: unknown, path: string, leaf: Leaf): unknown {
  const fail = () => typeError(v, path, leaf);
  switch (leaf) {
    case "string":
      if (v === null) return "";
      if (typeof v !== "string") throw fail();
      return v;
    case "bool":
      if (v === null) return false;
      if (typeof v !== "boolean") throw fail();
      return v;
    case "boolPtr":
      if (v === null) return true; // nil pointer: defaulted to true (only localhostNodePorts uses it)
      if (typeof v !== "boolean") throw fail();
      return v;
    case "int32":
    case "int32Ptr":
      if (v === null) return leaf === "int32" ? 0 : NaN;
      if (typeof v !== "number" || !Number.isInteger(v) || v > 2147483647 || v < -2147483648) throw fail();
      return v;
    case "float32":
      if (v === null) return 0;
      if (typeof v !== "number") throw fail();
      return v;
    case "duration":
    case "durationPtr":
    case "timeOrDuration":
      if (v === null) return leaf === "durationPtr" ? NaN : 0;
      if (leaf === "timeOrDuration" && typeof v === "number" && Number.isInteger(v)) return v / 1e6; // nanoseconds
      if (typeof v !== "string") {
        throw new ConfigLoadError(`json: cannot unmarshal ${jsonType(v)} into Go value of type string`);
      }
      try {
        return parseDuration(v);
      } catch (e) {
        throw new ConfigLoadError((e as Error).message);
      }
    case "stringList":
      if (v === null) return [];
      if (!Array.isArray(v)) throw fail();
      return v.map((x, i) => convertLeaf(x, `${path}[${i}]`, "string"));
    case "boolMap": {
      if (v === null) return {};
      if (typeof v !== "object" || Array.isArray(v)) throw fail();
      const out: Record<string, boolean> = {};
      for (const [k, b] of Object.entries(v as Record<string, unknown>)) {
        out[k] = convertLeaf(b, `${path}.${k}`, "bool") as boolean;
      }
      return out;
    }
    case "vmodule":
      if (v === null) return [];
      if (!Array.isArray(v)) throw fail();
      return v.map((item, i) => {
        if (typeof item !== "object" || item === null || Array.isArray(item)) {
          throw typeError(item, `${path}[${i}]`, leaf);
        }
        const o = item as Record<string, unknown>;
        return {
          filePattern: convertLeaf(o.filePattern ?? null, `${path}[${i}].filePattern`, "string"),
          verbosity: convertLeaf(o.verbosity ?? null, `${path}[${i}].verbosity`, "int32"),
        };
      });
    case "quantity":
      if (v === null) return "0";
      if (typeof v === "number") return String(v);
      if (typeof v !== "string") throw fail();
      return v;
  }
}

function decodeInto(
  src: Record<string, unknown>,
  schema: Schema,
  target: Record<string, unknown>,
  prefix: string,
  unknown: string[],
): void {
  for (const [key, v] of Object.entries(src)) {
    const path = prefix ? `${prefix}.${key}` : key;
    if (!Object.hasOwn(schema, key)) {
      unknown.push(`unknown field ${JSON.stringify(path)}`);
      continue;
    }
    const s = schema[key];
    if (typeof s === "string") {
      target[key] = convertLeaf(v, path, s);
      continue;
    }
    if (v === null) continue;
    if (typeof v !== "object" || Array.isArray(v)) {
      throw new ConfigLoadError(
        `json: cannot unmarshal ${
          jsonType(v)
        } into Go struct field KubeProxyConfiguration.${path} of type struct`,
      );
    }
    decodeInto(v as Record<string, unknown>, s, target[key] as Record<string, unknown>, path, unknown);
  }
}

function findDuplicates(node: YamlNode | null | undefined, prefix: string, out: string[]): void {
  if (isMap(node)) {
    const seen = new Set<string>();
    for (const pair of node.items) {
      const key = isScalar(pair.key) ? String(pair.key.value) : String(pair.key);
      const path = prefix ? `${prefix}.${key}` : key;
      if (seen.has(key)) out.push(`duplicate field ${JSON.stringify(path)}`);
      seen.add(key);
      findDuplicates(pair.value as YamlNode, path, out);
    }
  } else if (isSeq(node)) {
    node.items.forEach((item, i) => findDuplicates(item as YamlNode, `${prefix}[${i}]`, out));
  }
}

const SCHEME = "pkg/proxy/apis/config/scheme/scheme.go:28";

/**
 * Decodes a YAML or JSON KubeProxyConfiguration and applies defaults. Throws ConfigLoadError on fatal problems.
 * Strict-decoding complaints are returned (not logged); `loadConfigFile` logs them.
 */
export function decodeConfiguration(text: string): DecodeResult {
  const doc = parseDocument(text, { uniqueKeys: false });
  if (doc.errors.length > 0) {
    throw new ConfigLoadError(`failed to decode: yaml: ${doc.errors[0].message.split("\n")[0]}`);
  }
  const raw = doc.toJS();
  const shown = text.length > 200 ? text.slice(0, 200) + "..." : text;
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new ConfigLoadError(`failed to decode: Object 'Kind' is missing in '${shown}'`);
  }
  const obj = raw as Record<string, unknown>;
  if (obj.kind === undefined || obj.kind === "") {
    throw new ConfigLoadError(`failed to decode: Object 'Kind' is missing in '${shown}'`);
  }
  if (obj.apiVersion === undefined || obj.apiVersion === "") {
    throw new ConfigLoadError(`failed to decode: Object 'apiVersion' is missing in '${shown}'`);
  }
  if (obj.kind !== KIND || obj.apiVersion !== API_VERSION) {
    throw new ConfigLoadError(
      `failed to decode: no kind ${JSON.stringify(String(obj.kind))} is registered for version ${
        JSON.stringify(String(obj.apiVersion))
      } in scheme ${JSON.stringify(SCHEME)}`,
    );
  }
  const strictErrors: string[] = [];
  findDuplicates(doc.contents as YamlNode, "", strictErrors);
  const config = zeroConfiguration();
  try {
    decodeInto(obj, SCHEMA, config as unknown as Record<string, unknown>, "", strictErrors);
  } catch (e) {
    if (e instanceof ConfigLoadError && !e.message.startsWith("failed to decode")) {
      throw new ConfigLoadError(`failed to decode: ${e.message}`);
    }
    throw e;
  }
  config.apiVersion = API_VERSION;
  config.kind = KIND;
  return { config: applyDefaults(config), strictErrors };
}

/** The one-line strict decoding error, as upstream prints it. */
export function strictDecodingMessage(strictErrors: string[]): string {
  return `strict decoding error: ${strictErrors.join(", ")}`;
}

/**
 * Reads and decodes `path`. Unknown or duplicate fields are logged as a warning naming them, and decoding continues.
 * Throws ConfigLoadError (or the Deno read error) on failure.
 */
export async function loadConfigFile(path: string): Promise<KubeProxyConfiguration> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) {
      throw new ConfigLoadError(`open ${path}: no such file or directory`);
    }
    if (e instanceof Deno.errors.PermissionDenied) {
      throw new ConfigLoadError(`open ${path}: permission denied`);
    }
    throw e;
  }
  const { config, strictErrors } = decodeConfiguration(text);
  if (strictErrors.length > 0) {
    log.warn("Using lenient decoding as strict decoding failed", {
      err: strictDecodingMessage(strictErrors),
    });
  }
  return config;
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v !== null && typeof v === "object") {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) out[k] = sortKeys((v as Record<string, unknown>)[k]);
    return out;
  }
  return v;
}

const nullIfEmpty = (a: string[]): string[] | null => a.length === 0 ? null : [...a];

/** The configuration as the plain JSON object upstream's encoder produces (durations as Go text). */
export function toVersionedObject(c: KubeProxyConfiguration): Record<string, unknown> {
  const d = formatDuration;
  const fmtOpts = (o: { splitStream?: boolean; infoBufferSize: string }) =>
    o.splitStream
      ? { splitStream: true, infoBufferSize: o.infoBufferSize }
      : { infoBufferSize: o.infoBufferSize };
  const obj: Record<string, unknown> = {
    apiVersion: c.apiVersion,
    kind: c.kind,
    clientConnection: { ...c.clientConnection },
    logging: {
      format: c.logging.format,
      flushFrequency: d(c.logging.flushFrequency),
      verbosity: c.logging.verbosity,
      options: { text: fmtOpts(c.logging.options.text), json: fmtOpts(c.logging.options.json) },
      ...(c.logging.vmodule.length > 0 ? { vmodule: c.logging.vmodule.map((x) => ({ ...x })) } : {}),
    },
    hostnameOverride: c.hostnameOverride,
    bindAddress: c.bindAddress,
    healthzBindAddress: c.healthzBindAddress,
    metricsBindAddress: c.metricsBindAddress,
    bindAddressHardFail: c.bindAddressHardFail,
    enableProfiling: c.enableProfiling,
    showHiddenMetricsForVersion: c.showHiddenMetricsForVersion,
    mode: c.mode,
    iptables: {
      ...c.iptables,
      syncPeriod: d(c.iptables.syncPeriod),
      minSyncPeriod: d(c.iptables.minSyncPeriod),
    },
    ipvs: {
      ...c.ipvs,
      excludeCIDRs: nullIfEmpty(c.ipvs.excludeCIDRs),
      syncPeriod: d(c.ipvs.syncPeriod),
      minSyncPeriod: d(c.ipvs.minSyncPeriod),
      tcpTimeout: d(c.ipvs.tcpTimeout),
      tcpFinTimeout: d(c.ipvs.tcpFinTimeout),
      udpTimeout: d(c.ipvs.udpTimeout),
    },
    nftables: {
      ...c.nftables,
      syncPeriod: d(c.nftables.syncPeriod),
      minSyncPeriod: d(c.nftables.minSyncPeriod),
    },
    winkernel: { ...c.winkernel },
    detectLocalMode: c.detectLocalMode,
    detectLocal: { ...c.detectLocal },
    clusterCIDR: c.clusterCIDR,
    nodePortAddresses: nullIfEmpty(c.nodePortAddresses),
    oomScoreAdj: c.oomScoreAdj,
    conntrack: {
      ...c.conntrack,
      tcpEstablishedTimeout: d(c.conntrack.tcpEstablishedTimeout),
      tcpCloseWaitTimeout: d(c.conntrack.tcpCloseWaitTimeout),
      udpTimeout: d(c.conntrack.udpTimeout),
      udpStreamTimeout: d(c.conntrack.udpStreamTimeout),
    },
    configSyncPeriod: d(c.configSyncPeriod),
    portRange: c.portRange,
  };
  if (Object.keys(c.featureGates).length > 0) obj.featureGates = { ...c.featureGates };
  if (c.windowsRunAsService) obj.windowsRunAsService = true;
  return sortKeys(obj) as Record<string, unknown>;
}

/** Encodes the configuration as YAML with sorted keys, in the layout of upstream's encoder. */
export function encodeConfiguration(c: KubeProxyConfiguration): string {
  return stringify(toVersionedObject(c), { indentSeq: false, lineWidth: 0, version: "1.1" });
}

/** Writes the configuration to `path` as YAML (upstream's `--write-config-to`). */
export async function writeConfigFile(path: string, c: KubeProxyConfiguration): Promise<void> {
  await Deno.writeTextFile(path, encodeConfiguration(c));
}

/**
 * The configuration `/configz` serves (upstream v1.37, #136044): the public v1alpha1 object with apiVersion and
 * kind, after upstream's platformApplyDefaults (mode `iptables` when unset, `primary` NodePort addresses in
 * nftables mode when unset, detectLocalMode `ClusterCIDR` when unset).
 */
export function configzObject(c: KubeProxyConfiguration): Record<string, unknown> {
  const d: KubeProxyConfiguration = structuredClone(c);
  if (d.mode === "") d.mode = "iptables";
  if (d.mode === "nftables" && d.nodePortAddresses.length === 0) d.nodePortAddresses = ["primary"];
  if (d.detectLocalMode === "") d.detectLocalMode = "ClusterCIDR";
  // Upstream's internal config holds one sync period pair and one masqueradeAll; converted back to v1alpha1
  // they land in the running mode's block only (the others read 0s and false).
  for (const m of ["iptables", "ipvs", "nftables"] as const) {
    if (m === d.mode || (m === "iptables" && d.mode !== "ipvs" && d.mode !== "nftables")) continue;
    d[m].syncPeriod = 0;
    d[m].minSyncPeriod = 0;
  }
  if (d.mode === "nftables") d.iptables.masqueradeAll = false;
  else d.nftables.masqueradeAll = false;
  return toVersionedObject(d);
}
