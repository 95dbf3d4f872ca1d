/**
 * Real nft (root, strace): the netlink path sends, message for message, the batch nft 1.0.6 sends for the same
 * transaction. Every transaction the dataplane runs in the netlink scenario (the first full sync's runs ahead and
 * every partial sync; the full sync's own transaction is left to nft and skipped here), in both families, and a transaction with the rule forms the
 * scenario's configuration does not write (interface matches, prefixes off byte boundaries, jump, accept),
 * are encoded by the agent and captured from nft under strace; the two attribute trees must be equal (sequence
 * numbers aside, set IDs numbered by creation, nft's references by ID to its cache's sets aside).
 */
import assert from "node:assert/strict";
import { encodeBatch } from "../../../../lib/dataplane/nftables/netlink/batch.ts";
import { NftablesRunner } from "../../../../lib/dataplane/nftables/nft_runner.ts";
import type { Operation, Transaction } from "../../../../lib/dataplane/nftables/transaction.ts";
import { configureLogging } from "../../../../lib/log.ts";
import { privilegedTest } from "../../../../testkit/privileged.ts";
import { nftKernelUnavailableReason, withNetns } from "../helpers.ts";
import { batchTree, captureNftBatch } from "./capture.ts";
import { dataplane, ROUNDS, roundSnapshot } from "./scenario.ts";

configureLogging({ sink: () => {} });

function unavailable(): string | undefined {
  const r = nftKernelUnavailableReason();
  if (r !== undefined) return r;
  try {
    new Deno.Command("strace", { args: ["-V"], stdout: "null" }).outputSync();
  } catch {
    return "strace is not installed";
  }
  return undefined;
}

/**
 * Compares the agent's encoding of `tx` with the batch nft sends for it (nft applies it in `ns`); false when
 * the agent does not encode it (nothing applied then).
 */
async function compare(ns: string, tx: Transaction): Promise<boolean> {
  const ours = encodeBatch(tx.family, tx.table, tx.operations, 0);
  if (ours === null) return false;
  const nft = await captureNftBatch(ns, tx.toString());
  assert.equal(batchTree(ours.bytes), batchTree(nft), `batch of:\n${tx.toString()}`);
  return true;
}

/** nft, except that each transaction the agent can encode is compared and applied by the captured nft. */
class ComparingNftables extends NftablesRunner {
  compared = 0;
  constructor(readonly ns: string, opts: ConstructorParameters<typeof NftablesRunner>[0]) {
    super(opts);
  }
  override async run(tx: Transaction): Promise<void> {
    if (await compare(this.ns, tx)) this.compared++;
    else await super.run(tx);
  }
  override async runOperations(ops: Iterable<Operation>): Promise<number> {
    if (!Array.isArray(ops)) return await super.runOperations(ops); // the full sync's own transaction
    const tx = this.newTransaction();
    for (const o of ops as Operation[]) tx.push(o);
    if (await compare(this.ns, tx)) this.compared++;
    else await super.run(tx);
    return 0;
  }
}

for (const family of ["IPv4", "IPv6"] as const) {
  privilegedTest(unavailable(), {
    name: `nft (${family}): every partial sync of the scenario is encoded as nft encodes it`,
    fn: async () => {
      await withNetns(async (runner, ns) => {
        const fam = family === "IPv6" ? "ip6" : "ip";
        const comparing = new ComparingNftables(ns, { family: fam, table: "kube-proxy", runner });
        const dp = dataplane(runner, family, comparing);
        for (const k of ROUNDS.keys()) await dp.sync(roundSnapshot(family, k));
        // Three runs ahead of the first full sync, then every partial sync.
        assert.ok(comparing.compared >= 3 + ROUNDS.length - 1, `batches compared: ${comparing.compared}`);
      });
    },
  });
}

privilegedTest(unavailable(), {
  name: "nft: rule forms beyond the scenario's configuration are encoded as nft encodes them",
  fn: async () => {
    await withNetns(async (runner, ns) => {
      await runner.run({ cmd: "nft", args: ["add table ip kube-proxy ; add table ip6 kube-proxy"] });
      for (const fam of ["ip", "ip6"] as const) {
        const nft = new NftablesRunner({ family: fam, table: "kube-proxy", runner });
        const tx = nft.newTransaction();
        tx.add({ kind: "chain", name: "a" });
        tx.add({ kind: "chain", name: "b" });
        const rules = [
          'iifname "eth0" goto a',
          "iifname != cbr0 jump a",
          "iifname veth* goto a",
          "iifname != veth* accept",
          "return",
          ...(fam === "ip"
            ? ["ip saddr 10.0.0.0/14 goto a", "ip saddr != 10.1.128.0/17 drop", "ip saddr 0.0.0.0/0 accept"]
            : ["ip6 saddr fd00::/57 goto a", "ip6 saddr != fd00:1::1 drop", "ip6 saddr ::/0 accept"]),
        ];
        for (const rule of rules) tx.add({ kind: "rule", chain: "b", rule, comment: "a comment" });
        assert.ok(await compare(ns, tx), `encodable:\n${tx.toString()}`);
      }
    });
  },
});
