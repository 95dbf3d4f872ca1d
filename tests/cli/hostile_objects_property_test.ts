/**
 * Property test: Services and EndpointSlices with hostile and boundary values (lengths at and past every limit,
 * every character class, every address form, both families, duplicate ports, mixed protocols) go through the
 * model's validation and each mode's first sync (`render`'s engine, the agent's own code), and:
 * - every payload is accepted by the real tool: `iptables-restore --test` / `ip6tables-restore --test` and
 *   `nft -c -f -` in a throwaway network namespace, `ipset restore` applied there; ipvsadm's input (no IPVS
 *   in this kernel) matches its restore grammar line by line;
 * - no hostile value reaches any command's input or arguments (no line or token injected);
 * - every valid Service port is in the snapshot, and its ClusterIP in the payload of its family.
 *
 * CI runs a fixed seed, bounded (DKP_PROPERTY_RUNS, default 25 runs per mode); docs/robustness.md records a
 * longer run (DKP_PROPERTY_RUNS=1000 DKP_PROPERTY_SEED=<n>).
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { parseCommandLine, type ProxyOptions } from "../../lib/config/command.ts";
import { firstSync, type RenderedCommand } from "../../lib/cli/engine.ts";
import { configureLogging } from "../../lib/log.ts";
import { parseIP } from "../../lib/net/ip.ts";
import type { EndpointSlice, Service } from "../../lib/kube/types.ts";
import { isDNS1035Label, isDNS1123Label } from "../../lib/kube/validation.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import { CORPUS_FLAGS, corpusNode } from "./helpers.ts";

configureLogging({ sink: () => {} });

const SEED = Number(Deno.env.get("DKP_PROPERTY_SEED") ?? "20261204");
const RUNS = Number(Deno.env.get("DKP_PROPERTY_RUNS") ?? "25");
const ALL_MODES = ["iptables", "nftables", "ipvs"] as const;
/** DKP_PROPERTY_MODES=iptables,ipvs runs a subset (default: every mode). */
const MODES = ALL_MODES.filter((m) => (Deno.env.get("DKP_PROPERTY_MODES") ?? m).split(",").includes(m));

const HOSTILE_CHARS = [
  '"',
  "'",
  "\n",
  "\r",
  "\t",
  " ",
  ";",
  "#",
  "\\",
  "$",
  "`",
  "{",
  "}",
  "é",
  "\u0000",
  "-",
  ".",
  "_",
  "A",
];

/** Names: valid labels at the length limits and hostile strings of every character class. */
const name = fc.oneof(
  { weight: 8, arbitrary: fc.stringMatching(/^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/) },
  fc.constantFrom(
    "a",
    "a".repeat(63),
    "a".repeat(64),
    "b".repeat(300),
    "1abc",
    "abc-",
    'bad"quote',
    "bad\nnewline",
  ),
  fc.array(fc.constantFrom(...HOSTILE_CHARS, "a", "b", "1"), { minLength: 1, maxLength: 20 }).map((a) =>
    a.join("")
  ),
);

const portName = fc.oneof(
  fc.constant(""),
  fc.stringMatching(/^[a-z]([-a-z0-9]{0,14}[a-z0-9])?$/),
  fc.constantFrom("p".repeat(63), "p".repeat(64), "Http", "a b", 'x"y', "x\ny", "a.b"),
);
const protocol = fc.constantFrom("TCP", "UDP", "SCTP", "TCP", "UDP", "TCP", "ICMP", "tcp", "TCP\n");
const portNumber = fc.oneof(
  fc.integer({ min: 1, max: 65535 }),
  fc.constantFrom(0, 1, 65535, 65536, -1, 80.5),
);

/** Address forms for a given index: canonical, sloppy, mapped, other family, broken, injected. */
function addressForms(i: number, v6: boolean): fc.Arbitrary<string> {
  const v4 = `10.${100 + (i >> 16 & 15)}.${i >> 8 & 255}.${i & 255}`;
  const six = `fd00:96::${(i + 1).toString(16)}`;
  return fc.constantFrom(
    v6 ? six : v4,
    v6 ? six : v4,
    v6 ? six : v4,
    v6 ? six : v4,
    v6 ? six : v4,
    v6 ? six.toUpperCase() : v4.split(".").map((o) => o.padStart(3, "0")).join("."),
    v6 ? `${six}%eth0` : `::ffff:${v4}`,
    v6 ? "fd00::1::2" : "10.1.2",
    `${v6 ? six : v4} -j ACCEPT`,
    v6 ? v4 : six,
    v6 ? "fe80::1" : "127.0.0.1",
  );
}

interface Case {
  services: Service[];
  slices: EndpointSlice[];
}

