/**
 * NftablesDataplane sync behaviour against the in-memory FakeNftables (exact, no root): what a partial sync's
 * transaction holds (only the changed objects, no listing), stale chains flushed then deleted later, shared
 * elements, failures; and that what the fake then holds is what a full sync from scratch would write.
 */
import assert from "node:assert/strict";
import { NftablesDataplane } from "../../../lib/dataplane/nftables/dataplane.ts";
import { FakeNftables, NftablesError, type Transaction } from "../../../lib/dataplane/nftables/mod.ts";
import { RecordingCommandRunner } from "../../../lib/exec.ts";
import { configureLogging } from "../../../lib/log.ts";
import type { ServicePortState } from "../../../lib/proxy/types.ts";
import { type EpSpec, makeState, snapshot, type SvcSpec } from "../../../testkit/fixtures.ts";
import { normalizeNftTable } from "../../../testkit/rule_parity.ts";

configureLogging({ sink: () => {} });

/** The fake kernel, counting the listings the dataplane makes and failing transactions on demand. */
class Kernel extends FakeNftables {
  lists: string[] = [];
  transactions: string[] = [];
  failIf: ((tx: string) => boolean) | null = null;

  constructor() {
    super("ip", "kube-proxy");
  }

  override list(type: Parameters<FakeNftables["list"]>[0]): Promise<string[]> {
    this.lists.push(type);
    return super.list(type);
  }

  override run(tx: Transaction): Promise<void> {
    const text = tx.toString();
    this.transactions.push(text);
    if (this.failIf?.(text)) return Promise.reject(new NftablesError("injected failure", { code: "ENOENT" }));
    return super.run(tx);
  }

  /** The lines of the last transaction. */
  get last(): string[] {
    return this.transactions[this.transactions.length - 1].split("\n").filter((l) => l !== "");
  }
}

function setup(kernel = new Kernel(), precreatePorts?: number) {
  let clock = 1_000_000;
  const dp = new NftablesDataplane({
    ...(precreatePorts !== undefined ? { precreatePorts } : {}),
    family: "IPv4",
    runner: new RecordingCommandRunner(),
    nftables: kernel,
    localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
    nodePortAddresses: ["primary"],
    nodeAddresses: ["192.168.0.2"],
    now: () => clock,
  });
  return { kernel, dp, advance: (ms: number) => (clock += ms) };
}

/**
 * What the fake holds after a full sync of `states` from scratch, normalized as the parity test does (objects
 * by name, elements sorted, emptied per-service chains waiting for deletion left out).
 */
async function freshDump(states: ServicePortState[]): Promise<string[]> {
  const { kernel, dp } = setup();
  await dp.sync(snapshot(states));
  return normalizeNftTable(kernel.dump());
}

const web = (eps: EpSpec[], over: Partial<SvcSpec> = {}) =>
  makeState({ ns: "ns1", name: "web", clusterIP: "172.30.0.10", ...over }, eps);
const db = (eps: EpSpec[], over: Partial<SvcSpec> = {}) =>
  makeState({ ns: "ns1", name: "db", clusterIP: "172.30.0.20", nodePort: 30020, ...over }, eps);
/** Session affinity: the only Services with per-endpoint chains in v1.37's layout. */
const STICKY = { affinity: 60 };

function sync(dp: NftablesDataplane, states: ServicePortState[], changed?: string[]) {
  return dp.sync(snapshot(states, { changed: changed ?? null }));
}

