/**
 * nftables for the agent, in the style of sigs.k8s.io/knftables: typed objects, transactions that render
 * the exact `nft -f -` input, a real runner over the command runner, and an in-memory fake whose dump
 * matches `nft list table`.
 *
 * @example Usage
 * ```ts
 * import assert from "node:assert/strict";
 * import { FakeNftables, isNotFound } from "./mod.ts";
 * const nft = new FakeNftables("ip", "kube-proxy");
 * const tx = nft.newTransaction();
 * tx.add({ kind: "table", comment: "rules for kube-proxy" });
 * tx.add({ kind: "chain", name: "services" });
 * tx.add({ kind: "rule", chain: "services", rule: "jump missing" });
 * await assert.rejects(nft.run(tx), (err) => isNotFound(err));
 * assert.equal(nft.dump(), ""); // nothing was applied
 * ```
 * @module
 */
export * from "./objects.ts";
export * from "./transaction.ts";
export * from "./errors.ts";
export type { ListableType, Nftables } from "./interface.ts";
export { errorFromNft, NftablesRunner, type NftablesRunnerOptions } from "./nft_runner.ts";
export { FakeChain, type FakeElement, FakeNftables, type FakeRule, FakeSet, FakeTable } from "./fake.ts";
export * from "./versions.ts";
