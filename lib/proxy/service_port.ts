/**
 * Builds {@linkcode ServicePortInfo} values from a Service, one IP family at a time, with upstream's
 * rules (`pkg/proxy/serviceport.go`, `servicechangetracker.go`, `pkg/api/v1/service/util.go`).
 *
 * Malformed input never throws: an unusable field is dropped (upstream "Skipping invalid IP/CIDR"), an
 * unusable port is skipped, an unusable cluster IP skips the Service for that family. Each such case is
 * logged and reported through the `onInvalid` callback (which main.ts turns into an Event).
 * @module
 */
import type { Service, ServicePort } from "../kube/types.ts";
import { log } from "../log.ts";
import { parseCIDR, parseIP } from "../net/ip.ts";
import { flatString } from "../flat_string.ts";
import { type IPFamily, type Protocol, type ServicePortInfo, servicePortNameString } from "./types.ts";
import { fieldError, isDNS1035Label, isDNS1123Label } from "../kube/validation.ts";

/**
 * Reports a Service whose spec could not be fully used; `reason` is a human-readable sentence, `field` the
 * path of the offending field (`spec.clusterIPs[0]`, `spec.ports[1].nodePort`, ...) when there is one.
 */
export type InvalidServiceCallback = (service: Service, reason: string, field?: string) => void;

/** Default ClientIP affinity timeout (the API default, `v1.DefaultClientIPServiceAffinitySeconds`). */
export const DEFAULT_STICKY_MAX_AGE_SECONDS = 10800;

const PROTOCOLS: ReadonlySet<string> = new Set(["TCP", "UDP", "SCTP"]);

/** The empty list every port without externalIPs, VIPs or source ranges shares. */
const NONE: readonly string[] = Object.freeze([]);

/** `namespace/name` of an object. */
export function objectKey(obj: { metadata?: { namespace?: string; name?: string } }): string {
  return `${obj.metadata?.namespace ?? ""}/${obj.metadata?.name ?? ""}`;
}

/** Upstream `ShouldSkipService`: headless (clusterIP None or empty) and ExternalName services are ignored. */
export function shouldSkipService(svc: Service): boolean {
  const spec = svc.spec ?? {};
  if (spec.clusterIP === "None" || spec.clusterIP === "" || spec.clusterIP === undefined) {
    log.v(3).info("Skipping service due to cluster IP", {
      service: objectKey(svc),
      clusterIP: spec.clusterIP,
    });
    return true;
  }
  if (spec.type === "ExternalName") {
    log.v(3).info("Skipping service due to Type=ExternalName", { service: objectKey(svc) });
    return true;
  }
  return false;
}

/**
 * Upstream `GetClusterIPByFamily`: the entry of `spec.clusterIPs` (or `spec.clusterIP` when that list is
 * empty) whose family matches; "" when there is none.
 */
export function clusterIPForFamily(svc: Service, family: IPFamily): string {
  const spec = svc.spec ?? {};
  const ips = spec.clusterIPs && spec.clusterIPs.length > 0 ? spec.clusterIPs : [spec.clusterIP ?? ""];
  for (const ip of ips) {
    if (!ip || ip === "None") continue;
    // The family of the parsed address, not a guess from the text; an unparsable entry is returned for the
    // family it claims to be, so that the caller reports it instead of silently dropping the Service.
    const parsed = parseIP(ip);
    const fam = parsed ? parsed.family : (String(ip).includes(":") ? "IPv6" : "IPv4");
    if (fam === family) return ip;
  }
  return "";
}

/** Upstream `apiservice.ExternallyAccessible`: NodePort, LoadBalancer, or ClusterIP with externalIPs. */
export function serviceExternallyAccessible(svc: Service): boolean {
  const spec = svc.spec ?? {};
  const type = spec.type ?? "ClusterIP";
  return type === "LoadBalancer" || type === "NodePort" ||
    (type === "ClusterIP" && (spec.externalIPs?.length ?? 0) > 0);
}

/** Upstream `apiservice.ExternalPolicyLocal`: eTP Local on an externally accessible service. */
export function serviceExternalPolicyLocal(svc: Service): boolean {
  return serviceExternallyAccessible(svc) && svc.spec?.externalTrafficPolicy === "Local";
}

/** Upstream `apiservice.InternalPolicyLocal`. */
export function serviceInternalPolicyLocal(svc: Service): boolean {
  return svc.spec?.internalTrafficPolicy === "Local";
}

/** Upstream `apiservice.NeedsHealthCheck`: LoadBalancer with external policy Local. */
export function serviceNeedsHealthCheck(svc: Service): boolean {
  return svc.spec?.type === "LoadBalancer" && serviceExternalPolicyLocal(svc);
}

