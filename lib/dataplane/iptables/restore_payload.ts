/**
 * One sync's `iptables-restore` payload: its {@linkcode Plan} (static parts, and what the stream decides: the
 * ports' blocks, the chains written and deleted, rule counts), the generator that streams it from the render
 * cache while planning, the replay that renders the same bytes again from a finished plan, and the
 * {@linkcode BuiltPayload} kept for tests and error messages.
 * @module
 */

import type { ProxySnapshot } from "../../proxy/types.ts";
import { sameRenderedState } from "../../proxy/state_equality.ts";
import { ChunkWriter, collectChunks, type SectionCache } from "../payload.ts";
import { chainNames, isServiceChainName, type PortChains, removedChainNames } from "./chain_names.ts";
import type { ScanResult } from "./kernel_scan.ts";
import { renderChainRules } from "./chain_rules.ts";
import { type RenderConfig, renderServicePort, type ServicePortBlock } from "./rules.ts";
import {
  filterHeadRules,
  filterTailRules,
  KUBE_EXTERNAL_SERVICES,
  KUBE_FIREWALL,
  KUBE_FORWARD,
  KUBE_MARK_MASQ,
  KUBE_NODEPORTS,
  KUBE_POSTROUTING,
  KUBE_PROXY_CANARY,
  KUBE_PROXY_FIREWALL,
  KUBE_SERVICES,
  natHeadRules,
  nodePortsTailRules,
} from "./static_rules.ts";
import { chainLine, deleteChainLine } from "../iptables_rule.ts";

const decoder = new TextDecoder();

/** Parses iptables-restore's "line N failed" / "line N: ..." error. */
export function failedLine(stderr: string): number | null {
  const m = stderr.match(/line (\d+)/);
  return m ? Number(m[1]) : null;
}

/** The payload of one sync, kept for tests and error messages. */
export interface BuiltPayload {
  /** The payload as handed to iptables-restore (rendered again from the sync's plan on first use). */
  readonly bytes: Uint8Array;
  /** The payload as text. */
  readonly text: string;
  readonly full: boolean;
  /** Chains deleted by this payload. */
  readonly deleted: readonly string[];
}

/** A payload re-rendered on demand from its plan (the same bytes as were streamed). */
export class Payload implements BuiltPayload {
  #bytes: Uint8Array | null = null;
  #text: string | null = null;
  constructor(private readonly plan: Plan, private readonly chunkBytes: number) {}

  get full(): boolean {
    return this.plan.full;
  }

  get deleted(): readonly string[] {
    return this.plan.deleted;
  }

  get bytes(): Uint8Array {
    return this.#bytes ??= collectChunks(replayPayload(this.plan, this.chunkBytes));
  }

  get text(): string {
    return this.#text ??= decoder.decode(this.bytes);
  }
}

/** What the static parts of a payload depend on besides the render settings. */
export interface StaticInputs {
  /** `nf_conntrack_tcp_be_liberal` is set (no INVALID drop rule). */
  conntrackLiberal: boolean;
  /** MASQUERADE with `--random-fully`. */
  randomFully: boolean;
  /** nodePortAddresses match every local address. */
  nodePortsMatchAll: boolean;
  /** The node's addresses matching CIDR nodePortAddresses. */
  nodePortIPs: readonly string[];
}