Deno.test("first sync is full: the fixed layout, every port, one listing of what exists", async () => {
  const { kernel, dp } = setup();
  const res = await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])]);
  assert.equal(res.full, true);
  assert.deepEqual(kernel.lists, ["chain"], "one listing (no table yet, so no sets to list)");
  assert.equal(kernel.transactions.length, 1);
  const tx = kernel.last;
  assert.ok(tx.includes('add table ip kube-proxy { comment "rules for kube-proxy" ; }'));
  assert.ok(tx.includes("flush map ip kube-proxy service-ips"), "maps are refilled, not listed");
  const external = tx.find((l) => l.startsWith("add chain ip kube-proxy external-"))!.split(" ")[4];
  assert.ok(tx.includes(`add element ip kube-proxy service-nodeports { tcp . 30020 : goto ${external} }`));
  assert.ok(!tx.some((l) => l.includes(" endpoint-")), "no per-endpoint chains without session affinity");
  assert.match(
    kernel.dump(),
    new RegExp(
      "chain services \\{\n\t\tip daddr @cluster-ips ip saddr != 10\\.0\\.0\\.0/8 meta mark set meta mark \\| " +
        '0x00004000 comment "masquerade clusterIP traffic from outside cluster"\n' +
        "\t\tip daddr \\. meta l4proto \\. th dport vmap @service-ips\n",
    ),
  );
});

Deno.test("a changed endpoint rewrites only that Service's chain, its DNAT map: no listing, no element change", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }]), db([{ ip: "10.1.0.9" }])]);
  const after = [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.3" }]), db([{ ip: "10.1.0.9" }])];
  const res = await sync(dp, after, ["ns1/web"]);
  assert.equal(res.full, false);
  assert.deepEqual(kernel.lists, ["chain"], "no listing on a partial sync");
  const tx = kernel.last;
  assert.ok(!tx.some((l) => l.includes("ns1/db")), "the unchanged Service is not touched");
  assert.ok(!tx.some((l) => l.includes("element")), "the service-ips element still points at the same chain");
  const svc = tx.filter((l) => l.startsWith("add rule ip kube-proxy service-"));
  assert.equal(svc.length, 1);
  assert.match(
    svc[0],
    / meta l4proto tcp dnat ip addr \. port to numgen random mod 2 map \{ 0 : 10\.1\.0\.1 \. 80 , 1 : 10\.1\.0\.3 \. 80 \}$/,
  );
  assert.ok(!tx.some((l) => l.includes(" endpoint-") || l.startsWith("delete")), tx.join("\n"));
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump(after));
  // Down to one endpoint: a plain dnat, no map.
  const one = [web([{ ip: "10.1.0.3" }]), db([{ ip: "10.1.0.9" }])];
  await sync(dp, one, ["ns1/web"]);
  assert.deepEqual(
    kernel.last.filter((l) => l.startsWith("add rule")).map((l) => l.split(" ").slice(5).join(" ")),
    [
      "meta l4proto tcp dnat to 10.1.0.3:80",
    ],
  );
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump(one));
});

Deno.test("an endpoint on this node is in hairpin-connections while it is used", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1", local: true }, { ip: "10.1.0.2" }])]);
  assert.ok(
    kernel.last.includes("add element ip kube-proxy hairpin-connections { 10.1.0.1 . 10.1.0.1 . tcp . 80 }"),
  );
  assert.ok(!kernel.last.some((l) => l.includes("hairpin-connections { 10.1.0.2")), "only local endpoints");
  // The same endpoint in a second Service on the same port: one element, kept while either uses it.
  const other = makeState({ ns: "ns1", name: "other", clusterIP: "172.30.0.50" }, [{
    ip: "10.1.0.1",
    local: true,
  }]);
  await sync(dp, [web([{ ip: "10.1.0.1", local: true }, { ip: "10.1.0.2" }]), other], ["ns1/other"]);
  assert.ok(!kernel.last.some((l) => l.includes("hairpin-connections")), kernel.last.join("\n"));
  await sync(dp, [web([{ ip: "10.1.0.2" }]), other], ["ns1/web"]);
  assert.ok(!kernel.last.some((l) => l.includes("hairpin-connections")), kernel.last.join("\n"));
  await sync(dp, [web([{ ip: "10.1.0.2" }])], ["ns1/other"]);
  assert.ok(
    kernel.last.includes(
      "delete element ip kube-proxy hairpin-connections { 10.1.0.1 . 10.1.0.1 . tcp . 80 }",
    ),
  );
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([web([{ ip: "10.1.0.2" }])]));
});