function validPort(n: unknown, allowZero: boolean): n is number {
  return typeof n === "number" && Number.isInteger(n) && n >= (allowZero ? 0 : 1) && n <= 65535;
}

/**
 * The ports of `svc` usable in `family`, keyed by `servicePortNameString`; null when the Service is
 * skipped in this family (headless, ExternalName, no cluster IP of this family, unparsable cluster IP).
 */
export function buildServicePorts(
  svc: Service,
  family: IPFamily,
  onInvalid?: InvalidServiceCallback,
): Map<string, ServicePortInfo> | null {
  if (shouldSkipService(svc)) return null;
  const namespace = svc.metadata?.namespace ?? "";
  const name = svc.metadata?.name ?? "";
  // Kept for as long as the Service exists (and doubles as an unnamed port's name).
  const serviceKey = flatString(`${namespace}/${name}`);
  const invalid = (reason: string, kv: Record<string, unknown> = {}, field?: string) => {
    log.error(reason, undefined, { service: serviceKey, ipFamily: family, ...kv });
    try {
      onInvalid?.(svc, reason, field);
    } catch (err) {
      log.error("Invalid-service callback failed", err, { service: serviceKey });
    }
  };
  if (!name || !namespace) {
    invalid("Service has no name or namespace", {}, name ? "metadata.namespace" : "metadata.name");
    return null;
  }
  // The API's rules for the identity that ends up in chain names, comments and set elements.
  const nsErrs = isDNS1123Label(namespace);
  if (nsErrs.length > 0) {
    invalid(
      `Skipping invalid Service: ${fieldError("metadata.namespace", namespace, nsErrs)}`,
      {},
      "metadata.namespace",
    );
    return null;
  }
  const nameErrs = isDNS1035Label(name);
  if (nameErrs.length > 0) {
    invalid(`Skipping invalid Service: ${fieldError("metadata.name", name, nameErrs)}`, {}, "metadata.name");
    return null;
  }
  const rawClusterIP = clusterIPForFamily(svc, family);
  if (rawClusterIP === "") return null; // wrong family: not an error
  const clusterIP = parseIP(rawClusterIP);
  if (!clusterIP || clusterIP.family !== family) {
    const listed = svc.spec?.clusterIPs ?? [];
    const at = listed.indexOf(rawClusterIP);
    invalid(
      "Service has an invalid cluster IP; skipping it",
      { clusterIP: rawClusterIP },
      at >= 0 ? `spec.clusterIPs[${at}]` : "spec.clusterIP",
    );
    return null;
  }
  const spec = svc.spec ?? {};

  const externalIPs: string[] = [];
  for (const [i, raw] of (spec.externalIPs ?? []).entries()) {
    const ip = parseIP(raw);
    if (!ip) {
      if (String(raw ?? "").trim() !== "") {
        invalid("Skipping invalid IP", { ip: raw }, `spec.externalIPs[${i}]`);
      }
      continue;
    }
    if (ip.family === family) externalIPs.push(ip.ip);
  }

  const sourceRanges: string[] = [];
  for (const [i, raw] of (spec.loadBalancerSourceRanges ?? []).entries()) {
    // Validation mistakenly allows whitespace padding, so trim first (as upstream).
    const trimmed = String(raw ?? "").trim();
    const cidr = parseCIDR(trimmed);
    if (!cidr) {
      if (trimmed !== "") {
        invalid("Skipping invalid CIDR", { cidr: raw }, `spec.loadBalancerSourceRanges[${i}]`);
      }
      continue;
    }
    if (cidr.family === family) sourceRanges.push(cidr.cidr);
  }

  const lbVIPs: string[] = [];
  for (const [i, ing] of (svc.status?.loadBalancer?.ingress ?? []).entries()) {
    if (!ing?.ip) continue;
    if (ing.ipMode !== undefined && ing.ipMode !== null && ing.ipMode !== "VIP") continue;
    const ip = parseIP(ing.ip);
    if (!ip) {
      invalid("Skipping invalid IP", { ip: ing.ip }, `status.loadBalancer.ingress[${i}].ip`);
      continue;
    }
    if (ip.family === family) lbVIPs.push(ip.ip);
  }

  let stickyMaxAgeSeconds = 0;
  if (spec.sessionAffinity === "ClientIP") {
    const t = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds;
    if (t !== undefined && t !== null && !(Number.isInteger(t) && t > 0 && t <= 86400)) {
      // The API's rule (ValidateClientIPAffinityConfig); the value reaches rule text (`--seconds`, `timeout`).
      const path = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
      invalid(
        `Skipping invalid Service: ${fieldError(path, t, ["must be greater than 0 and less than 86400"])}`,
        {},
        path,
      );
      return null;
    }
    stickyMaxAgeSeconds = typeof t === "number" ? t : DEFAULT_STICKY_MAX_AGE_SECONDS;
  }

  let healthCheckNodePort = 0;
  if (serviceNeedsHealthCheck(svc)) {
    const p = spec.healthCheckNodePort;
    if (!p) log.error("Service has no healthcheck nodeport", undefined, { service: serviceKey });
    else if (!validPort(p, false)) {
      invalid("Service has an invalid healthCheckNodePort", { port: p }, "spec.healthCheckNodePort");
    } else healthCheckNodePort = p;
  }

  const externalPolicyLocal = serviceExternalPolicyLocal(svc);
  const internalPolicyLocal = serviceInternalPolicyLocal(svc);
  const out = new Map<string, ServicePortInfo>();
  for (const [i, sp] of ((spec.ports ?? []) as (ServicePort | null)[]).entries()) {
    if (!sp) continue;
    if (sp.name !== undefined && sp.name !== null && sp.name !== "") {
      const errs = typeof sp.name === "string" ? isDNS1123Label(sp.name) : ["must be a string"];
      if (errs.length > 0) {
        invalid(
          `Skipping invalid Service port: ${fieldError(`spec.ports[${i}].name`, sp.name, errs)}`,
          {},
          `spec.ports[${i}].name`,
        );
        continue;
      }
    }
    const protocol = (sp.protocol ?? "TCP") as Protocol;
    if (!PROTOCOLS.has(protocol)) {
      invalid(
        "Service port has an unknown protocol; skipping the port",
        { port: sp.name, protocol },
        `spec.ports[${i}].protocol`,
      );
      continue;
    }
    if (!validPort(sp.port, false)) {
      invalid("Service port has an invalid port number; skipping the port", {
        port: sp.name,
        number: sp.port,
      }, `spec.ports[${i}].port`);
      continue;
    }
    let nodePort = 0;
    if (sp.nodePort !== undefined && sp.nodePort !== null) {
      if (validPort(sp.nodePort, true)) nodePort = sp.nodePort;
      else {invalid("Service port has an invalid nodePort; ignoring it", {
          port: sp.name,
          nodePort: sp.nodePort,
        }, `spec.ports[${i}].nodePort`);}
    }
    const spn = { namespace, name, port: sp.name ?? "", protocol };
    const nameString = spn.port === "" ? serviceKey : flatString(servicePortNameString(spn));
    out.set(nameString, {
      name: spn,
      nameString,
      serviceKey,
      clusterIP: clusterIP.ip,
      port: sp.port,
      protocol,
      nodePort,
      externalIPs: externalIPs.length === 0 ? NONE : externalIPs,
      loadBalancerVIPs: lbVIPs.length === 0 ? NONE : lbVIPs,
      loadBalancerSourceRanges: sourceRanges.length === 0 ? NONE : sourceRanges,
      stickyMaxAgeSeconds,
      externalPolicyLocal,
      internalPolicyLocal,
      healthCheckNodePort,
    });
  }
  return out;
}

