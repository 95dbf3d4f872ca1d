/**
 * The full sync's operations: the fixed layout (`setupOps`), every service port's chains, affinity sets and
 * elements; the shared maps and sets are flushed and refilled in the same transaction.
 *
 * - The transaction is generated port by port while nft reads it (`fullSyncOps`, through
 *   `Nftables.runOperations`: bounded chunks, no transaction-sized text), filling a `FullResult` with what it
 *   found and wrote, for the dataplane to remember once nft succeeds.
 * - Chains and affinity sets of ports the kernel has none of go ahead in runs of `precreatePorts` ports
 *   (`precreate`; unreferenced until the sync's transaction adds the elements leading to them): the kernel's
 *   commit costs the transaction's length per anonymous set, so one 10k-port transaction costs that squared.
 * - Every existing generated chain is emptied first (v1.35's layout kept endpoint chains on the first sync;
 *   v1.37 has them only for affinity, and their rules changed, so nothing is kept).
 * @module
 */
import type { IPFamily, ProxySnapshot, ServicePortState } from "../../proxy/types.ts";
import { elementKey, elementOp, ElementOwnership, elementValue } from "./element_owners.ts";
import type { Nftables } from "./interface.ts";
import { isAffinitySetName, isServiceChainName, SET, TABLE, TABLE_COMMENT } from "./names.ts";
import { writeObject } from "./objects.ts";
import {
  elementContainerDeclarations,
  elementContainers,
  nftFamily,
  type NftRenderConfig,
  type NftSetupConfig,
  renderServicePort,
  ruleObject,
  setupOps,
} from "./rules.ts";
import type { StaleChains } from "./stale_chains.ts";
import { affinitySetOp, op } from "./sync_ops.ts";
import type { Operation } from "./transaction.ts";

/** The table's chains and affinity sets, as listed before a full sync. */
export interface TableObjects {
  chains: Set<string>;
  sets: Set<string>;
}

/** What a full sync found and wrote, committed when nft succeeds. */
export interface FullResult {
  /** Every element written, with its owners. */
  elements: ElementOwnership;
  /** Generated chains nobody uses, emptied by this transaction (deleted later). */
  stale: string[];
  /** Stale chains deleted by this transaction. */
  deleted: string[];
}

/** An empty {@linkcode FullResult}, filled as the full sync's operations are generated. */
export function newFullResult(): FullResult {
  return { elements: new ElementOwnership(), stale: [], deleted: [] };
}

/**
 * Upstream v1.35's (and this agent's before) chain that marked packets for masquerade; v1.37 marks inline. Upstream
 * v1.37 leaves it behind in a table an older version wrote; the agent deletes it on a full sync that finds it.
 */
const LEGACY_MARK_CHAIN = "mark-for-masquerade";

/** How a full sync renders the table. */
export interface FullSyncInput {
  readonly family: IPFamily;
  /** The fixed part of the table. */
  readonly setup: NftSetupConfig;
  /** How every service port is rendered. */
  readonly cfg: NftRenderConfig;
  /** The generated chains the kernel may hold, asked for when the table could not be listed. */
  readonly knownChains: () => Set<string>;
}

/**
 * The generated chains the kernel may hold when the table could not be listed: those waiting for deletion and
 * those of ports whose state changed since they were written (a port whose state is the same has the same
 * chains, which this sync writes again).
 */
export function knownChains(
  snapshot: ProxySnapshot,
  due: Set<string>,
  staleChains: StaleChains,
  written: ReadonlyMap<string, ServicePortState>,
  cfg: NftRenderConfig,
): Set<string> {
  const known = new Set<string>([...staleChains.names(), ...due]);
  for (const [name, old] of written) {
    if (snapshot.servicePorts.get(name) === old) continue;
    for (const c of renderServicePort(old, cfg).chains.keys()) known.add(c);
  }
  return known;
}

/** What {@linkcode precreate} writes with. */
export interface PrecreateInput {
  readonly nft: Nftables;
  readonly family: IPFamily;
  /** How every service port is rendered. */
  readonly cfg: NftRenderConfig;
  /** Ports per `nft -f` run (the `precreatePorts` option); 0 turns it off. */
  readonly portsPerRun: number;
}

/**
 * Writes the chains and affinity sets of ports the kernel has none of (per `existing`), in runs of
 * `portsPerRun` ports, ahead of the full sync's transaction; adds the ports written to `early`. Only full
 * runs are sent (a remainder goes in the sync's transaction). Returns the bytes sent.
 */
