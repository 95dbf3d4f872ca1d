/**
 * NftablesDataplane sync behaviour with a recording runner: what a partial sync's transaction holds (only the
 * changed objects, no listing), stale chains flushed then deleted later, shared elements, failures.
 */
import assert from "node:assert/strict";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { type RecordedCall, RecordingCommandRunner } from "../../../lib/exec.ts";
import { configureLogging } from "../../../lib/log.ts";
import type { ServicePortState } from "../../../lib/proxy/types.ts";
import { type EpSpec, makeState, snapshot, type SvcSpec } from "../../../testkit/fixtures.ts";

configureLogging({ sink: () => {} });

function setup(fail?: (c: RecordedCall) => boolean) {
  let clock = 1_000_000;
  const r = new RecordingCommandRunner((c) => {
    if (fail?.(c)) {
      return { code: 1, stderr: "/dev/stdin:3:1-10: Error: Could not process rule: No such file" };
    }
    if (c.cmd === "nft" && c.args[0] === "-j") return { stdout: '{"nftables":[]}' };
    if (c.cmd === "nft" && c.args[0] === "list") return { stdout: "table ip kube-proxy\n" };
    return undefined;
  });
  const dp = new NftablesDataplane({
    family: "IPv4",
    runner: r,
    localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
    nodePortAddresses: ["primary"],
    nodeAddresses: ["192.168.0.2"],
    now: () => clock,
  });
  return { r, dp, advance: (ms: number) => (clock += ms) };
}

const web = (eps: EpSpec[], over: Partial<SvcSpec> = {}) =>
  makeState({ ns: "ns1", name: "web", clusterIP: "172.30.0.10", ...over }, eps);
const db = (eps: EpSpec[]) =>
  makeState({ ns: "ns1", name: "db", clusterIP: "172.30.0.20", nodePort: 30020 }, eps);

/** The lines of the last `nft -f -` transaction. */
function lastTx(r: RecordingCommandRunner): string[] {
  const txs = r.calls.filter((c) => c.cmd === "nft" && c.args[0] === "-f");
  return txs[txs.length - 1].stdin.split("\n").filter((l) => l !== "");
}

function sync(dp: NftablesDataplane, states: ServicePortState[], changed?: string[]) {
  return dp.sync(snapshot(states, { changed: changed ?? null }));
}

Deno.test("first sync is full: the fixed layout, every port, one listing of chains and sets", async () => {
  const { r, dp } = setup();
  const res = await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])]);
  assert.equal(res.full, true);
  assert.deepEqual(r.calls.map((c) => [c.cmd, ...c.args].join(" ")), [
    "nft -j list chains ip",
    "nft -j list sets ip",
    "nft -f -",
  ]);
  const tx = lastTx(r);
  assert.ok(tx.includes('add table ip kube-proxy { comment "rules for kube-proxy" ; }'));
  assert.ok(tx.includes("flush map ip kube-proxy service-ips"), "maps are refilled, not listed");
  assert.ok(tx.includes(
    "add element ip kube-proxy service-nodeports { tcp . 30020 : goto external-" +
      tx.find((l) => l.startsWith("add chain ip kube-proxy external-"))!.split("external-")[1] + " }",
  ));
});

Deno.test("a changed endpoint rewrites only that Service's chains: no listing, no element change", async () => {
  const { r, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }]), db([{ ip: "10.1.0.9" }])]);
  const before = r.calls.length;
  const res = await sync(dp, [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.3" }]), db([{ ip: "10.1.0.9" }])], [
    "ns1/web",
  ]);
  assert.equal(res.full, false);
  assert.deepEqual(r.calls.slice(before).map((c) => [c.cmd, ...c.args].join(" ")), ["nft -f -"]);
  const tx = lastTx(r);
  assert.ok(!tx.some((l) => l.includes("ns1/db")), "the unchanged Service is not touched");
  assert.ok(!tx.some((l) => l.includes("element")), "the service-ips element still points at the same chain");
  assert.ok(
    !tx.some((l) => /^(add|flush) chain \S+ \S+ endpoint-\S+__10\.1\.0\.1\/80$/.test(l)),
    "an unchanged endpoint chain stays as it is",
  );
  // The service chain is rewritten with the new vmap; the new endpoint chain is created; the old one emptied.
  const svc = tx.filter((l) => l.startsWith("add rule ip kube-proxy service-"));
  assert.equal(svc.length, 2);
  assert.match(
    svc[1],
    /numgen random mod 2 vmap \{ 0 : goto endpoint-\S+__10\.1\.0\.1\/80 , 1 : goto endpoint-\S+__10\.1\.0\.3\/80 \}/,
  );
  assert.ok(tx.some((l) => /^add chain ip kube-proxy endpoint-\S+__10\.1\.0\.3\/80$/.test(l)));
  assert.ok(tx.some((l) => /^flush chain ip kube-proxy endpoint-\S+__10\.1\.0\.2\/80$/.test(l)));
  assert.ok(!tx.some((l) => l.startsWith("delete chain")), "stale chains are deleted later, not now");
});