/** Field-wise equality of two ServicePortInfo values (upstream compares with `reflect.DeepEqual`). */
export function servicePortInfoEqual(a: ServicePortInfo, b: ServicePortInfo): boolean {
  return a.nameString === b.nameString && a.clusterIP === b.clusterIP && a.port === b.port &&
    a.protocol === b.protocol && a.nodePort === b.nodePort && arrEq(a.externalIPs, b.externalIPs) &&
    arrEq(a.loadBalancerVIPs, b.loadBalancerVIPs) &&
    arrEq(a.loadBalancerSourceRanges, b.loadBalancerSourceRanges) &&
    a.stickyMaxAgeSeconds === b.stickyMaxAgeSeconds && a.externalPolicyLocal === b.externalPolicyLocal &&
    a.internalPolicyLocal === b.internalPolicyLocal && a.healthCheckNodePort === b.healthCheckNodePort;
}

/** Equality of two port maps as built by {@linkcode buildServicePorts} (null = skipped). */
export function servicePortMapsEqual(
  a: ReadonlyMap<string, ServicePortInfo> | null,
  b: ReadonlyMap<string, ServicePortInfo> | null,
): boolean {
  // A skipped Service and one without ports render the same (nothing), so they compare equal.
  if (a === null || b === null) return (a?.size ?? 0) === 0 && (b?.size ?? 0) === 0;
  if (a.size !== b.size) return false;
  for (const [k, v] of a) {
    const w = b.get(k);
    if (!w || !servicePortInfoEqual(v, w)) return false;
  }
  return true;
}

function arrEq(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
