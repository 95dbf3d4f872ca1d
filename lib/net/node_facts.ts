/**
 * The one owner of what a dataplane knows of its node, per IP family. Every mode asks it instead of deriving
 * the facts itself:
 * - the node IP (upstream's detectNodeIPs: a specific `bindAddress` of the family wins over the Node's IPs),
 *   following the Node's IPs as snapshots bring them;
 * - `nodePortAddresses` parsed for the family once, with the Node's IPs of the first snapshot (the `primary`
 *   keyword), as upstream parses them once at start;
 * - the node's addresses accepting NodePorts: the local addresses (`ip -j addr show`, or the addresses given
 *   for tests and `render`) inside those CIDRs, read when a mode asks (none are read when they match all).
 * @module
 */
import type { CommandRunner } from "../exec.ts";
import type { Logger } from "../log.ts";
import { cidrContains, type IPFamily } from "./ip.ts";
import { familyNodeIP, newNodePortAddresses, type NodePortAddresses, nodePortIPs } from "./node_addresses.ts";

/** Where a family's node facts come from (a dataplane's options). */
export interface NodeFactsSource {
  readonly family: IPFamily;
  /** `bindAddress`: a specific address of the family is the node IP. */
  readonly bindAddress?: string;
  /** `nodePortAddresses` as configured (both families; keywords allowed). */
  readonly nodePortAddresses?: readonly string[];
  /** The node's local addresses, instead of reading them with `ip` (tests, `render`). */
  readonly localAddresses?: readonly string[];
  readonly runner: CommandRunner;
  readonly logger: Logger;
}

/** One family's node facts (see the module doc). */
export class NodeFacts {
  readonly family: IPFamily;
  readonly #src: NodeFactsSource;
  #nodeIPs: readonly string[] = [];
  #npa: NodePortAddresses | null = null;

  constructor(src: NodeFactsSource) {
    this.family = src.family;
    this.#src = src;
  }

  /** Takes the Node's IPs of this family (primary first) from a snapshot; the first call fixes `primary`. */
  observe(nodeIPs: readonly string[]): void {
    this.#nodeIPs = nodeIPs;
    if (this.#npa === null) {
      this.#npa = newNodePortAddresses(this.family, this.#src.nodePortAddresses ?? [], nodeIPs);
    }
  }

  /** Whether a snapshot was observed (before that `nodePortAddresses` is not known). */
  get observed(): boolean {
    return this.#npa !== null;
  }

  /** The family's node IP: a specific bindAddress of the family, else the Node's first IP of it, else null. */
  get nodeIP(): string | null {
    return familyNodeIP(this.family, this.#src.bindAddress, this.#nodeIPs);
  }

  /**
   * The parsed `nodePortAddresses` of the family.
   * @throws {Error} Before the first {@linkcode observe}.
   */
  get nodePortAddresses(): NodePortAddresses {
    if (this.#npa === null) throw new Error("node facts: nodePortAddresses before the first snapshot");
    return this.#npa;
  }

  /**
   * The node's addresses accepting NodePorts, read now (upstream's GetNodeIPs): none when `nodePortAddresses`
   * matches every address; a failed read is logged and gives none.
   */
  nodePortIPs(): Promise<string[]> {
    return nodePortIPs(this.nodePortAddresses, this.#src.runner, this.#src.logger, this.#src.localAddresses);
  }

  /**
   * Of the given local addresses, in their order, those accepting NodePorts (all of them when
   * nodePortAddresses match all).
   */
  nodePortIPsAmong(addrs: readonly string[]): string[] {
    const npa = this.nodePortAddresses;
    return npa.matchAll ? [...addrs] : addrs.filter((ip) => npa.cidrs.some((c) => cidrContains(c, ip)));
  }
}
