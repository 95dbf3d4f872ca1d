/**
 * The block cache and payload stream of IptablesDataplane: payloads assembled from cached blocks (and the
 * cached dispatch section) equal a fresh render under churn, chain deletions keep a model of the kernel's
 * chains exact, and the payload reaches iptables-restore in bounded chunks.
 */
import assert from "node:assert/strict";
import type { CommandResult, CommandRunner, CommandSpec } from "../../../lib/exec.ts";
import { IptablesDataplane } from "../../../lib/dataplane/iptables/dataplane.ts";
import { detectLocalByCIDR } from "../../../lib/dataplane/iptables/local_detector.ts";
import {
  renderChainRules,
  renderServicePort,
  type ServicePortBlock,
} from "../../../lib/dataplane/iptables/rules.ts";
import { configureLogging } from "../../../lib/log.ts";
import type { ServicePortState } from "../../../lib/proxy/types.ts";
import { type EpSpec, makeState, recorder, snapshot, type SvcSpec } from "../../../testkit/fixtures.ts";
import { restores } from "./helpers.ts";

configureLogging({ sink: () => {} });

function newDp(runner: CommandRunner = recorder()) {
  return new IptablesDataplane({
    family: "IPv4",
    runner,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    conntrackTCPBeLiberal: false,
  });
}

/** A small deterministic PRNG (mulberry32). */
function rng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Svc {
  spec: SvcSpec;
  eps: EpSpec[];
  state: ServicePortState;
}

function svc(i: number, r: () => number, gen: number): Svc {
  const spec: SvcSpec = { ns: `ns${i % 3}`, name: `s${i}`, clusterIP: `172.30.${gen % 200}.${i}` };
  if (r() < 0.3) spec.nodePort = 30000 + i;
  if (r() < 0.2) spec.externalIPs = [`192.0.2.${i}`];
  if (r() < 0.15) {
    spec.lbVIPs = [`198.51.100.${i}`];
    spec.nodePort = 31000 + i;
    if (r() < 0.5) spec.sourceRanges = ["203.0.113.0/24", "192.168.0.0/16"];
  }
  if (r() < 0.2) spec.eTPLocal = true;
  if (r() < 0.1) spec.iTPLocal = true;
  if (r() < 0.1) spec.affinity = 10800;
  const eps: EpSpec[] = [];
  const n = Math.floor(r() * 4);
  for (let j = 0; j < n; j++) eps.push({ ip: `10.${i}.${gen % 250}.${j + 1}`, local: r() < 0.4 });
  return { spec, eps, state: makeState(spec, eps) };
}

/** Applies a payload's nat chain declarations and deletions to a set of our service chains. */
function applyNat(model: Set<string>, payload: string): void {
  const nat = payload.slice(
    payload.indexOf("*nat\n"),
    payload.indexOf("COMMIT\n", payload.indexOf("*nat\n")),
  );
  for (const line of nat.split("\n")) {
    if (/^:KUBE-(SVC|SVL|EXT|FW|SEP)-/.test(line)) model.add(line.slice(1, line.indexOf(" ")));
    else if (line.startsWith("-X ")) model.delete(line.slice(3));
  }
}

function declaredServiceChains(payload: string): Set<string> {
  return new Set([...payload.matchAll(/^:(KUBE-(?:SVC|SVL|EXT|FW|SEP)-\S+) /gm)].map((m) => m[1]));
}

function linesOf(payload: string, table: string, prefix: RegExp): string[] {
  const start = payload.indexOf(`*${table}\n`);
  const body = payload.slice(start, payload.indexOf("COMMIT\n", start));
  return body.split("\n").filter((l) => prefix.test(l));
}