Deno.test("a Service at the API's name limits without endpoints: its element comment is cut to 128 bytes", async () => {
  const { kernel, dp } = setup();
  const long = makeState({
    ns: "n".repeat(63),
    name: "s".repeat(63),
    clusterIP: "172.30.0.60",
    port: "p".repeat(15),
  }, []);
  await sync(dp, [long, web([{ ip: "10.1.0.1" }])]);
  const el = kernel.last.find((l) => l.startsWith("add element ip kube-proxy no-endpoint-services"))!;
  const comment = /comment "([^"]*)"/.exec(el)![1];
  assert.equal(comment, `${"n".repeat(63)}/${"s".repeat(63)}:${"p".repeat(15)}`.slice(0, 128));
  assert.match(kernel.dump(), /172\.30\.0\.10 \. tcp \. 80 : goto service-/, "the other Service is served");
});

Deno.test("with session affinity a changed endpoint rewrites only that Service's chains: no listing, no element change", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }], STICKY), db([{ ip: "10.1.0.9" }])]);
  const after = [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.3" }], STICKY), db([{ ip: "10.1.0.9" }])];
  const res = await sync(dp, after, ["ns1/web"]);
  assert.equal(res.full, false);
  assert.deepEqual(kernel.lists, ["chain"], "no listing on a partial sync");
  const tx = kernel.last;
  assert.ok(!tx.some((l) => l.includes("ns1/db")), "the unchanged Service is not touched");
  assert.ok(!tx.some((l) => l.includes("element")), "the service-ips element still points at the same chain");
  assert.ok(
    !tx.some((l) => /^(add|flush) chain \S+ \S+ endpoint-\S+__10\.1\.0\.1\/80$/.test(l)),
    "an unchanged endpoint chain stays as it is",
  );
  // The service chain is rewritten with the new vmap; the new endpoint chain is created; the old one emptied.
  const svc = tx.filter((l) => l.startsWith("add rule ip kube-proxy service-"));
  assert.equal(svc.length, 3);
  assert.match(
    svc[2],
    /numgen random mod 2 vmap \{ 0 : goto endpoint-\S+__10\.1\.0\.1\/80 , 1 : goto endpoint-\S+__10\.1\.0\.3\/80 \}/,
  );
  assert.ok(tx.some((l) => /^add chain ip kube-proxy endpoint-\S+__10\.1\.0\.3\/80$/.test(l)));
  assert.ok(tx.some((l) => /^flush chain ip kube-proxy endpoint-\S+__10\.1\.0\.2\/80$/.test(l)));
  assert.ok(!tx.some((l) => l.startsWith("delete chain")), "stale chains are deleted later, not now");
  // Apart from the emptied chain waiting for deletion, the fake holds what a fresh full sync writes.
  const emptied = /\tchain endpoint-\S+__10\.1\.0\.2\/80 \{\n\t\}\n/;
  assert.match(kernel.dump(), emptied);
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump(after));
});

Deno.test("stale chains are deleted in a transaction of their own, a second later", async () => {
  const { kernel, dp, advance } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.9" }])]);
  await sync(dp, [web([{ ip: "10.1.0.1" }])], ["ns1/db"]);
  const afterRemoval = kernel.transactions.length;
  let tx = kernel.last;
  assert.ok(tx.includes("delete element ip kube-proxy service-nodeports { tcp . 30020 }"));
  assert.ok(tx.includes("delete element ip kube-proxy cluster-ips { 172.30.0.20 }"));
  const flushed = tx.filter((l) => l.startsWith("flush chain")).map((l) => l.split(" ")[4]);
  assert.deepEqual(flushed.map((c) => c.split("-")[0]).sort(), ["external", "service"]);
  // Within a second nothing is deleted.
  advance(500);
  assert.equal(await dp.needsFullSync(), false);
  assert.equal(kernel.transactions.length, afterRemoval);
  advance(600);
  assert.equal(await dp.needsFullSync(), false);
  tx = kernel.last;
  assert.deepEqual(tx.map((l) => l.split(" ").slice(0, 2).join(" ")), Array(2).fill("delete chain"));
  assert.deepEqual(tx.map((l) => l.split(" ")[4]).sort(), [...flushed].sort());
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([web([{ ip: "10.1.0.1" }])]));
});

