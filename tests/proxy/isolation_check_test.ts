/**
 * Isolation with a check mode: the search runs in the kernel tool's check mode (`iptables-restore --test`,
 * `nft --check`) and the kernel sees one real sync, of exactly the accepted ports. The dataplanes are the real
 * ones; the tools are a recording runner that refuses any input holding the refused Service's IP.
 */
import assert from "node:assert/strict";
import { type RecordedCall, RecordingCommandRunner } from "../../lib/exec.ts";
import { configureLogging } from "../../lib/log.ts";
import { IptablesDataplane } from "../../lib/dataplane/iptables/dataplane.ts";
import { detectLocalByCIDR } from "../../lib/dataplane/iptables/local_detector.ts";
import { NftablesDataplane } from "../../lib/dataplane/nftables/dataplane.ts";
import { FakeClock } from "../../lib/proxy/clock.ts";
import { isolateRefused } from "../../lib/proxy/isolation.ts";
import { Proxier } from "../../lib/proxy/proxier.ts";
import type { Dataplane } from "../../lib/proxy/types.ts";
import { service, slice } from "./helpers.ts";

configureLogging({ sink: () => {} });

const REFUSED_IP = "10.96.0.66";
const GOOD = Array.from({ length: 9 }, (_, i) => `172.30.0.${i + 1}`);

Deno.test("isolateRefused() with a check: every attempt is a check, then one sync of exactly the accepted items", async () => {
  const checks: number[][] = [];
  const syncs: number[][] = [];
  const bad = new Set([3, 11]);
  const check = (items: readonly number[]) => {
    checks.push([...items]);
    const hit = items.find((n) => bad.has(n));
    return hit === undefined ? Promise.resolve() : Promise.reject(new Error(`refused ${hit}`));
  };
  const sync = (items: readonly number[]) => {
    syncs.push([...items]);
    return Promise.resolve(items.length);
  };
  const suspects = Array.from({ length: 16 }, (_, i) => i);
  const r = (await isolateRefused([100], suspects, new Error("first"), sync, { check }))!;
  assert.deepEqual(r.refused.map((x) => x.item), [3, 11]);
  assert.equal(syncs.length, 1, "one real sync");
  assert.deepEqual([...syncs[0]].sort((a, b) => a - b), [...suspects.filter((n) => !bad.has(n)), 100]);
  assert.equal(r.result, 15);
  assert.deepEqual(checks[0], [100], "the trusted items are checked alone first");
  assert.equal(r.attempts, checks.length + 1);
  assert.equal(r.realSyncs, 1);
});

Deno.test("isolateRefused() with a check falls back to real syncs when the real sync refuses what the check accepted", async () => {
  const check = () => Promise.resolve();
  const syncs: number[][] = [];
  const sync = (items: readonly number[]) => {
    syncs.push([...items]);
    return items.includes(2) ? Promise.reject(new Error("kernel says no")) : Promise.resolve(items.length);
  };
  const r = (await isolateRefused([1], [2, 3], new Error("first"), sync, { check }))!;
  assert.deepEqual(r.refused.map((x) => x.item), [2]);
  assert.deepEqual(r.accepted, [1, 3]);
  assert.deepEqual(syncs.at(-1), [1, 3]);
  assert.ok(r.realSyncs > 1);
  // Trusted items refused by the check: not the suspects' fault, nothing synced.
  const none: number[][] = [];
  const failing = () => Promise.reject(new Error("no tool"));
  assert.equal(
    await isolateRefused([1], [2], new Error("x"), (i) => (none.push([...i]), Promise.resolve(0)), {
      check: failing,
    }),
    null,
  );
  assert.deepEqual(none, []);
});

/** The IPs of the Services a payload programs (the clusterIPs of this test, never an endpoint's). */
function serviceIPs(payload: string): string[] {
  const found = new Set<string>();
  for (const m of payload.matchAll(/\b(172\.30\.0\.\d+|10\.96\.0\.66)\b/g)) found.add(m[1]);
  return [...found].sort();
}

const NFT_EMPTY_JSON = JSON.stringify({ nftables: [{ metainfo: { json_schema_version: 1 } }] });

/** Tools that refuse input holding REFUSED_IP, in their real and check modes alike. */
function refusingTools(): RecordingCommandRunner {
  return new RecordingCommandRunner((c: RecordedCall) => {
    if (c.cmd === "sysctl" && c.args[0] === "-n") return { stdout: "0\n" };
    if (c.cmd === "nft" && c.args.includes("--json")) return { stdout: NFT_EMPTY_JSON };
    if (c.stdin.includes(REFUSED_IP)) {
      return c.cmd === "nft"
        ? { code: 1, stderr: "/dev/stdin:40:1-20: Error: Could not process rule: Invalid argument\n" }
        : { code: 1, stderr: "iptables-restore: line 40 failed\n" };
    }
    return undefined;
  });
}

