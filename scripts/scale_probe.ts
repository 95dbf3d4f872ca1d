/**
 * What the scale harness looks for in the kernel-side call log, per proxy mode: which calls apply a payload
 * (`iptables-restore`, `nft -f -`), which payload is IPv4, how a Service's cluster-IP entry and a new endpoint
 * look in a payload, how many Services the kernel holds after the churn, and how to apply the first full
 * payload alone into a fresh namespace. Both agents are probed the same way.
 *
 * - iptables: a restore's payload holds `-A KUBE-SERVICES -m comment --comment "scale/svc-N cluster IP" ...
 *   -j KUBE-SVC-...` per Service and `--to-destination <ip>:8080` per endpoint.
 * - nftables: a transaction holds `add element ip kube-proxy service-ips { <clusterIP> . tcp . 80 : goto
 *   service-... }` per Service (both agents write upstream's elements), and per endpoint (upstream v1.37's
 *   layout) an element `i : <ip> . 8080` of its service chain's `numgen` map, or `dnat to <ip>:8080` when it
 *   is the Service's only endpoint.
 * @module
 */
import type { Call, NodeNamespace } from "./scale_netns.ts";
import { sh } from "./scale_netns.ts";
import { clusterIPOf, SCALE_NAMESPACE, TARGET_PORT } from "./scale_objects.ts";
import type { Backend, ScaleMode } from "./scale_agents.ts";

/** The mode-specific part of the harness's measurements. */
export interface KernelProbe {
  /** How the applying program is named in the report (`restore`, `nft -f`). */
  readonly tool: string;
  /** A finished call that applies a payload (whatever its exit code). */
  isApply(c: Call): boolean;
  /** A successful apply of an IPv4 payload (`text` is the payload). */
  isV4Success(c: Call, text: string): boolean;
  /**
   * A successful payload that is housekeeping at the start of a sync, not a sync's own (nftables: the deletion
   * of stale chains both agents run before a sync's transaction); undefined when the mode has none. Such a
   * payload does not end the previous sync for the minSyncPeriod arithmetic.
   */
  readonly isHousekeeping?: (text: string) => boolean;
  /** Number of Services whose cluster-IP entry is in a payload. */
  servicesIn(text: string): number;
  /** Whether a payload programs endpoint `ip`. */
  hasEndpoint(text: string, ip: string): boolean;
  /** Text a payload carries when it programs Service i. */
  serviceNeedle(i: number): string;
  /** Services programmed in the namespace's kernel now. */
  programmed(ns: NodeNamespace): Promise<number>;
  /** A call of the agent's periodic poll (not part of a sync). */
  isPoll(c: Call): boolean;
  /**
   * What the agent set up before its first full payload, kept (in `workdir`) to be replayed before the bare
   * apply so that the payload applies the same way.
   */
  capturePrelude(calls: readonly Call[], first: Call, workdir: string): Promise<Prelude>;
  /** Replays the prelude into `bare`, then applies `payload` alone; resolves to the apply's seconds. */
  bareApply(bare: NodeNamespace, payload: string, prelude: Prelude): Promise<number>;
}

/** An opaque record of the calls before the first full payload. */
export type Prelude = { argv: string[][] } | { files: string[] };

const CLUSTER_IP_RULE = /^-A KUBE-SERVICES -m comment --comment "scale\/svc-\d+ cluster IP" /gm;