Deno.test("a ClusterIP shared by two ports stays while one port remains", async () => {
  const { kernel, dp } = setup();
  const p80 = web([{ ip: "10.1.0.1" }]);
  const p443 = web([{ ip: "10.1.0.1", port: 443 }], { port: "p443", portNum: 443 });
  await sync(dp, [p80, p443]);
  assert.equal(
    kernel.last.filter((l) => l === "add element ip kube-proxy cluster-ips { 172.30.0.10 }").length,
    1,
  );
  await sync(dp, [p443], ["ns1/web"]);
  const tx = kernel.last;
  assert.ok(!tx.some((l) => l.includes("cluster-ips")), tx.join("\n"));
  assert.ok(tx.includes("delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }"));
  assert.match(kernel.dump(), /set cluster-ips \{[^}]*elements = \{ 172\.30\.0\.10 \}/);
  await sync(dp, [], ["ns1/web"]);
  assert.ok(kernel.last.includes("delete element ip kube-proxy cluster-ips { 172.30.0.10 }"));
});

Deno.test("losing every endpoint moves the ClusterIP from service-ips to no-endpoint-services (reject)", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }])]);
  await sync(dp, [web([])], ["ns1/web"]);
  const tx = kernel.last;
  assert.ok(tx.includes("delete element ip kube-proxy service-ips { 172.30.0.10 . tcp . 80 }"));
  assert.ok(tx.includes(
    'add element ip kube-proxy no-endpoint-services { 172.30.0.10 . tcp . 80 comment "ns1/web:p80" : goto reject-chain }',
  ));
});

Deno.test("enabling session affinity adds the sets before the rules that use them; a timeout change re-creates them", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }])]);
  await sync(dp, [web([{ ip: "10.1.0.1" }], { affinity: 60 })], ["ns1/web"]);
  let tx = kernel.last;
  const addSet = tx.findIndex((l) => l.startsWith("add set ip kube-proxy affinity-"));
  const useSet = tx.findIndex((l) => l.includes("saddr @affinity-"));
  assert.ok(addSet >= 0 && useSet > addSet, tx.join("\n"));
  assert.match(tx[addSet], /\{ type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; \}$/);
  await sync(dp, [web([{ ip: "10.1.0.1" }], { affinity: 120 })], ["ns1/web"]);
  tx = kernel.last;
  const flush = tx.findIndex((l) => l.startsWith("flush chain ip kube-proxy endpoint-"));
  const del = tx.findIndex((l) => l.startsWith("delete set ip kube-proxy affinity-"));
  const add = tx.findIndex((l) => l.startsWith("add set ip kube-proxy affinity-"));
  assert.ok(flush >= 0 && del > flush && add > del, tx.join("\n"));
  assert.match(tx[add], /timeout 120s/);
  assert.deepEqual(
    normalizeNftTable(kernel.dump()),
    await freshDump([web([{ ip: "10.1.0.1" }], { affinity: 120 })]),
  );
});

Deno.test("a failed transaction rejects, counts, and the next sync is full again", async () => {
  const { kernel, dp } = setup();
  kernel.failIf = (tx) => tx.includes("ns1/db");
  await assert.rejects(() => sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])]));
  kernel.failIf = null;
  assert.equal(await dp.needsFullSync(), false, "nothing synced yet");
  const res = await sync(dp, [web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])], ["ns1/web"]);
  assert.equal(res.full, true);
  assert.ok(kernel.last[0].startsWith("add table ip kube-proxy"));
});