interface Mode {
  name: string;
  dataplane: (r: RecordingCommandRunner) => Dataplane;
  /** Whether a call hands a payload to the tool, and whether in check mode. */
  kind: (c: RecordedCall) => "real" | "check" | null;
  /** Whether a payload is a full sync's (iptables: the mangle canary; nftables: the table itself). */
  isFull: (payload: string) => boolean;
}

const MODES: Mode[] = [
  {
    name: "iptables",
    dataplane: (r) =>
      new IptablesDataplane({
        family: "IPv4",
        runner: r,
        localDetector: detectLocalByCIDR("10.0.0.0/8"),
        nfacct: null,
      }),
    kind: (c) => c.cmd !== "iptables-restore" ? null : c.args.includes("--test") ? "check" : "real",
    isFull: (p) => p.includes("*mangle"),
  },
  {
    name: "nftables",
    dataplane: (r) =>
      new NftablesDataplane({
        family: "IPv4",
        runner: r,
        localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
        nodeAddresses: ["192.168.0.2"],
      }),
    kind: (c) =>
      c.cmd !== "nft" || !c.args.includes("-f")
        ? null
        : c.args.includes("--check") || c.args.includes("-c")
        ? "check"
        : "real",
    isFull: (p) => /^add table ip kube-proxy/m.test(p),
  },
];

for (const mode of MODES) {
  Deno.test(`${mode.name}: a refused Service on the first sync is isolated with checks only; one real sync carries exactly the accepted ports`, async () => {
    const clock = new FakeClock(Date.parse("2026-01-01T00:00:00Z"));
    const tools = refusingTools();
    const quarantined: string[] = [];
    const proxier = new Proxier({
      families: new Map([["IPv4", mode.dataplane(tools)]]),
      nodeName: "host1",
      minSyncPeriodMs: 1000,
      syncPeriodMs: 30_000,
      fullSyncPeriodMs: 3_600_000,
      clock,
      onQuarantine: (p) => quarantined.push(p.nameString),
    });
    GOOD.forEach((ip, i) => {
      proxier.onServiceAdd(service("ns", `good${i}`, { clusterIP: ip, clusterIPs: [ip] }));
      proxier.onEndpointSliceAdd(slice("ns", `good${i}`, `good${i}-1`, [{ addresses: [`10.0.1.${i + 1}`] }]));
    });
    proxier.onServiceAdd(service("ns", "refused", { clusterIP: REFUSED_IP, clusterIPs: [REFUSED_IP] }));
    proxier.onEndpointSliceAdd(slice("ns", "refused", "refused-1", [{ addresses: ["10.0.2.1"] }]));
    proxier.onServicesSynced();
    proxier.onEndpointSlicesSynced();
    proxier.start();
    await clock.advance(0);

    assert.deepEqual(quarantined, ["ns/refused:p80"]);
    const payloads = tools.calls.filter((c) => mode.kind(c) !== null);
    const real = payloads.filter((c) => mode.kind(c) === "real");
    const checks = payloads.filter((c) => mode.kind(c) === "check");
    // The sync as asked for (every port: refused), then the search in check mode only, then one real sync.
    assert.equal(real.length, 2, `real syncs: ${real.map((c) => serviceIPs(c.stdin).length).join(", ")}`);
    assert.equal(mode.kind(payloads[0]), "real");
    assert.equal(mode.kind(payloads.at(-1)!), "real");
    assert.deepEqual(serviceIPs(real[0].stdin), [...GOOD, REFUSED_IP].sort());
    assert.deepEqual(serviceIPs(real[1].stdin), [...GOOD].sort(), "exactly the accepted ports");
    assert.ok(checks.length >= 2, `checks: ${checks.length}`);
    assert.deepEqual(
      serviceIPs(checks[0].stdin),
      [],
      "every port is a suspect after a restart: none trusted",
    );
    assert.ok(
      checks.some((c) => c.stdin.includes(REFUSED_IP)),
      "the refused port was singled out by a check",
    );

    // Nothing of the check leaked into the dataplane's bookkeeping: the next change is a partial sync.
    const before = tools.calls.length;
    proxier.onServiceAdd(service("ns", "later", { clusterIP: "172.30.0.50", clusterIPs: ["172.30.0.50"] }));
    proxier.onEndpointSliceAdd(slice("ns", "later", "later-1", [{ addresses: ["10.0.3.1"] }]));
    await clock.advance(1000);
    const next = tools.calls.slice(before).filter((c) => mode.kind(c) !== null);
    assert.equal(next.length, 1);
    assert.equal(mode.kind(next[0]), "real");
    assert.ok(next[0].stdin.includes("172.30.0.50"));
    assert.equal(mode.isFull(next[0].stdin), false, "a partial sync");
    assert.equal(mode.isFull(real[1].stdin), true);
    await proxier.stop();
  });
}