/** A new plan: the payload's static parts, and empty lists for what streaming it decides. */
export function newPlan(
  snapshot: ProxySnapshot,
  cfg: RenderConfig,
  full: boolean,
  scan: ScanResult | null,
  inputs: StaticInputs,
): Plan {
  // Static parts (chain lines first: a rule may only jump to a declared chain).
  let head = "*filter\n" +
    [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL].map((c) =>
      chainLine(c)
    ).join("");
  const fHead = filterHeadRules(cfg);
  if (fHead) head += chainLine(KUBE_FIREWALL);
  if (full) head += chainLine(KUBE_PROXY_CANARY);
  head += fHead;
  const fTail = filterTailRules(cfg, inputs.conntrackLiberal);
  let natHead = "COMMIT\n*nat\n" +
    [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ].map((c) => chainLine(c)).join("");
  if (full) natHead += chainLine(KUBE_PROXY_CANARY);
  const nHead = natHeadRules(cfg, inputs.randomFully);
  const tail = nodePortsTailRules(cfg, inputs.nodePortsMatchAll, inputs.nodePortIPs);
  const countLines = (s: string) => {
    let n = 0;
    for (let i = s.indexOf("\n"); i >= 0; i = s.indexOf("\n", i + 1)) n++;
    return n;
  };
  return {
    full,
    cfg,
    changed: full ? null : snapshot.changedServices,
    scan,
    head,
    fTail: fTail + (scan ? scan.missingJumps.filter : ""),
    natHead,
    nHead,
    tail,
    jn: scan ? scan.missingJumps.nat : "",
    mangle: full ? `*mangle\n${chainLine(KUBE_PROXY_CANARY)}COMMIT\n` : "",
    staticFilter: countLines(fHead) + countLines(fTail),
    staticNat: countLines(nHead) + countLines(tail),
    order: [],
    written: [],
    deleted: [],
    appliedChanged: new Map(),
    dispatch: "",
    bytes: 0,
    filterRules: 0,
    natRulesWritten: 0,
    natRulesTotal: 0,
    servicesChainHasRules: false,
  };
}

/** The dataplane's render cache and memory of written chains, as one stream reads and updates them. */
export interface StreamState {
  /** Rendered blocks by `nameString` (updated: re-rendered ports, removed ports). */
  readonly blocks: Map<string, ServicePortBlock>;
  /** The cached nat dispatch section (updated). */
  readonly dispatchSection: SectionCache;
  /** Chains of each port as last successfully written (read only: the plan records the changes). */
  readonly applied: ReadonlyMap<string, PortChains>;
  /** Large-cluster mode (> 1000 endpoints). */
  readonly largeCluster: boolean;
  /** Bytes per chunk handed to iptables-restore. */
  readonly chunkBytes: number;
}

/**
 * Plans and streams one payload. The first pass over the snapshot (cache look-ups, re-rendering changed
 * ports, which ports' chains to write, chains to delete by comparing with what was written last) streams the
 * filter section as it goes; then the nat table: declarations (from the blocks' chain names), the cached
 * dispatch section, and the written ports' chain rules, rendered one port at a time into the stream.
 * Per-sync work for an unchanged port is a map look-up and an identity check.
 */
export function* streamPayload(
  snapshot: ProxySnapshot,
  p: Plan,
  s: StreamState,
): Generator<Uint8Array, void, undefined> {
  const cfg = p.cfg;
  const changed = p.changed;
  const full = p.full;
  const largeCluster = s.largeCluster;
  const blocks = s.blocks;
  const applied = s.applied;
  const dispatchSec = s.dispatchSection;
  dispatchSec.begin();
  const w = new ChunkWriter(s.chunkBytes);
  let filterRules = 0, dispatchRules = 0;
  let appliedSeen = 0;

  yield* w.text(p.head);
  for (const [name, st] of snapshot.servicePorts) {
    let b = blocks.get(name);
    let rendered = false;
    if (b === undefined || b.state !== st) {
      if (b !== undefined && sameRenderedState(b.state, st)) b.state = st;
      else {
        const nb = renderServicePort(st, cfg, largeCluster, b);
        if (b !== undefined) {
          // Keep the old dispatch/filter views when their bytes did not change (an endpoint change), so
          // that the cached section concatenation stays valid.
          if (b.dispatch === nb.dispatch) nb.dispatch = b.dispatch;
          if (b.filter === nb.filter) nb.filter = b.filter;
        }
        b = nb;
        rendered = true;
        blocks.set(name, b);
      }
    }
    p.order.push(b);
    yield* w.text(b.filter);
    dispatchSec.push(b.dispatch);
    filterRules += b.filterRuleCount;
    dispatchRules += b.dispatchRuleCount;
    if (full || rendered || changed!.has(st.info.serviceKey)) {
      p.written.push(b);
      const old = applied.get(name);
      if (old !== undefined) appliedSeen++;
      if (old !== b.chains) {
        if (old !== undefined) removedChainNames(old, b.chains, p.deleted);
        p.appliedChanged.set(name, b.chains);
      }
    }
  }
  // Ports that disappeared (blocks hold every snapshot port, so extra blocks mean removals; on a full sync
  // every written port was looked up in `applied`, so a count mismatch means removals too).
  const n = snapshot.servicePorts.size;
  if (blocks.size > n || applied.size > n || (full && appliedSeen !== applied.size)) {
    for (const name of [...blocks.keys()]) {
      if (!snapshot.servicePorts.has(name)) blocks.delete(name);
    }
    for (const [name, chains] of applied) {
      if (!snapshot.servicePorts.has(name)) {
        p.deleted.push(...chainNames(chains));
        p.appliedChanged.set(name, null);
      }
    }
  }
  if (p.scan) {
    // Leftovers found by iptables-save (start, or after a failure): anything of ours not written now.
    const active = new Set<string>(p.deleted);
    for (const b of blocks.values()) for (const c of chainNames(b.chains)) active.add(c);
    for (const c of p.scan.chains.nat) {
      if (!active.has(c) && isServiceChainName(c)) {
        active.add(c);
        p.deleted.push(c);
      }
    }
  }
  p.dispatch = dispatchSec.text();
  yield* emitNat(w, p);

  let chainRulesWritten = 0, chainRulesAll = 0;
  for (const b of p.written) chainRulesWritten += b.chainRuleCount;
  for (const b of p.order) {
    if (b.chainRuleCount < 0) renderChainRules(b, cfg); // never written yet (not expected): count it
    chainRulesAll += b.chainRuleCount;
  }
  p.bytes = w.total;
  p.filterRules = p.staticFilter + filterRules;
  p.natRulesWritten = p.staticNat + dispatchRules + chainRulesWritten;
  p.natRulesTotal = p.staticNat + dispatchRules + chainRulesAll;
  p.servicesChainHasRules = dispatchRules > 0 || p.tail.includes("-A KUBE-SERVICES ");
}