Deno.test("a table deleted behind the agent's back makes the next sync full", async () => {
  const { kernel, dp } = setup();
  await sync(dp, [web([{ ip: "10.1.0.1" }])]);
  assert.equal(await dp.needsFullSync(), false);
  await kernel.deleteTable();
  assert.equal(await dp.needsFullSync(), true);
  await sync(dp, [web([{ ip: "10.1.0.1" }])], ["ns1/web"]);
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([web([{ ip: "10.1.0.1" }])]));
});

Deno.test("ServiceCIDRs are written on a full sync when they change", async () => {
  const { kernel, dp } = setup();
  await dp.sync(snapshot([web([{ ip: "10.1.0.1" }])], { serviceCIDRs: ["172.30.0.0/16"] }));
  assert.ok(
    kernel.last.some((l) =>
      l.includes('ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"')
    ),
  );
  const res = await dp.sync(
    snapshot([web([{ ip: "10.1.0.1" }])], { serviceCIDRs: ["172.30.0.0/16", "172.31.0.0/16"], changed: [] }),
  );
  assert.equal(res.full, true);
  assert.ok(kernel.last.some((l) => l.includes("ip daddr { 172.30.0.0/16,172.31.0.0/16 } drop")));
});

Deno.test("after a restart the first full sync rewrites every chain, deletes v1.35's mark-for-masquerade, empties leftovers and deletes them a second later", async () => {
  const kernel = new Kernel();
  const old = (eps: EpSpec[]) =>
    makeState({ ns: "ns1", name: "old", clusterIP: "172.30.0.30", affinity: 30 }, eps);
  const sticky = (eps: EpSpec[]) =>
    makeState({ ns: "ns1", name: "db", clusterIP: "172.30.0.20", affinity: 60 }, eps);
  await setup(kernel).dp.sync(
    snapshot([
      web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }]),
      sticky([{ ip: "10.1.0.9" }]),
      old([{ ip: "10.1.0.5" }]),
    ]),
  );
  // What v1.35's layout leaves besides: the masquerade helper chain and an endpoint chain jumping to it.
  const v135 = kernel.newTransaction();
  const legacyEp = "endpoint-AAAAAAAA-ns1/web/tcp/p80__10.1.0.1/80";
  v135.add({ kind: "chain", name: "mark-for-masquerade" });
  v135.add({ kind: "rule", chain: "mark-for-masquerade", rule: "mark set mark or 0x4000" });
  v135.add({ kind: "chain", name: legacyEp });
  v135.add({ kind: "rule", chain: legacyEp, rule: "ip saddr 10.1.0.1 jump mark-for-masquerade" });
  v135.add({ kind: "rule", chain: legacyEp, rule: "meta l4proto tcp dnat to 10.1.0.1:80" });
  await kernel.run(v135);
  // A new process on the same table.
  const { dp, advance } = setup(kernel);
  const after = [web([{ ip: "10.1.0.1" }, { ip: "10.1.0.3" }]), sticky([{ ip: "10.1.0.9" }])];
  await dp.sync(snapshot(after));
  const tx = kernel.last;
  const at = (re: RegExp) => tx.findIndex((l) => re.test(l));
  // The helper goes once every chain that could jump to it is emptied.
  const flushLegacy = at(new RegExp(`^flush chain ip kube-proxy ${legacyEp.replaceAll(".", "\\.")}$`));
  const delHelper = at(/^delete chain ip kube-proxy mark-for-masquerade$/);
  assert.ok(flushLegacy >= 0 && delHelper > flushLegacy, tx.join("\n"));
  assert.ok(
    at(/^add rule ip kube-proxy service-\S+web\S+ meta l4proto tcp dnat ip addr \. port to numgen /) >= 0,
  );
  // The sticky Service's endpoint chain uses its affinity set, which is re-created: emptied first.
  const flushSticky = at(/^flush chain ip kube-proxy endpoint-\S+db\S+__10\.1\.0\.9\/80$/);
  const delSet = at(/^delete set ip kube-proxy affinity-\S+db\S+__10\.1\.0\.9\/80$/);
  const addSet = at(/^add set ip kube-proxy affinity-\S+db\S+__10\.1\.0\.9\/80 /);
  const useSet = at(/^add rule ip kube-proxy endpoint-\S+db\S+ update @affinity-/);
  assert.ok(flushSticky >= 0 && flushSticky < delSet && delSet < addSet && addSet < useSet, tx.join("\n"));
  // Leftovers: emptied, not deleted yet; the gone Service's affinity set goes after its chain was emptied.
  const flushOld = at(/^flush chain ip kube-proxy endpoint-\S+old\S+__10\.1\.0\.5\/80$/);
  const delOldSet = at(/^delete set ip kube-proxy affinity-\S+old\S+$/);
  assert.ok(flushOld >= 0 && delOldSet > flushOld, tx.join("\n"));
  assert.ok(
    !tx.some((l) => l.startsWith("delete chain") && l.includes("/")),
    "stale chains are deleted later",
  );
  advance(1100);
  assert.equal(await dp.needsFullSync(), false);
  assert.deepEqual(
    kernel.last.map((l) => l.split(" ")[4].replace(/^(\w+)-.*\/(\w+)\/tcp\/.*$/, "$1 $2")).sort(),
    ["endpoint old", "endpoint web", "service old"],
  );
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump(after));
});

