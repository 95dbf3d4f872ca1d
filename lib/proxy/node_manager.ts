/**
 * The own Node (upstream `pkg/proxy/node.go`): waits for it and its IPs at start-up, exposes its IPs,
 * primary IP, pod CIDRs, topology labels and eligibility, and ends the process (through an injected
 * `exit`) when the node IPs change, the pod CIDRs change (NodeCIDR mode) or the Node is deleted, since
 * kube-proxy's rules are built from them.
 * @module
 */
import type { Node } from "../kube/types.ts";
import { LABEL_TOPOLOGY_ZONE } from "../kube/types.ts";
import { log } from "../log.ts";
import { type Clock, realClock } from "./clock.ts";
import { parseIP } from "../net/ip.ts";
import type { IPFamily } from "./types.ts";
import { fieldError, isLabelValue } from "../kube/validation.ts";

/** Taint set by the Cluster Autoscaler before it deletes a node. */
export const TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler";

/**
 * Upstream `utilnode.GetNodeHostIPs`: InternalIP addresses first, then ExternalIP; the first is the
 * primary, followed by the first address of the other family if any. Empty when the node has none.
 */
export function nodeHostIPs(node: Node | undefined | null): string[] {
  const all: string[] = [];
  for (const type of ["InternalIP", "ExternalIP"]) {
    for (const a of node?.status?.addresses ?? []) {
      if (a?.type !== type || !a.address) continue;
      const ip = parseIP(a.address);
      if (ip) all.push(ip.ip);
    }
  }
  if (all.length === 0) return [];
  const primary = all[0];
  const primaryV6 = primary.includes(":");
  const secondary = all.find((ip) => ip.includes(":") !== primaryV6);
  return secondary ? [primary, secondary] : [primary];
}

/** Node IPs of one family in {@linkcode nodeHostIPs} order. */
export function nodeIPsOfFamily(node: Node | undefined | null, family: IPFamily): string[] {
  return nodeHostIPs(node).filter((ip) => (ip.includes(":") ? "IPv6" : "IPv4") === family);
}

/** /healthz eligibility: the Node is known, not being deleted, and not tainted ToBeDeletedByClusterAutoscaler. */
export function nodeEligible(node: Node | undefined | null): boolean {
  if (!node) return false;
  if (node.metadata?.deletionTimestamp) return false;
  return !(node.spec?.taints ?? []).some((t) => t?.key === TO_BE_DELETED_TAINT);
}

/** The node's topology labels that affect endpoint selection (only the zone, as upstream). */
export function topologyLabels(node: Node | undefined | null): Record<string, string> {
  const zone = node?.metadata?.labels?.[LABEL_TOPOLOGY_ZONE];
  if (zone === undefined) return {};
  const errs = typeof zone === "string" ? isLabelValue(zone) : ["must be a string"];
  if (errs.length > 0) {
    // The API server refuses such a label; a Node served without that check gets no zone rather than a
    // value that endpoint hints are matched against.
    log.error("Ignoring invalid Node zone label", undefined, {
      err: fieldError(`metadata.labels[${LABEL_TOPOLOGY_ZONE}]`, zone, errs),
    });
    return {};
  }
  return { [LABEL_TOPOLOGY_ZONE]: zone };
}

/** Result of {@linkcode detectNodeIPs}. */
export interface DetectedNodeIPs {
  primaryFamily: IPFamily;
  ips: Record<IPFamily, string>;
}

/**
 * Upstream `detectNodeIPs` (reference row 38): loopback by default, overridden by the Node's addresses
 * (the first gives the primary family), overridden by `bindAddress` when it is neither unspecified nor
 * loopback.
 */
export function detectNodeIPs(node: Node | undefined | null, bindAddress = ""): DetectedNodeIPs {
  let primaryFamily: IPFamily = "IPv4";
  const ips: Record<IPFamily, string> = { IPv4: "127.0.0.1", IPv6: "::1" };
  const raw = nodeHostIPs(node);
  if (raw.length > 0) {
    primaryFamily = raw[0].includes(":") ? "IPv6" : "IPv4";
    for (const ip of raw) ips[ip.includes(":") ? "IPv6" : "IPv4"] = ip;
  }
  const b = parseIP(bindAddress);
  if (b && b.ip !== "0.0.0.0" && b.ip !== "::" && !b.ip.startsWith("127.") && b.ip !== "::1") {
    primaryFamily = b.family;
    ips[b.family] = b.ip;
  }
  return { primaryFamily, ips };
}

