/**
 * The partial sync: only the changed Services. For each port the dataplane keeps only the state it last wrote
 * (the model's own object) and renders it again to see what the kernel holds, so the transaction holds only what
 * differs: chains whose rules changed, added and removed affinity sets and map elements. The elements of the
 * shared maps are kept with their owners. What the dataplane must remember once nft has applied the transaction
 * is returned apart ({@linkcode PartialSyncChanges}).
 * @module
 */
import { sameRenderedState } from "../../proxy/state_equality.ts";
import type { IPFamily, ProxySnapshot, ServicePortState } from "../../proxy/types.ts";
import { elementKey, elementOp, type ElementOwnership, elementValue } from "./element_owners.ts";
import type { PartialSyncTx } from "./partial_tx.ts";
import { type NftPortRender, type NftRenderConfig, renderServicePort } from "./rules.ts";
import type { StaleChains } from "./stale_chains.ts";
import { affinitySetOp } from "./sync_ops.ts";

/** A port's rendering as compared by a partial sync. */
interface PortContent {
  /** Chain name → its rules joined by "\n". */
  chains: Map<string, string>;
  affinitySets: Set<string>;
  affinityTimeout: number;
  /** `container key` → `value\tcomment` of the elements this port contributes (its first of each key). */
  elements: Map<string, string>;
}

/** The content of a rendered port, as a partial sync compares it. */
function contentOf(r: NftPortRender): PortContent {
  const chains = new Map<string, string>();
  for (const [name, rules] of r.chains) chains.set(name, rules.join("\n"));
  const elements = new Map<string, string>();
  for (const e of r.elements) {
    const k = elementKey(e);
    if (!elements.has(k)) elements.set(k, elementValue(e));
  }
  return { chains, affinitySets: new Set(r.affinitySets), affinityTimeout: r.affinityTimeout, elements };
}

/** What the dataplane knows of the kernel, as a partial sync reads it (and does not change). */
export interface PartialSyncInput {
  readonly cfg: NftRenderConfig;
  readonly family: IPFamily;
  /** The state each port in the kernel was rendered from. */
  readonly written: ReadonlyMap<string, ServicePortState>;
  readonly elements: ElementOwnership;
  readonly staleChains: StaleChains;
}

/** What a partial sync changed, for the dataplane to remember once nft has applied the transaction. */
export interface PartialSyncChanges {
  /** Ports whose state to remember now (null: the port is gone). */
  readonly updates: Map<string, ServicePortState | null>;
  /** New owners (port → value) of the elements whose owners changed, by `container key`. */
  readonly newOwners: Map<string, Map<string, string>>;
  /** The kernel's new value of the elements it changed (null: deleted), by `container key`. */
  readonly kernelChanges: Map<string, string | null>;
  /** Stale chains used again (no longer to be deleted). */
  readonly revived: string[];
  /** Chains no longer used, emptied by this transaction. */
  readonly stale: string[];
}

/**
 * Fills `tx` with the partial sync of `snapshot` (its `changedServices` set); deletes the `due` stale chains
 * at its end, except those used again (taken out of `due`).
 */
export function buildPartial(
  snapshot: ProxySnapshot,
  tx: PartialSyncTx,
  due: Set<string>,
  input: PartialSyncInput,
): PartialSyncChanges {
  const { cfg, written, elements, staleChains } = input;
  const changed = snapshot.changedServices!;
  const updates = new Map<string, ServicePortState | null>();
  const stale: string[] = [];
  const revived: string[] = [];
  const touched = new Set<string>();
  const ownerChanges: [ckey: string, port: string, value: string | null][] = [];

  const diffPort = (name: string, oldR: NftPortRender | undefined, r: NftPortRender | null) => {
    const old = oldR === undefined ? undefined : contentOf(oldR);
    const neu = r === null ? null : contentOf(r);
    const recreateSets = old !== undefined && neu !== null && old.affinityTimeout !== neu.affinityTimeout &&
      old.affinitySets.size > 0 && neu.affinitySets.size > 0;
    // Chains.
    for (const [chain, rules] of neu?.chains ?? []) {
      const before = old?.chains.get(chain);
      if (before === rules && !recreateSets) continue;
      // Emptied first: its old rules may reference an affinity set deleted before it is rewritten.
      if (before !== undefined) tx.flushes.push(["flush", { kind: "chain", name: chain }]);
      tx.writeChain(chain, r!.chains.get(chain)!);
      if (staleChains.has(chain) || due.has(chain)) {
        revived.push(chain);
        due.delete(chain);
      }
    }
    for (const chain of old?.chains.keys() ?? []) {
      if (neu?.chains.has(chain)) continue;
      tx.staleFlush(chain);
      stale.push(chain);
    }
    // Affinity sets.
    for (const set of old?.affinitySets ?? []) {
      if (recreateSets || !neu?.affinitySets.has(set)) {
        tx.setDeletes.push(["delete", { kind: "set", name: set }]);
      }
    }
    for (const set of neu?.affinitySets ?? []) {
      if (recreateSets || !old?.affinitySets.has(set)) {
        const o = affinitySetOp(input.family, set, neu!.affinityTimeout);
        tx.setAdds.push([o.verb as "add", o.obj]);
      }
    }
    // Elements: ownership changes, applied below once every port is known.
    for (const [ckey, value] of old?.elements ?? []) {
      if (neu?.elements.get(ckey) !== value) {
        ownerChanges.push([ckey, name, null]);
        touched.add(ckey);
      }
    }
    for (const [ckey, value] of neu?.elements ?? []) {
      if (old?.elements.get(ckey) !== value) {
        ownerChanges.push([ckey, name, value]);
        touched.add(ckey);
      }
    }
  };

  for (const [name, st] of snapshot.servicePorts) {
    const old = written.get(name);
    if (old === st) continue;
    if (old !== undefined && (!changed.has(st.info.serviceKey) || sameRenderedState(old, st))) {
      // Renders as what the kernel has (an unchanged Service's state is the same by contract): keep the new
      // object, so that the old one can go.
      if (sameRenderedState(old, st)) updates.set(name, st);
      continue;
    }
    diffPort(name, old === undefined ? undefined : renderServicePort(old, cfg), renderServicePort(st, cfg));
    updates.set(name, st);
  }
  for (const [name, old] of written) {
    if (snapshot.servicePorts.has(name)) continue;
    diffPort(name, renderServicePort(old, cfg), null);
    updates.set(name, null);
  }

  // Elements: the first remaining owner's value wins; a key nobody owns any more is deleted.
  const newOwners = new Map<string, Map<string, string>>();
  for (const [ckey, port, value] of ownerChanges) {
    let m = newOwners.get(ckey);
    if (m === undefined) newOwners.set(ckey, m = elements.ownerMap(ckey));
    if (value === null) m.delete(port);
    else m.set(port, value);
  }
  for (const chain of due) tx.chainDeletes.push(["delete", { kind: "chain", name: chain }]);
  const kernelChanges = new Map<string, string | null>();
  for (const ckey of touched) {
    const m = newOwners.get(ckey)!;
    const want = m.size > 0 ? m.values().next().value! : null;
    const have = elements.kernel.get(ckey) ?? null;
    if (want === have) continue;
    if (have !== null) {
      const o = elementOp("delete", ckey, null);
      tx.elemDeletes.push([o.verb as "delete", o.obj]);
    }
    if (want !== null) {
      const o = elementOp("add", ckey, want);
      tx.elemAdds.push([o.verb as "add", o.obj]);
    }
    kernelChanges.set(ckey, want);
  }

  return { updates, newOwners, kernelChanges, revived, stale };
}
