/**
 * The iptables dataplane's options and the render settings derived from them: the first sync's setup
 * (nodePortAddresses, route_localnet for localhost NodePorts, conntrack's liberal mode, the masquerade mark)
 * and the nfacct counters ensured on every full sync.
 * @module
 */

import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import { ensureSysctl, readSysctl } from "../../sysctl.ts";
import type { IPFamily } from "../../proxy/types.ts";
import type { NodePortAddresses } from "../../net/node_addresses.ts";
import type { IptablesBackend, IptablesTools } from "../iptables_backend.ts";
import { type LocalTrafficDetector, noOpLocalDetector } from "./local_detector.ts";
import { CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED, type NfacctCounters } from "./nfacct.ts";
import { masqueradeMark, type RenderConfig } from "./rules.ts";

/** Options of {@linkcode IptablesDataplane}. */
export interface IptablesDataplaneOptions {
  family: IPFamily;
  /** Spawns iptables-restore, iptables-save, sysctl and ip. */
  runner: CommandRunner;
  /** Default 14 (mark 0x00004000). */
  masqueradeBit?: number;
  /** Masquerade all ClusterIP traffic. Default false. */
  masqueradeAll?: boolean;
  /** Default: no-op (no off-cluster masquerade, no pod short-circuit rule). */
  localDetector?: LocalTrafficDetector;
  /** CIDRs and/or `primary`; empty (default) accepts NodePorts on every local address. */
  nodePortAddresses?: readonly string[];
  /** `iptables.localhostNodePorts`, default true (IPv4 only; sets route_localnet). */
  localhostNodePorts?: boolean;
  /** Default 30 000. Reserved for periodic leftover scans in large clusters. */
  syncPeriodMs?: number;
  /** Backend or explicit tool names; default `system` (plain `iptables-restore`). */
  backend?: IptablesBackend | IptablesTools;
  /** Append `--random-fully` to MASQUERADE (iptables ≥ 1.6.2). Default true. */
  randomFully?: boolean;
  /** Skip reading `net.netfilter.nf_conntrack_tcp_be_liberal` and use this value. */
  conntrackTCPBeLiberal?: boolean;
  /** Node IPs to use instead of `ip -j addr show` when nodePortAddresses do not match all (tests). */
  nodeAddresses?: readonly string[];
  /**
   * This family's node IP as upstream's detectNodeIPs picks it: a non-wildcard bindAddress of this family wins
   * over the Node object's IPs. Used for the loadBalancerSourceRanges self-allow (`-s <lbIP>` in KUBE-FW when a
   * source range contains the node IP). When unset (or of the other family), `snapshot.node.ips[0]` is used.
   */
  nodeIP?: string;
  /** Bytes per chunk streamed to iptables-restore's stdin (default 256 KiB). */
  chunkBytes?: number;
  logger?: Logger;
  /**
   * The node's nfacct counters (default: through the `nfacct` program with `runner`); null to write rules
   * without counters, as upstream does where nfacct is unavailable.
   */
  nfacct?: NfacctCounters | null;
}

/** What the first-sync setup reads besides the options. */
export interface SetupContext {
  family: IPFamily;
  runner: CommandRunner;
  log: Logger;
}

/** The settings the first sync sets up. */
export interface InitialSettings {
  /** `nf_conntrack_tcp_be_liberal` is set (the option, else read from the kernel). */
  conntrackLiberal: boolean;
  /** Render settings, without nfacct counters yet. */
  cfg: RenderConfig;
}

/**
 * First-sync setup: sysctls and settings that need the node's facts (`npa` the family's nodePortAddresses,
 * `nodeIP` its node IP for the source-range self-allow).
 */
export async function initialSettings(
  o: IptablesDataplaneOptions,
  ctx: SetupContext,
  npa: NodePortAddresses,
  nodeIP: string | null,
): Promise<InitialSettings> {
  const { family, runner, log } = ctx;
  const localhostNodePorts = (o.localhostNodePorts ?? true) && family === "IPv4" && npa.containsIPv4Loopback;
  if (localhostNodePorts) {
    // Upstream logs and goes on: localhost NodePorts then do not work, everything else does.
    await ensureSysctl(runner, "net.ipv4.conf.all.route_localnet", 1, log);
  }
  let conntrackLiberal: boolean;
  if (o.conntrackTCPBeLiberal !== undefined) {
    conntrackLiberal = o.conntrackTCPBeLiberal;
  } else {
    conntrackLiberal = (await readSysctl(runner, "net.netfilter.nf_conntrack_tcp_be_liberal")) === "1";
    if (conntrackLiberal) {
      log.info("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets");
    }
  }
  const cfg: RenderConfig = {
    family,
    mark: masqueradeMark(o.masqueradeBit ?? 14),
    masqueradeAll: o.masqueradeAll ?? false,
    localDetector: o.localDetector ?? noOpLocalDetector,
    localhostNodePorts,
    nodeIP,
    nfacctInvalidDrop: false,
    nfacctLocalhostNodePorts: false,
  };
  return { conntrackLiberal, cfg };
}

/**
 * Ensures the nfacct counters, as upstream does on every full sync; returns the settings with what is usable
 * now (the same object when nothing changed).
 */
export async function ensureCounters(
  nfacct: NfacctCounters | null,
  conntrackLiberal: boolean,
  cfg: RenderConfig,
): Promise<RenderConfig> {
  const invalid = nfacct !== null && !conntrackLiberal &&
    await nfacct.ensure(CT_STATE_INVALID_DROPPED);
  const localhost = nfacct !== null && cfg.localhostNodePorts &&
    await nfacct.ensure(LOCALHOST_NODEPORTS_ACCEPTED);
  if (invalid === cfg.nfacctInvalidDrop && localhost === cfg.nfacctLocalhostNodePorts) return cfg;
  return { ...cfg, nfacctInvalidDrop: invalid, nfacctLocalhostNodePorts: localhost };
}