Deno.test("stale chains are deleted in a transaction of their own, a second later", async () => {
  const { r, dp, advance } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.9" }])]);
  await sync(dp, [web([{ ip: "10.1.0.1" }])], ["ns1/db"]);
  const afterRemoval = r.calls.length;
  let tx = lastTx(r);
  assert.ok(tx.includes("delete element ip kube-proxy service-nodeports { tcp . 30020 }"));
  assert.ok(tx.includes("delete element ip kube-proxy cluster-ips { 172.30.0.20 }"));
  const flushed = tx.filter((l) => l.startsWith("flush chain")).map((l) => l.split(" ")[4]);
  assert.deepEqual(flushed.map((c) => c.split("-")[0]).sort(), ["endpoint", "external", "service"]);
  // Within a second nothing is deleted.
  advance(500);
  assert.equal(await dp.needsFullSync(), false);
  assert.ok(!r.calls.slice(afterRemoval).some((c) => c.stdin.includes("delete chain")));
  advance(600);
  assert.equal(await dp.needsFullSync(), false);
  tx = lastTx(r);
  assert.deepEqual(tx.map((l) => l.split(" ").slice(0, 2).join(" ")), Array(3).fill("delete chain"));
  assert.deepEqual(tx.map((l) => l.split(" ")[4]).sort(), [...flushed].sort());
});

Deno.test("a ClusterIP shared by two ports stays while one port remains", async () => {
  const { r, dp } = setup();
  const p80 = web([{ ip: "10.1.0.1" }]);
  const p443 = web([{ ip: "10.1.0.1", port: 443 }], { port: "p443", portNum: 443 });
  await sync(dp, [p80, p443]);
  assert.equal(
    lastTx(r).filter((l) => l === "add element ip kube-proxy cluster-ips { 172.30.0.10 }").length,
    1,
  );
  await sync(dp, [p443], ["ns1/web"]);
  const tx = lastTx(r);
  assert.ok(!tx.some((l) => l.includes("cluster-ips")), tx.join("\n"));
  assert.ok(tx.includes("delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }"));
  await sync(dp, [], ["ns1/web"]);
  assert.ok(lastTx(r).includes("delete element ip kube-proxy cluster-ips { 172.30.0.10 }"));
});

Deno.test("losing every endpoint moves the ClusterIP from service-ips to no-endpoint-services (reject)", async () => {
  const { r, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }])]);
  await sync(dp, [web([])], ["ns1/web"]);
  const tx = lastTx(r);
  assert.ok(tx.includes("delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }"));
  assert.ok(tx.includes(
    'add element ip kube-proxy no-endpoint-services { 172.30.0.10 . tcp . 80 comment "ns1/web:p80" : goto reject-chain }',
  ));
});

Deno.test("enabling session affinity adds the sets before the rules that use them; a timeout change re-creates them", async () => {
  const { r, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }])]);
  await sync(dp, [web([{ ip: "10.1.0.1" }], { affinity: 60 })], ["ns1/web"]);
  let tx = lastTx(r);
  const addSet = tx.findIndex((l) => l.startsWith("add set ip kube-proxy affinity-"));
  const useSet = tx.findIndex((l) => l.includes("saddr @affinity-"));
  assert.ok(addSet >= 0 && useSet > addSet, tx.join("\n"));
  assert.match(tx[addSet], /\{ type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; \}$/);
  await sync(dp, [web([{ ip: "10.1.0.1" }], { affinity: 120 })], ["ns1/web"]);
  tx = lastTx(r);
  const flush = tx.findIndex((l) => l.startsWith("flush chain ip kube-proxy endpoint-"));
  const del = tx.findIndex((l) => l.startsWith("delete set ip kube-proxy affinity-"));
  const add = tx.findIndex((l) => l.startsWith("add set ip kube-proxy affinity-"));
  assert.ok(flush >= 0 && del > flush && add > del, tx.join("\n"));
  assert.match(tx[add], /timeout 120s/);
});

Deno.test("a failed transaction rejects, counts, and the next sync is full again", async () => {
  let failing = true;
  const { r, dp } = setup((c) =>
    failing && c.cmd === "nft" && c.args[0] === "-f" && c.stdin.includes("ns1/db")
  );
  await assert.rejects(() => sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])]));
  failing = false;
  assert.equal(await dp.needsFullSync(), false, "nothing synced yet");
  const res = await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])], ["ns1/web"]);
  assert.equal(res.full, true);
  assert.ok(lastTx(r)[0].startsWith("add table ip kube-proxy"));
});

Deno.test("ServiceCIDRs are written on a full sync when they change", async () => {
  const { r, dp } = setup();
  await dp.sync(snapshot([web([{ ip: "10.1.0.1" }])], { serviceCIDRs: ["172.30.0.0/16"] }));
  assert.ok(
    lastTx(r).some((l) =>
      l.includes('ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"')
    ),
  );
  const res = await dp.sync(
    snapshot([web([{ ip: "10.1.0.1" }])], { serviceCIDRs: ["172.30.0.0/16", "172.31.0.0/16"], changed: [] }),
  );
  assert.equal(res.full, true);
  assert.ok(lastTx(r).some((l) => l.includes("ip daddr { 172.30.0.0/16,172.31.0.0/16 } drop")));
});