const caseArb: fc.Arbitrary<Case> = fc.integer({ min: 1, max: 6 }).chain((n) =>
  fc.tuple(
    ...Array.from({ length: n }, (_, i) =>
      fc.record({
        ns: fc.oneof({ weight: 6, arbitrary: fc.constant("dp") }, name),
        name,
        v6: fc.boolean(),
        clusterIP: fc.boolean().chain((v6) => addressForms(i, v6).map((ip) => ({ v6, ip }))),
        ports: fc.array(fc.record({ name: portName, protocol, port: portNumber }), {
          minLength: 1,
          maxLength: 3,
        }),
        eps: fc.array(fc.boolean().chain((v6) => addressForms(1000 + i * 10, v6).map((ip) => ({ v6, ip }))), {
          maxLength: 3,
        }),
      })),
  ).map((specs) => {
    const services: Service[] = [];
    const slices: EndpointSlice[] = [];
    for (const [i, s] of specs.entries()) {
      const ports = s.ports.map((p, j) => ({
        ...p,
        name: s.ports.length > 1 && p.name === "" ? `p${j}` : p.name,
      }));
      services.push({
        apiVersion: "v1",
        kind: "Service",
        metadata: { namespace: s.ns, name: s.name, uid: `u${i}` },
        spec: {
          type: "ClusterIP",
          clusterIP: s.clusterIP.ip,
          clusterIPs: [s.clusterIP.ip],
          ipFamilies: [s.clusterIP.v6 ? "IPv6" : "IPv4"],
          ports: ports.map((p) => ({ ...p, protocol: p.protocol as "TCP", targetPort: 8080 })),
        },
      });
      for (const fam of ["IPv4", "IPv6"] as const) {
        const eps = s.eps.filter((e) => e.v6 === (fam === "IPv6"));
        if (eps.length === 0) continue;
        slices.push({
          apiVersion: "discovery.k8s.io/v1",
          kind: "EndpointSlice",
          metadata: {
            namespace: s.ns,
            name: `${s.name}-${fam}`,
            labels: { "kubernetes.io/service-name": s.name },
          },
          addressType: fam,
          endpoints: eps.map((e) => ({ addresses: [e.ip], conditions: { ready: true } })),
          ports: ports.map((p) => ({ name: p.name, protocol: p.protocol as "TCP", port: 8080 })),
        });
      }
    }
    return { services, slices };
  })
);

/** The values that must never reach a tool: generated strings that carry a quoting or line character. */
function hostileValues(c: Case): string[] {
  const out = new Set<string>();
  // A value with a character that could end a token, a string or a line; 6+ characters so that it cannot
  // match ordinary payload text by chance (a lone "-A" or '"' is everywhere).
  const bad = (v: unknown) =>
    typeof v === "string" && v.length >= 6 && [..."\"'\n\r;\\$`\u0000é"].some((ch) => v.includes(ch));
  for (const s of c.services) {
    for (
      const v of [
        s.metadata!.namespace,
        s.metadata!.name,
        s.spec!.clusterIP,
        ...s.spec!.ports!.map((p) => p.name),
      ]
    ) {
      if (bad(v)) out.add(v!);
    }
  }
  for (const sl of c.slices) {
    for (const e of sl.endpoints ?? []) if (bad(e.addresses?.[0])) out.add(e.addresses![0]);
  }
  return [...out];
}

/** The Service ports the API's rules accept (computed here, independently of lib/), per family. */
function validPorts(c: Case): { key: string; family: "IPv4" | "IPv6"; clusterIP: string }[] {
  const out = new Map<string, { key: string; family: "IPv4" | "IPv6"; clusterIP: string }>();
  for (const s of c.services) {
    const { namespace: ns, name } = s.metadata!;
    // A later object of the same namespace/name replaces the earlier one (as an update would).
    for (const [k, v] of out) {
      if (v.key === `${ns}/${name}` || v.key.startsWith(`${ns}/${name}:`)) out.delete(k);
    }
    if (isDNS1123Label(ns!).length > 0 || isDNS1035Label(name!).length > 0) continue;
    const ip = parseIP(s.spec!.clusterIP!);
    if (!ip) continue;
    for (const p of s.spec!.ports!) {
      if (p.name && isDNS1123Label(p.name).length > 0) continue;
      if (!["TCP", "UDP", "SCTP"].includes(p.protocol!)) continue;
      if (!Number.isInteger(p.port) || p.port! < 1 || p.port! > 65535) continue;
      const key = `${ns}/${name}${p.name ? `:${p.name}` : ""}`;
      out.set(`${key}/${p.protocol}`, { key, family: ip.family, clusterIP: ip.ip });
    }
  }
  return [...out.values()];
}

async function run(cmd: string, args: string[], stdin: string): Promise<{ code: number; err: string }> {
  const child = new Deno.Command(cmd, { args, stdin: "piped", stdout: "null", stderr: "piped" }).spawn();
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode(stdin));
  await w.close();
  const out = await child.output();
  return { code: out.code, err: new TextDecoder().decode(out.stderr) };
}