Deno.test("cached byte blocks: payloads under churn equal a fresh render, and chain deletions stay exact", async () => {
  const r = rng(7);
  const rec = recorder();
  const dp = newDp(rec);
  const live = new Map<number, Svc>();
  for (let i = 1; i <= 25; i++) live.set(i, svc(i, r, 0));
  let order = [...live.keys()];
  await dp.sync(snapshot(order.map((i) => live.get(i)!.state)));
  const model = new Set<string>();
  applyNat(model, restores(rec)[0]);
  let next = 26;

  for (let step = 1; step <= 60; step++) {
    const changed = new Set<string>();
    const ops = 1 + Math.floor(r() * 3);
    for (let k = 0; k < ops; k++) {
      const x = r();
      const ids = [...live.keys()];
      const id = ids[Math.floor(r() * ids.length)];
      if (x < 0.4 && id !== undefined) {
        // Endpoint change only: dispatch bytes stay the same.
        const s = live.get(id)!;
        const eps = s.eps.slice(1);
        eps.push({ ip: `10.${id}.${step % 250}.${100 + k}`, local: r() < 0.5 });
        live.set(id, { spec: s.spec, eps, state: makeState(s.spec, eps) });
        changed.add(`${s.spec.ns}/${s.spec.name}`);
      } else if (x < 0.6 && id !== undefined) {
        // Spec change (new cluster IP, maybe new type): dispatch bytes change.
        const s = svc(id, r, step);
        changed.add(`${live.get(id)!.spec.ns}/${live.get(id)!.spec.name}`);
        live.set(id, s);
        changed.add(`${s.spec.ns}/${s.spec.name}`);
      } else if (x < 0.75 && id !== undefined) {
        changed.add(`${live.get(id)!.spec.ns}/${live.get(id)!.spec.name}`);
        live.delete(id);
      } else if (x < 0.9) {
        const s = svc(next, r, step);
        live.set(next++, s);
        changed.add(`${s.spec.ns}/${s.spec.name}`);
      } else {
        // Reorder the snapshot (the cached sections must follow the order).
        order = order.slice().reverse();
      }
    }
    order = [...order.filter((i) => live.has(i)), ...[...live.keys()].filter((i) => !order.includes(i))];
    const states = order.map((i) => live.get(i)!.state);
    const full = step % 13 === 0;
    const res = await dp.sync(snapshot(states, { changed: full ? null : [...changed] }));
    assert.equal(res.full, full);
    const p = restores(rec).at(-1)!;
    applyNat(model, p);

    // What a dataplane that never saw the history renders for the same snapshot.
    const fresh = newDp();
    await fresh.sync(snapshot([]));
    const want = fresh.buildPayload(snapshot(states), true).text;
    const got = dp.buildPayload(snapshot(states), true).text;
    assert.equal(got, want, `step ${step}: full payload from cached blocks`);
    assert.deepEqual(model, declaredServiceChains(want), `step ${step}: chains in the kernel model`);
    for (const [table, re] of [["filter", /^-A KUBE-/], ["nat", /^-A KUBE-(SERVICES|NODEPORTS) /]] as const) {
      assert.deepEqual(linesOf(p, table, re), linesOf(want, table, re), `step ${step}: ${table} dispatch`);
    }
  }
});

/** Records the chunks iptables-restore was handed (copied as they arrive) and holds restores when asked. */
class ChunkRunner implements CommandRunner {
  readonly inner = recorder();
  chunks: number[][] = [];
  release: (() => void) | null = null;
  hold = false;

  async tryRun(spec: CommandSpec): Promise<CommandResult> {
    if (spec.cmd === "iptables-restore" && spec.stdin !== undefined && typeof spec.stdin !== "string") {
      const sizes: number[] = [];
      const parts: Uint8Array[] = [];
      for (const c of spec.stdin instanceof Uint8Array ? [spec.stdin] : spec.stdin) {
        sizes.push(c.length);
        parts.push(c.slice());
      }
      this.chunks.push(sizes);
      if (this.hold) await new Promise<void>((res) => this.release = res);
      return this.inner.tryRun({ ...spec, stdin: parts });
    }
    return this.inner.tryRun(spec);
  }

  async run(spec: CommandSpec): Promise<CommandResult> {
    const r = await this.tryRun(spec);
    if (r.code !== 0) throw new Error(r.stderr);
    return r;
  }
}

Deno.test("payload stream: iptables-restore gets bounded chunks that add up to the payload", async () => {
  const runner = new ChunkRunner();
  const dp = new IptablesDataplane({
    family: "IPv4",
    runner,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    conntrackTCPBeLiberal: false,
    chunkBytes: 4096,
  });
  const r = rng(3);
  const states = Array.from({ length: 120 }, (_, i) => svc(i + 1, r, 0).state);
  const res = await dp.sync(snapshot(states));
  const sizes = runner.chunks[0];
  assert.ok(sizes.length > 5, `streamed in ${sizes.length} chunks`);
  assert.ok(sizes.every((n) => n <= 4096), `chunks bounded: ${Math.max(...sizes)}`);
  const text = restores(runner.inner)[0];
  assert.equal(sizes.reduce((a, b) => a + b, 0), new TextEncoder().encode(text).length);
  assert.equal(res.payloadBytes, new TextEncoder().encode(text).length);
  assert.equal(dp.lastPayload!.text, text, "lastPayload renders the streamed bytes again");
  const fresh = newDp();
  await fresh.sync(snapshot([]));
  const noJumps = (t: string) => t.split("\n").filter((l) => !l.startsWith("-I ")).join("\n");
  assert.equal(noJumps(text), fresh.buildPayload(snapshot(states), true).text, "same as a one-piece build");
});