/** Options of {@linkcode NodeManager}. */
export interface NodeManagerOptions {
  nodeName: string;
  /** NodeCIDR local-traffic detection: wait for podCIDRs and exit when they change. */
  watchPodCIDRs?: boolean;
  /** Ends the process; production passes `Deno.exit`. */
  exit: (code: number) => void;
  clock?: Clock;
  /** @default 300000 (5 min) */
  waitTimeoutMs?: number;
}

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Holds the own Node, fed by a Node informer restricted to `metadata.name=<nodeName>`. */
export class NodeManager {
  #node: Node | undefined;
  #ready = false;
  #waiters: (() => void)[] = [];
  readonly #clock: Clock;

  constructor(private readonly opts: NodeManagerOptions) {
    this.#clock = opts.clock ?? realClock;
  }

  /** The latest Node object (read-only), undefined before the first event. */
  get node(): Node | undefined {
    return this.#node;
  }

  /** Node IPs (primary first), from the Node accepted at start-up or later. */
  get nodeIPs(): string[] {
    return nodeHostIPs(this.#node);
  }

  /** spec.podCIDRs of the Node. */
  get podCIDRs(): string[] {
    return [...(this.#node?.spec?.podCIDRs ?? [])];
  }

  /** The Node's labels. */
  get labels(): Record<string, string> {
    return { ...(this.#node?.metadata?.labels ?? {}) };
  }

  /** /healthz eligibility of the Node. */
  get eligible(): boolean {
    return nodeEligible(this.#node);
  }

  #usable(node: Node | undefined): string | null {
    if (!node) return `node "${this.opts.nodeName}" not found`;
    if (nodeHostIPs(node).length === 0) {
      const known = (node.status?.addresses ?? []).map((a) => `${a.type}:${a.address}`);
      return `host IP unknown; known addresses: [${known.join(" ")}]`;
    }
    if (this.opts.watchPodCIDRs && (node.spec?.podCIDRs?.length ?? 0) === 0) {
      return `node "${this.opts.nodeName}" does not have any PodCIDR allocated`;
    }
    return null;
  }

  /**
   * Resolves with the Node once it exists and has IPs (and podCIDRs when watched). Rejects with the
   * last reason after `waitTimeoutMs`.
   * @throws {Error} On timeout.
   */
  waitForNode(): Promise<Node> {
    if (this.#usable(this.#node) === null) {
      this.#ready = true;
      return Promise.resolve(this.#node!);
    }
    return new Promise((resolve, reject) => {
      const timer = this.#clock.setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w !== check);
        reject(new Error(this.#usable(this.#node) ?? "timed out waiting for the node"));
      }, this.opts.waitTimeoutMs ?? 300_000);
      const check = () => {
        if (this.#usable(this.#node) !== null) return;
        this.#clock.clearTimeout(timer);
        this.#waiters = this.#waiters.filter((w) => w !== check);
        this.#ready = true;
        resolve(this.#node!);
      };
      this.#waiters.push(check);
    });
  }

  /** Node informer add handler. */
  onNodeAdd(node: Node): void {
    this.onNodeUpdate(this.#node ?? null, node);
  }

  /** Node informer update handler: exits when node IPs (or watched podCIDRs) changed after start-up. */
  onNodeUpdate(_old: Node | null, node: Node): void {
    if (node.metadata?.name !== this.opts.nodeName) return;
    const old = this.#node;
    this.#node = node;
    if (!this.#ready) {
      for (const w of [...this.#waiters]) w();
      return;
    }
    if (this.opts.watchPodCIDRs && !sameList(old?.spec?.podCIDRs ?? [], node.spec?.podCIDRs ?? [])) {
      log.info("PodCIDRs changed for the node", {
        node: this.opts.nodeName,
        newPodCIDRs: node.spec?.podCIDRs ?? [],
        oldPodCIDRs: old?.spec?.podCIDRs ?? [],
      });
      this.opts.exit(1);
      return;
    }
    const oldIPs = nodeHostIPs(old);
    const ips = nodeHostIPs(node);
    if (ips.length === 0) {
      log.error("Failed to retrieve NodeIPs", "host IP unknown", { node: this.opts.nodeName });
      return;
    }
    if (!sameList(oldIPs, ips)) {
      log.info("NodeIPs changed for the node", {
        node: this.opts.nodeName,
        newNodeIPs: ips,
        oldNodeIPs: oldIPs,
      });
      this.opts.exit(1);
    }
  }

  /** Node informer delete handler: exits. */
  onNodeDelete(node: Node): void {
    if (node.metadata?.name !== this.opts.nodeName) return;
    log.info("Node is being deleted", { node: this.opts.nodeName });
    this.opts.exit(1);
  }
}
