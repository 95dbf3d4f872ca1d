/**
 * Names in the nftables mode's `kube-proxy` table, exactly as upstream v1.37 (`pkg/proxy/nftables/proxier.go`):
 * the fixed chains, sets and maps, and the per-service / per-endpoint chains and affinity sets, named
 * `<prefix><HASH>-<namespace>/<service>/<protocol>/<port>[__<ip>/<port>]` where HASH is the first 8 base32
 * characters of the SHA-256 of the rest. A `/` never appears in a fixed name, which is how generated chains
 * are told apart.
 * @module
 */
import { base32Sha256 } from "../name_hash.ts";
import type { ServicePortName } from "../../proxy/types.ts";

/** The table, in family `ip` or `ip6`. */
export const TABLE = "kube-proxy";
/** The table's comment. */
export const TABLE_COMMENT = "rules for kube-proxy";

/** Fixed chains. */
export const CHAIN = {
  filterPreroutingPreDNAT: "filter-prerouting-pre-dnat",
  filterOutputPreDNAT: "filter-output-pre-dnat",
  filterInput: "filter-input",
  filterForward: "filter-forward",
  filterOutput: "filter-output",
  natPrerouting: "nat-prerouting",
  natOutput: "nat-output",
  natPostrouting: "nat-postrouting",
  services: "services",
  serviceEndpointsCheck: "service-endpoints-check",
  nodePortEndpointsCheck: "nodeport-endpoints-check",
  reject: "reject-chain",
  clusterIPsCheck: "cluster-ips-check",
  firewallCheck: "firewall-check",
  masquerading: "masquerading",
} as const;

/** Fixed sets and maps. */
export const SET = {
  clusterIPs: "cluster-ips",
  nodePortIPs: "nodeport-ips",
  serviceIPs: "service-ips",
  serviceNodePorts: "service-nodeports",
  noEndpointServices: "no-endpoint-services",
  noEndpointNodePorts: "no-endpoint-nodeports",
  firewallIPs: "firewall-ips",
  /** `ep . ep . proto . port` of the endpoints on this node (hairpin traffic is masqueraded). */
  hairpinConnections: "hairpin-connections",
  /** `proto . nodePort : goto localhost-nodeport-reject-<proto>` (KubeProxyNFTablesLocalhostNodePorts). */
  localhostNodePortRejects: "localhost-nodeport-reject-ports",
} as const;

/** Protocols whose localhost NodePort traffic may be rejected and counted (upstream's rejectable ones). */
export const LOCALHOST_NODEPORT_PROTOCOLS = ["TCP", "UDP", "SCTP"] as const;

/** The per-protocol chain counting and rejecting localhost NodePort traffic. */
export function localhostNodePortRejectChain(protocol: string): string {
  return `localhost-nodeport-reject-${protocol.toLowerCase()}`;
}

/** The named counter of rejected localhost NodePort packets of a protocol. */
export function localhostNodePortRejectedCounter(protocol: string): string {
  return `localhost-nodeport-rejected-${protocol.toLowerCase()}`;
}

/** Longest name nft accepts (knftables `NameLengthMax`). */
const NAME_LENGTH_MAX = 256;
/** Room for the longest prefix (`external-`, `affinity-`, ...) including its hyphen. */
const PREFIX_LENGTH_MAX = 16;
const BASE_LENGTH_MAX = NAME_LENGTH_MAX - PREFIX_LENGTH_MAX;

/** `HASH-name`, truncated to the longest base a name may have (never reached by valid Kubernetes names). */
function hashAndTruncate(name: string): string {
  const out = `${base32Sha256(name, 8)}-${name}`;
  return out.length > BASE_LENGTH_MAX ? out.slice(0, BASE_LENGTH_MAX - 3) + "..." : out;
}

/** The chains of one service port. */
export interface ServicePortChainNames {
  /** Cluster-policy chain `service-…`. */
  readonly cluster: string;
  /** Local-policy chain `local-…`. */
  readonly local: string;
  /** External-destination chain `external-…`. */
  readonly external: string;
  /** loadBalancerSourceRanges chain `firewall-…`. */
  readonly firewall: string;
  /** `namespace/name/protocol/port`, the base of the port's endpoint names. */
  readonly base: string;
}

/** The chain names of a service port (`protocol` lower case). */
export function servicePortChainNames(spn: ServicePortName, protocol: string): ServicePortChainNames {
  const base = `${spn.namespace}/${spn.name}/${protocol}/${spn.port}`;
  const h = hashAndTruncate(base);
  return {
    cluster: `service-${h}`,
    local: `local-${h}`,
    external: `external-${h}`,
    firewall: `firewall-${h}`,
    base,
  };
}

/** An endpoint's chain and affinity set. */
export interface EndpointNames {
  readonly chain: string;
  readonly affinitySet: string;
}

/** The names of one endpoint (`ip`, `port`) of a service port (`portBase` from servicePortChainNames). */
export function endpointNames(portBase: string, ip: string, port: number): EndpointNames {
  // IPv6 colons are not allowed in chain names.
  const h = hashAndTruncate(`${portBase}__${ip.replaceAll(":", ".")}/${port}`);
  return { chain: `endpoint-${h}`, affinitySet: `affinity-${h}` };
}

/** True for a generated (per-service or per-endpoint) chain: upstream's `isServiceChainName`. */
export function isServiceChainName(name: string): boolean {
  return name.includes("/");
}

/** True for a per-endpoint affinity set. */
export function isAffinitySetName(name: string): boolean {
  return name.startsWith("affinity-");
}