/** Everything after the filter section: the nat table and the mangle canary. */
function* emitNat(w: ChunkWriter, p: Plan): Generator<Uint8Array, void, undefined> {
  yield* w.text(p.fTail);
  yield* w.text(p.natHead);
  for (const b of p.written) {
    for (const c of chainNames(b.chains)) yield* w.text(chainLine(c));
  }
  for (const c of p.deleted) yield* w.text(chainLine(c));
  yield* w.text(p.nHead);
  yield* w.text(p.dispatch);
  for (const b of p.written) yield* w.text(renderChainRules(b, p.cfg));
  yield* w.text(p.tail);
  for (const c of p.deleted) yield* w.text(deleteChainLine(c));
  yield* w.text(p.jn);
  yield* w.text("COMMIT\n");
  yield* w.text(p.mangle);
  yield* w.end();
}

/** The same payload again from a finished plan (error context, `lastPayload`). */
export function* replayPayload(p: Plan, chunkBytes: number): Generator<Uint8Array, void, undefined> {
  const w = new ChunkWriter(chunkBytes);
  yield* w.text(p.head);
  for (const b of p.order) yield* w.text(b.filter);
  yield* emitNat(w, p);
}

/** What one payload writes, decided while it streams; enough to render the same bytes again. */
export interface Plan {
  full: boolean;
  cfg: RenderConfig;
  /** Services whose ports' chains are written (null: every port's). */
  changed: ReadonlySet<string> | null;
  scan: ScanResult | null;
  /** Filter table head: declarations and static rules. */
  head: string;
  /** Static filter rules after the per-port ones, and missing jumps. */
  fTail: string;
  /** `COMMIT`, nat table head declarations. */
  natHead: string;
  /** Static nat rules (KUBE-POSTROUTING, KUBE-MARK-MASQ). */
  nHead: string;
  /** The KUBE-SERVICES → KUBE-NODEPORTS rule(s). */
  tail: string;
  /** Missing nat jumps. */
  jn: string;
  mangle: string;
  staticFilter: number;
  staticNat: number;
  /** Every port's block, in snapshot order. */
  order: ServicePortBlock[];
  /** Ports whose chains are written. */
  written: ServicePortBlock[];
  /** Chains deleted by this payload. */
  deleted: string[];
  /** Chains of each port as this payload leaves them (null: the port is gone). */
  appliedChanged: Map<string, PortChains | null>;
  /** The nat dispatch section. */
  dispatch: string;
  /** Payload size. */
  bytes: number;
  filterRules: number;
  natRulesWritten: number;
  natRulesTotal: number;
  /** nat KUBE-SERVICES holds at least one rule after this payload (dispatch or the nodeports tail). */
  servicesChainHasRules: boolean;
}
