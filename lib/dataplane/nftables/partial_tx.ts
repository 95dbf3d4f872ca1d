/**
 * The sections of a partial sync's transaction: operations are collected per section and written in a fixed
 * order (chains emptied before the affinity sets they use go, declarations before the rules that refer to them,
 * element deletions before additions, chain deletions last).
 * @module
 */
import type { Nftables } from "./interface.ts";
import { type NftOp, ruleObject } from "./rules.ts";
import type { Transaction } from "./transaction.ts";

/** Sections of a partial sync's transaction, written in this order. */
export class PartialSyncTx {
  flushes: NftOp[] = [];
  setDeletes: NftOp[] = [];
  setAdds: NftOp[] = [];
  chains: NftOp[] = [];
  rules: NftOp[] = [];
  elemDeletes: NftOp[] = [];
  elemAdds: NftOp[] = [];
  chainDeletes: NftOp[] = [];

  /** Empties a chain that is no longer used (created first, so that a chain missing already is no error). */
  staleFlush(name: string): void {
    this.flushes.push(["add", { kind: "chain", name }], ["flush", { kind: "chain", name }]);
  }

  /** Declares (or empties) a chain and queues its rules after every declaration of the transaction. */
  writeChain(name: string, rules: readonly string[]): void {
    this.chains.push(["add", { kind: "chain", name }], ["flush", { kind: "chain", name }]);
    for (const rule of rules) this.rules.push(["add", ruleObject(name, rule)]);
  }

  /** The operations as one transaction. */
  build(nft: Nftables): Transaction {
    const tx = nft.newTransaction();
    const sections = [
      this.flushes,
      this.setDeletes,
      this.setAdds,
      this.chains,
      this.rules,
      this.elemDeletes,
      this.elemAdds,
      this.chainDeletes,
    ];
    for (const section of sections) for (const [verb, obj] of section) tx.push({ verb, obj });
    return tx;
  }
}