Deno.test("a NodePort shared by two Services: the first one's chain gets it, the second's when the first goes", async () => {
  const { kernel, dp } = setup();
  const a = makeState({ ns: "ns1", name: "a", clusterIP: "172.30.0.40", nodePort: 30100 }, [{
    ip: "10.1.0.1",
  }]);
  const b = makeState({ ns: "ns1", name: "b", clusterIP: "172.30.0.41", nodePort: 30100 }, [{
    ip: "10.1.0.2",
  }]);
  await sync(dp, [a, b]);
  const ext = (svc: string) =>
    kernel.last.find((l) => l.startsWith("add chain ip kube-proxy external-") && l.includes(`/${svc}/`))!
      .split(" ")[4];
  const extA = ext("a"), extB = ext("b");
  assert.ok(
    kernel.last.includes(`add element ip kube-proxy service-nodeports { tcp . 30100 : goto ${extA} }`),
  );
  assert.ok(
    !kernel.last.some((l) => l.includes(`: goto ${extB} }`)),
    "one element per key: the first owner's",
  );
  await sync(dp, [b], ["ns1/a"]);
  assert.ok(kernel.last.includes("delete element ip kube-proxy service-nodeports { tcp . 30100 }"));
  assert.ok(
    kernel.last.includes(`add element ip kube-proxy service-nodeports { tcp . 30100 : goto ${extB} }`),
  );
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([b]));
  // And back: b keeps it, a added again does not take it.
  await sync(dp, [b, a], ["ns1/a"]);
  assert.ok(!kernel.last.some((l) => l.includes("service-nodeports")), kernel.last.join("\n"));
});

Deno.test("a sync a second after chains were emptied deletes them at the end of its own transaction, not in one of their own", async () => {
  const { kernel, dp, advance } = setup();
  const two = web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }], STICKY);
  await sync(dp, [two]);
  await sync(dp, [web([{ ip: "10.1.0.1" }], STICKY)], ["ns1/web"]);
  const emptied = kernel.last.find((l) => /^flush chain \S+ \S+ endpoint-\S+__10\.1\.0\.2\/80$/.test(l))!
    .split(" ")[4];
  // Within the second: a sync does not delete it.
  advance(500);
  await sync(dp, [web([{ ip: "10.1.0.1" }], STICKY), db([{ ip: "10.1.0.9" }], STICKY)], ["ns1/db"]);
  assert.ok(!kernel.last.some((l) => l.startsWith("delete chain")));
  advance(600);
  const before = kernel.transactions.length;
  await sync(dp, [web([{ ip: "10.1.0.1" }], STICKY), db([{ ip: "10.1.0.8" }], STICKY)], ["ns1/db"]);
  assert.equal(kernel.transactions.length, before + 1, "one transaction for the sync and the deletion");
  assert.equal(kernel.last.at(-1), `delete chain ip kube-proxy ${emptied}`);
  assert.ok(kernel.last.some((l) => l.includes("__10.1.0.8/80")), "the sync's own changes are in it");
  // The poll deletes what went stale since (db's old endpoint), not the chain deleted already.
  advance(2000);
  assert.equal(await dp.needsFullSync(), false);
  assert.equal(kernel.transactions.length, before + 2);
  assert.deepEqual(kernel.last.map((l) => l.replace(/endpoint-\S+db\S+__10\.1\.0\.9\/80$/, "DB9")), [
    "delete chain ip kube-proxy DB9",
  ]);
  assert.deepEqual(
    normalizeNftTable(kernel.dump()),
    await freshDump([web([{ ip: "10.1.0.1" }], STICKY), db([{ ip: "10.1.0.8" }], STICKY)]),
  );
});

