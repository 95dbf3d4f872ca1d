/**
 * The options of the nftables dataplane ({@linkcode NftablesDataplane}): the family, how nft and `ip` are run,
 * the masquerade and local-traffic settings, the NodePort addresses, and test hooks.
 * @module
 */
import type { CommandRunner } from "../../exec.ts";
import type { Logger } from "../../log.ts";
import type { IPFamily } from "../../proxy/types.ts";
import type { LocalTraffic } from "../local_traffic.ts";
import type { Nftables } from "./interface.ts";

/** Options of {@linkcode NftablesDataplane}. */
export interface NftablesDataplaneOptions {
  family: IPFamily;
  /** Runs `ip` for CIDR nodePortAddresses, and `nft` unless `nftables` is given. */
  runner: CommandRunner;
  /** The table's nftables access (default: `nft` through `runner`; tests pass a FakeNftables). */
  nftables?: Nftables;
  /** Default 14. */
  masqueradeBit?: number;
  masqueradeAll?: boolean;
  /** How local pod traffic is recognized; default none. */
  localTraffic?: LocalTraffic;
  /** CIDRs and/or `primary`; the agent passes `["primary"]` when unset, as upstream's nftables mode. */
  nodePortAddresses?: readonly string[];
  /** A specific bindAddress overrides the Node's IP of its family (source-range self-allow). */
  nodeIP?: string;
  /** Node addresses to use instead of `ip -j addr show` (tests). */
  nodeAddresses?: readonly string[];
  logger?: Logger;
  /** Keep the last transaction's text in `lastTransaction` (tests, render). Default false. */
  keepLastTransaction?: boolean;
  /** Wall clock in ms for the stale-chain delay (tests). */
  now?: () => number;
  /**
   * The KubeProxyNFTablesLocalhostNodePorts gate (alpha, default off): localhost NodePort traffic is rejected and
   * counted per protocol; when nodePortAddresses names loopback explicitly, TCP NodePorts are served by a
   * userspace listener on the family's loopback address instead (UDP and SCTP still rejected), as upstream.
   */
  localhostNodePorts?: boolean;
  /**
   * Full syncs write the chains and affinity sets of ports that the kernel does not have yet (no chain or set of
   * theirs listed) ahead of the sync's transaction, this many ports per `nft -f` run; those objects are
   * unreferenced until the sync's transaction adds the map elements that lead to them, so what traffic sees
   * still changes at once. Fewer such ports than this go in the sync's transaction. 0 turns it off.
   * Why: the kernel walks the whole transaction for every anonymous set (numgen map) it binds, so one
   * transaction of 10k Services costs that squared (half the commit time at 10k × 10). @default 1000
   */
  precreatePorts?: number;
}