/** ipvsadm's restore grammar, as the ipvs dataplane writes it. */
const IPVSADM_LINE =
  /^-(A|E|D) (-t|-u|--sctp-service) (\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:.]+\]):\d{1,5}( -s [a-z]+)?( -p \d+)?( -b [a-z,-]+)?$|^-(a|e|d) (-t|-u|--sctp-service) (\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:.]+\]):\d{1,5} -r (\d{1,3}(\.\d{1,3}){3}|\[[0-9a-f:.]+\]):\d{1,5}( -[mgi])?( -w \d+)?$/;

/** Checks one command's input with the real tool in namespace `ns` (or the grammar where no kernel can). */
async function toolAccepts(ns: string, c: RenderedCommand): Promise<string | null> {
  const base = c.cmd.split("/").pop()!;
  if (/^ip6?tables(-nft|-legacy)?-restore$/.test(base)) {
    const r = await run(
      "ip",
      ["netns", "exec", ns, base, "--test", ...c.args.filter((a) => a !== "--test")],
      c.stdin,
    );
    return r.code === 0 ? null : `${base}: ${r.err}`;
  }
  if (base === "nft" && c.stdin !== "") {
    const r = await run("ip", ["netns", "exec", ns, "nft", "-c", "-f", "-"], c.stdin);
    return r.code === 0 ? null : `nft -c: ${r.err}`;
  }
  if (base === "ipset" && c.args.includes("restore")) {
    const r = await run("ip", ["netns", "exec", ns, "ipset", "restore", "-exist"], c.stdin);
    return r.code === 0 ? null : `ipset restore: ${r.err}`;
  }
  if (base === "ipvsadm" && c.args.includes("-R")) {
    const bad = c.stdin.split("\n").filter((l) => l !== "" && !IPVSADM_LINE.test(l));
    return bad.length === 0 ? null : `ipvsadm -R grammar: ${JSON.stringify(bad.slice(0, 3))}`;
  }
  return null;
}

async function options(mode: string): Promise<ProxyOptions> {
  const parsed = await parseCommandLine([...CORPUS_FLAGS, `--proxy-mode=${mode}`], {
    stdout: () => {},
    stderr: (s) => {
      throw new Error(s);
    },
  });
  if (!("options" in parsed)) throw new Error("no options");
  return parsed.options;
}

privilegedTest(sandboxUnavailableReason(["ip", "iptables-restore", "ip6tables-restore", "nft", "ipset"]), {
  name:
    `property: hostile and boundary Services and EndpointSlices render into payloads the real tools accept, ` +
    `with nothing injected and every valid port present (seed ${SEED}, ${RUNS} runs per mode)`,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const ns = `dkp-prop-${Deno.pid}`;
    await run("ip", ["netns", "add", ns], "");
    const counts: Record<
      string,
      { runs: number; services: number; slices: number; valid: number; commands: number }
    > = {};
    try {
      for (const mode of MODES) {
        const opts = await options(mode);
        const count = counts[mode] = { runs: 0, services: 0, slices: 0, valid: 0, commands: 0 };
        await fc.assert(
          fc.asyncProperty(caseArb, async (c) => {
            const sync = await firstSync(opts, {
              node: corpusNode(),
              services: c.services,
              slices: c.slices,
              serviceCIDRs: [],
            });
            count.runs++;
            count.services += c.services.length;
            count.slices += c.slices.length;
            count.commands += sync.commands.length;
            const hostile = hostileValues(c);
            for (const cmd of sync.commands) {
              const text = [cmd.stdin, ...cmd.args].join("\n");
              for (const h of hostile) {
                assert.ok(!text.includes(h), `${mode}: ${JSON.stringify(h)} reached ${cmd.cmd}`);
              }
              const refused = await toolAccepts(ns, cmd);
              assert.equal(refused, null, `${mode}: ${refused}\n${cmd.stdin.slice(0, 3000)}`);
            }
            for (const v of validPorts(c)) {
              const snap = sync.snapshots.get(v.family);
              if (!snap) continue; // a family this node does not serve
              count.valid++;
              assert.ok(
                [...snap.servicePorts.keys()].includes(v.key),
                `${mode}: ${v.key} missing from the model`,
              );
              const payload = sync.commands.filter((x) => x.family === v.family).map((x) =>
                x.stdin + x.args.join(" ")
              )
                .join("\n");
              assert.ok(
                payload.includes(v.clusterIP),
                `${mode}: ${v.key}'s ClusterIP ${v.clusterIP} not rendered`,
              );
            }
          }),
          { seed: SEED, numRuns: RUNS, endOnFailure: true },
        );
      }
    } finally {
      await run("ip", ["netns", "del", ns], "");
    }
    console.log(`property runs (seed ${SEED}): ${JSON.stringify(counts)}`);
  },
});