Deno.test("an emptied chain used again before it is deleted is written, not deleted", async () => {
  const { kernel, dp, advance } = setup();
  const two = () => web([{ ip: "10.1.0.1" }, { ip: "10.1.0.2" }], STICKY);
  const one = () => web([{ ip: "10.1.0.1" }], STICKY);
  await sync(dp, [two()]);
  await sync(dp, [one()], ["ns1/web"]);
  advance(1100);
  await sync(dp, [two()], ["ns1/web"]);
  assert.ok(!kernel.last.some((l) => l.startsWith("delete chain")), kernel.last.join("\n"));
  assert.ok(kernel.last.some((l) => /^add rule ip kube-proxy endpoint-\S+__10\.1\.0\.2\/80 /.test(l)));
  advance(2000);
  const before = kernel.transactions.length;
  assert.equal(await dp.needsFullSync(), false);
  assert.equal(kernel.transactions.length, before, "the poll has nothing to delete");
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([two()]));
  // A full sync after the chain went stale and due deletes it in the same transaction.
  await sync(dp, [one()], ["ns1/web"]);
  advance(1100);
  await sync(dp, [one()]);
  assert.ok(kernel.last[0].startsWith("add table"), "full");
  assert.match(kernel.last.at(-1)!, /^delete chain ip kube-proxy endpoint-\S+__10\.1\.0\.2\/80$/);
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([one()]));
  assert.doesNotMatch(kernel.dump(), /10\.1\.0\.2/);
});

Deno.test("KubeProxyNFTablesLocalhostNodePorts: localhost NodePorts are rejected and counted per protocol; off, nothing of it is left", async () => {
  const kernel = new Kernel();
  const gated = new NftablesDataplane({
    family: "IPv4",
    runner: new RecordingCommandRunner(),
    nftables: kernel,
    localTraffic: { kind: "cidr", cidr: "10.0.0.0/8" },
    nodePortAddresses: ["primary"],
    nodeAddresses: ["192.168.0.2"],
    localhostNodePorts: true,
  });
  await gated.sync(snapshot([web([{ ip: "10.1.0.1" }]), db([{ ip: "10.1.0.2" }])]));
  const tx = kernel.last;
  for (const p of ["tcp", "udp", "sctp"]) {
    assert.ok(tx.includes(`add counter ip kube-proxy localhost-nodeport-rejected-${p}`), p);
    assert.ok(tx.includes(
      `add rule ip kube-proxy localhost-nodeport-reject-${p} counter name "localhost-nodeport-rejected-${p}" reject`,
    ));
  }
  assert.ok(tx.includes(
    "add rule ip kube-proxy nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto . th dport vmap " +
      "@localhost-nodeport-reject-ports",
  ));
  assert.ok(tx.includes(
    "add element ip kube-proxy localhost-nodeport-reject-ports { tcp . 30020 : goto localhost-nodeport-reject-tcp }",
  ));
  // A NodePort added by a partial sync gets its element; a removed one loses it.
  const np2 = makeState({ ns: "ns1", name: "np2", clusterIP: "172.30.0.30", nodePort: 30030 }, []);
  await gated.sync(snapshot([web([{ ip: "10.1.0.1" }]), np2], { changed: ["ns1/db", "ns1/np2"] }));
  assert.ok(
    kernel.last.includes("delete element ip kube-proxy localhost-nodeport-reject-ports { tcp . 30020 }"),
  );
  assert.ok(kernel.last.includes(
    "add element ip kube-proxy localhost-nodeport-reject-ports { tcp . 30030 : goto localhost-nodeport-reject-tcp }",
  ));
  // The gate switched off (a restart without it): map, chains and counters go.
  const { dp } = setup(kernel);
  await dp.sync(snapshot([web([{ ip: "10.1.0.1" }]), np2]));
  assert.doesNotMatch(kernel.dump(), /localhost-nodeport/);
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump([web([{ ip: "10.1.0.1" }]), np2]));
});