function iptablesProbe(backend: Backend): KernelProbe {
  return {
    tool: "restore",
    isApply: (c) => c.name.endsWith("-restore") && c.file !== null && c.end !== null,
    isV4Success: (c) =>
      c.name.startsWith("iptables") && c.name.endsWith("-restore") && c.end !== null && c.rc === 0,
    servicesIn: (text) => text.match(CLUSTER_IP_RULE)?.length ?? 0,
    hasEndpoint: (text, ip) => text.includes(`--to-destination ${ip}:${TARGET_PORT}`),
    serviceNeedle: (i) =>
      `--comment "${SCALE_NAMESPACE}/svc-${i} cluster IP" -m tcp -p tcp -d ${
        clusterIPOf(i)
      } --dport 80 -j KUBE-SVC-`,
    async programmed(ns) {
      // iptables-save reorders the matches.
      const nat = await ns.exec(`iptables-${backend}-save`, ["-t", "nat"]);
      return nat.match(/^-A KUBE-SERVICES .*--comment "scale\/svc-\d+ cluster IP"/gm)?.length ?? 0;
    },
    // The per-syncPeriod poll (canary chain; KUBE-SERVICES in small clusters) runs on its own timer.
    isPoll: (c) => c.args.includes("KUBE-PROXY-CANARY") || / -S KUBE-SERVICES\b/.test(c.args),
    capturePrelude(calls, first) {
      // Upstream creates chains and jumps one by one before its first restore.
      return Promise.resolve({
        argv: calls
          .filter((p) => p.start < first.start && p.rc === 0 && p.name.startsWith("iptables"))
          .filter((p) => !p.name.endsWith("-save") && !p.name.endsWith("-restore"))
          .filter((p) => p.argv.some((a) => a === "-N" || a === "-I" || a === "-A"))
          .map((p) => p.argv),
      });
    },
    async bareApply(bare, payload, prelude) {
      for (const argv of (prelude as { argv: string[][] }).argv) {
        await bare.exec(`iptables-${backend}`, argv).catch(() => "");
      }
      // nfacct counters a payload names (upstream creates them over netlink before its first restore).
      const text = await Deno.readTextFile(payload);
      for (const name of new Set([...text.matchAll(/--nfacct-name (\S+)/g)].map((m) => m[1]))) {
        await bare.exec("nfacct", ["add", name]).catch(() => "");
      }
      const t = performance.now();
      await sh("sh", [
        "-c",
        `ip netns exec ${bare.name} iptables-${backend}-restore --noflush --counters -w 5 -W 100000 < ${payload}`,
      ]);
      return (performance.now() - t) / 1000;
    },
  };
}

/** `add element ip kube-proxy service-ips { 10.96.x.y . tcp . 80 : goto service-… }` (cluster IPs: 10.96/16). */
const SERVICE_IP_ELEMENT =
  /^add element ip kube-proxy service-ips \{ 10\.96\.\d+\.\d+ \. tcp \. 80 : goto service-/gm;
/** The first line of an IPv4 transaction names the `ip` family's table. */
const IPV4_TX = /^\w+ \w+ ip kube-proxy\b/;

const nftProbe: KernelProbe = {
  tool: "nft -f",
  isApply: (c) => c.name === "nft" && c.file !== null && c.end !== null,
  isV4Success: (c, text) => c.name === "nft" && c.end !== null && c.rc === 0 && IPV4_TX.test(text),
  isHousekeeping: (text) => text !== "" && /^(delete chain [^\n]*\n)+$/.test(text),
  servicesIn: (text) => text.match(SERVICE_IP_ELEMENT)?.length ?? 0,
  // v1.37: `dnat to ip:port` for a single endpoint (or in an affinity endpoint chain), else an element of the
  // service chain's numgen map, `… map { 0 : ip . port , 1 : … }`.
  hasEndpoint: (text, ip) =>
    text.includes(`dnat to ${ip}:${TARGET_PORT}\n`) || text.includes(` : ${ip} . ${TARGET_PORT} `),
  serviceNeedle: (i) =>
    `add element ip kube-proxy service-ips { ${clusterIPOf(i)} . tcp . 80 : goto service-`,
  async programmed(ns) {
    const out = await ns.exec("nft", ["list", "map", "ip", "kube-proxy", "service-ips"]);
    return out.match(/10\.96\.\d+\.\d+ \. tcp \. 80 : goto service-/g)?.length ?? 0;
  },
  // This agent checks that its table exists once per syncPeriod.
  isPoll: (c) => c.name === "nft" && /^list tables\b/.test(c.args),
  async capturePrelude(calls, first, workdir) {
    // Every transaction applied before the first full one (any family), in order; copied now because the
    // harness deletes payload copies as it scans them.
    const files: string[] = [];
    for (const p of calls) {
      if (p.name !== "nft" || p.file === null || p.rc !== 0 || p.start >= first.start) continue;
      const to = `${workdir}/prelude-${files.length}`;
      await Deno.copyFile(p.file, to);
      files.push(to);
    }
    return { files };
  },
  async bareApply(bare, payload, prelude) {
    for (const f of (prelude as { files: string[] }).files) await bare.exec("nft", ["-f", f]).catch(() => "");
    const t = performance.now();
    await bare.exec("nft", ["-f", payload]);
    return (performance.now() - t) / 1000;
  },
};

/** The probe of a mode (`backend`: the iptables backend; unused by nftables). */
export function kernelProbe(mode: ScaleMode, backend: Backend): KernelProbe {
  return mode === "nftables" ? nftProbe : iptablesProbe(backend);
}