export async function precreate(
  input: PrecreateInput,
  snapshot: ProxySnapshot,
  existing: TableObjects,
  early: Set<string>,
  gen: { ms: number },
  lines: string[] | null,
): Promise<number> {
  const { nft, family, cfg, portsPerRun } = input;
  if (portsPerRun <= 0 || snapshot.servicePorts.size < portsPerRun) return 0;
  const fam = nftFamily(family);
  let bytes = 0;
  let batch: Operation[] = [];
  let names: string[] = [];
  let t = performance.now();
  for (const [name, st] of snapshot.servicePorts) {
    const r = renderServicePort(st, cfg);
    let known = false;
    for (const c of r.chains.keys()) if (existing.chains.has(c)) known = true;
    for (const s of r.affinitySets) if (existing.sets.has(s)) known = true;
    if (known) continue;
    if (batch.length === 0) {
      // The shared maps declared before any anonymous set: the kernel finds a set by name walking the table's
      // sets in creation order, once per element added, so these go first (10k × 10: a third of the commit).
      batch.push(op("add", { kind: "table", comment: TABLE_COMMENT }));
      for (const c of elementContainerDeclarations(family)) batch.push(op("add", c));
    }
    for (const set of r.affinitySets) batch.push(affinitySetOp(family, set, r.affinityTimeout));
    for (const chain of r.chains.keys()) {
      batch.push(op("add", { kind: "chain", name: chain }), op("flush", { kind: "chain", name: chain }));
    }
    for (const [chain, rules] of r.chains) {
      for (const rule of rules) batch.push(op("add", ruleObject(chain, rule)));
    }
    names.push(name);
    if (names.length < portsPerRun) continue;
    gen.ms += performance.now() - t;
    if (lines !== null) { for (const o of batch) lines.push(writeObject(o.verb, o.obj, fam, TABLE)); }
    bytes += await nft.runOperations(batch);
    for (const n of names) early.add(n);
    batch = [];
    names = [];
    t = performance.now();
  }
  gen.ms += performance.now() - t;
  return bytes;
}

/**
 * The full sync's operations, port by port: the fixed layout and the emptied shared maps; every existing
 * generated chain emptied (so that no rule uses an affinity set deleted below); for each port its affinity
 * sets, its chains declared, then its rules (a port's rules only refer to its own chains and sets, and to fixed
 * chains); then every element, and the chains and affinity sets nobody uses any more. Fills `out` as it goes.
 * Ports in `early` were written ahead by {@linkcode precreate}: only their elements are written here.
 */
export function* fullSyncOps(
  input: FullSyncInput,
  snapshot: ProxySnapshot,
  existing: TableObjects | null,
  due: Set<string>,
  out: FullResult,
  early: ReadonlySet<string>,
): Generator<Operation, void, undefined> {
  const { family, cfg } = input;
  for (const [verb, obj] of setupOps(input.setup)) yield op(verb, obj);
  for (const c of elementContainers(family)) yield op("flush", c);
  if (input.setup.localhostRejects.length > 0) {
    yield op("flush", { kind: "map", name: SET.localhostNodePortRejects });
  }

  // Generated chains that may be stale: what the kernel has (listed), else what this dataplane knows of.
  // Each chain a port uses is taken out as the port is written; what remains at the end is stale.
  const candidates = existing?.chains ?? input.knownChains();
  if (existing !== null) {
    for (const c of existing.chains) {
      if (isServiceChainName(c)) yield op("flush", { kind: "chain", name: c });
    }
    // The v1.35 layout's masquerade helper: no rule refers to it once the chains above are emptied.
    if (existing.chains.has(LEGACY_MARK_CHAIN)) {
      yield op("delete", { kind: "chain", name: LEGACY_MARK_CHAIN });
    }
  }

  const activeSets = new Set<string>();
  const elements = out.elements;
  const toWrite: string[] = [];
  for (const [name, st] of snapshot.servicePorts) {
    const r = renderServicePort(st, cfg);
    if (early.has(name)) {
      // Written ahead by precreate(): only its elements (below) are this transaction's.
      for (const set of r.affinitySets) activeSets.add(set);
      for (const chain of r.chains.keys()) candidates.delete(chain);
    }
    for (const set of early.has(name) ? [] : r.affinitySets) {
      activeSets.add(set);
      // An existing set may carry another timeout: re-create it (its chains were emptied above).
      if (existing?.sets.has(set)) yield op("delete", { kind: "set", name: set });
      yield affinitySetOp(family, set, r.affinityTimeout);
    }
    toWrite.length = 0;
    for (const chain of early.has(name) ? [] : r.chains.keys()) {
      candidates.delete(chain);
      toWrite.push(chain);
      yield op("add", { kind: "chain", name: chain });
      yield op("flush", { kind: "chain", name: chain });
    }
    for (const chain of toWrite) {
      for (const rule of r.chains.get(chain)!) yield op("add", ruleObject(chain, rule));
    }
    for (const e of r.elements) elements.add(name, elementKey(e), elementValue(e));
  }
  for (const [ckey, value] of elements.kernel) yield elementOp("add", ckey, value);
  // Leftovers: generated chains and affinity sets nobody uses now (an earlier run, or failed syncs).
  for (const c of candidates) {
    if (!isServiceChainName(c)) continue;
    // Not emptied above (not listed): emptied now.
    if (existing === null) {
      yield op("add", { kind: "chain", name: c });
      yield op("flush", { kind: "chain", name: c });
    }
    if (due.has(c)) {
      yield op("delete", { kind: "chain", name: c });
      out.deleted.push(c);
    } else out.stale.push(c);
  }
  for (const s of existing?.sets ?? []) {
    if (isAffinitySetName(s) && !activeSets.has(s)) yield op("delete", { kind: "set", name: s });
  }
}

/** Passes the operations on, keeping each one's input line (`nft -f -` text for the table of `fam`). */
export function* recorded(
  ops: Iterable<Operation>,
  lines: string[],
  fam: "ip" | "ip6",
): Generator<Operation, void, undefined> {
  for (const o of ops) {
    lines.push(writeObject(o.verb, o.obj, fam, TABLE));
    yield o;
  }
}