Deno.test("payload stream: no build while a sync streams; lastPayload stays the streamed payload", async () => {
  const runner = new ChunkRunner();
  const dp = newDp(runner);
  const a = makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.1" }, [{ ip: "10.0.0.1" }]);
  const b = makeState({ ns: "ns1", name: "b", clusterIP: "172.30.0.2" }, [{ ip: "10.0.0.2" }]);
  await dp.sync(snapshot([a, b]));
  runner.hold = true;
  const pending = dp.sync(snapshot([a, b]));
  await new Promise((res) => setTimeout(res, 0));
  assert.ok(runner.release, "restore is in flight");
  assert.throws(() => dp.buildPayload(snapshot([a]), true), /while a sync is streaming/);
  await assert.rejects(dp.sync(snapshot([a])), /while another sync is streaming/);
  runner.release!();
  await pending;
  const streamed = restores(runner.inner).at(-1)!;
  assert.ok(streamed.includes("ns1/b:p80"));
  const later = dp.buildPayload(snapshot([a]), true);
  assert.ok(!later.text.includes("ns1/b:p80"));
  assert.equal(dp.lastPayload!.text, streamed, "a later build does not change the last sync's payload");
});

Deno.test("a port removed in a failed sync has its chains deleted by the next (full) sync", async () => {
  let fail = false;
  const rec = recorder((c) =>
    c.cmd === "iptables-restore" && fail ? { code: 1, stderr: "iptables-restore: line 3 failed" } : undefined
  );
  const dp = newDp(rec);
  const a = makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.1" }, [{ ip: "10.0.0.1" }]);
  const b = makeState({ ns: "ns1", name: "b", clusterIP: "172.30.0.2" }, [{ ip: "10.0.0.2" }]);
  await dp.sync(snapshot([a, b]));
  const model = new Set<string>();
  applyNat(model, restores(rec)[0]);
  fail = true;
  await assert.rejects(dp.sync(snapshot([a], { changed: ["ns1/b"] })));
  fail = false;
  const res = await dp.sync(snapshot([a], { changed: [] }));
  assert.equal(res.full, true);
  const p = restores(rec).at(-1)!;
  applyNat(model, p);
  const fresh = newDp();
  await fresh.sync(snapshot([]));
  assert.deepEqual(model, declaredServiceChains(fresh.buildPayload(snapshot([a]), true).text));
  assert.equal(p.match(/^-X /gm)?.length, 2); // SVC and SEP of b
});

Deno.test("renderServicePort with the previous block (endpoint chain names lent) equals a fresh render", () => {
  const cfg = {
    family: "IPv4" as const,
    mark: "0x00004000",
    masqueradeAll: false,
    localDetector: detectLocalByCIDR("10.0.0.0/8"),
    localhostNodePorts: true,
    nodeIP: "192.168.0.2",
    nfacctInvalidDrop: false,
    nfacctLocalhostNodePorts: false,
  };
  const base: SvcSpec = { ns: "ns", name: "s", clusterIP: "172.30.0.9", nodePort: 30009 };
  const steps: [SvcSpec, EpSpec[]][] = [
    [base, [{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }, { ip: "10.1.0.3", local: true }]],
    [base, [{ ip: "10.1.0.2" }, { ip: "10.1.0.4" }, { ip: "10.1.0.3", local: true }]],
    [{ ...base, affinity: 10800 }, [{ ip: "10.1.0.0" }, { ip: "10.1.0.4" }, { ip: "10.1.0.9", local: true }]],
    [{ ...base, eTPLocal: true }, [{ ip: "10.1.0.4" }, { ip: "10.1.0.9", local: true }, { ip: "10.1.1.1" }]],
    [{ ...base, protocol: "UDP" }, [{ ip: "10.1.0.4" }, { ip: "10.1.1.1" }]],
    [base, []],
    [base, [{ ip: "10.1.0.4", ready: false, serving: true, terminating: true }, { ip: "10.1.2.2" }]],
  ];
  for (const large of [false, true]) {
    let prev: ServicePortBlock | undefined;
    for (const [spec, eps] of steps) {
      const st = makeState(spec, eps);
      const lent = renderServicePort(st, cfg, large, prev);
      const fresh = renderServicePort(st, cfg, large);
      assert.deepEqual(lent.chains, fresh.chains);
      assert.equal(renderChainRules(lent, cfg), renderChainRules(fresh, cfg));
      assert.equal(lent.chainRuleCount, fresh.chainRuleCount);
      assert.deepEqual(lent.dispatch, fresh.dispatch);
      prev = lent;
    }
  }
});