Deno.test("a full sync writes the chains and affinity sets of ports the kernel lacks ahead, precreatePorts at a time, unreferenced; the table is the same as from one transaction", async () => {
  const many = (i: number, over: Partial<SvcSpec> = {}) =>
    makeState({ ns: "ns2", name: `s${i}`, clusterIP: `172.30.1.${i}`, nodePort: 31000 + i, ...over }, [
      { ip: `10.2.0.${i}` },
      { ip: `10.2.1.${i}` },
    ]);
  const states = [many(1), many(2, STICKY), many(3), many(4), many(5)];
  const want = await freshDump(states);
  const kernel = new Kernel();
  await setup(kernel, 2).dp.sync(snapshot(states));
  assert.equal(kernel.transactions.length, 3, "two runs of 2 ports ahead, then the sync's transaction");
  for (const t of kernel.transactions.slice(0, 2)) {
    const lines = t.split("\n").filter((l) => l !== "");
    assert.ok(lines.some((l) => l.startsWith("add rule ip kube-proxy service-")), "the ports' chains");
    assert.ok(!lines.some((l) => / hook |^add element|^flush (map|set)|^delete/.test(l)), t);
  }
  assert.ok(kernel.transactions[0].includes("add set ip kube-proxy affinity-"), "s2's affinity sets ahead");
  const final = kernel.last;
  assert.ok(!final.some((l) => l.includes("s1/tcp") && l.startsWith("add rule")), "s1 was written ahead");
  assert.ok(
    final.some((l) => l.includes("s5/tcp") && l.startsWith("add rule")),
    "s5 (the remainder) is here",
  );
  assert.ok(final.some((l) => l.startsWith("add element ip kube-proxy service-ips") && l.includes("s1/tcp")));
  assert.deepEqual(normalizeNftTable(kernel.dump()), want);

  // Restart: every chain exists, so everything goes in one transaction (rewriting live chains stays atomic).
  const before = kernel.transactions.length;
  await setup(kernel, 2).dp.sync(snapshot(states));
  assert.equal(kernel.transactions.length, before + 1);
  assert.deepEqual(normalizeNftTable(kernel.dump()), want);
});

Deno.test("a run written ahead that fails fails the sync; the next full sync writes the same table", async () => {
  const many = (i: number) =>
    makeState({ ns: "ns2", name: `s${i}`, clusterIP: `172.30.1.${i}` }, [{ ip: `10.2.0.${i}` }]);
  const states = [1, 2, 3, 4, 5, 6].map(many);
  const kernel = new Kernel();
  const { dp } = setup(kernel, 2);
  kernel.failIf = (t) => t.includes("ns2/s3/");
  await assert.rejects(dp.sync(snapshot(states)), /injected failure/);
  assert.equal(kernel.transactions.length, 2, "stopped at the failing run");
  kernel.failIf = null;
  const res = await dp.sync(snapshot(states));
  assert.equal(res.full, true);
  assert.deepEqual(normalizeNftTable(kernel.dump()), await freshDump(states));
});
