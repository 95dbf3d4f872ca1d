/**
 * Helpers of the render / explain tests: a corpus of Service shapes as manifests (every shape the parity corpus
 * and the packet suite cover), and a captured run of the subcommands.
 * @module
 */
import { stringify } from "yaml";
import { type FirstSync, firstSync } from "../../lib/cli/engine.ts";
import { checkObjects } from "../../lib/cli/inputs.ts";
import { parseManifestText } from "../../lib/cli/manifests.ts";
import { resolveNode } from "../../lib/cli/node.ts";
import { runSubcommand } from "../../lib/cli/run.ts";
import { parseCommandLine, type ProxyOptions } from "../../lib/config/command.ts";
import type { TracePacket } from "../../lib/dataplane/iptables/trace.ts";
import type { CommandRunner } from "../../lib/exec.ts";
import { familyOf } from "../../lib/net/ip.ts";
import type { EndpointSlice, KubeObject, Node, Service } from "../../lib/kube/types.ts";
import { configureLogging } from "../../lib/log.ts";
import {
  dualStackNodeObject,
  type EndpointLite,
  endpointSlice,
  service,
  type ServiceSpecLite,
} from "../packets/helpers.ts";

/** This node, the other node, their pods. */
export const NODE = "node1";
export const OTHER = "node2";
export const NODE_IP = "192.168.77.1";
export const NODE_IP6 = "fd00:77::1";
/** Pods on this node (a, b), on the other node (c), and a pod on this node that is no endpoint (x). */
export const POD = { a: "10.244.0.2", b: "10.244.0.3", c: "10.244.1.2", x: "10.244.0.50" } as const;
export const POD6 = { a: "fd00:10:244::2", x: "fd00:10:244::50" } as const;
/** A client outside the cluster, and one inside the LoadBalancer source range. */
export const CLIENT = "192.168.1.5";
export const ALLOWED_CLIENT = "203.0.113.7";
/** Flags every corpus run uses (with the dual-stack cluster CIDR). */
export const CORPUS_FLAGS = [
  "--hostname-override",
  NODE,
  "--cluster-cidr",
  "10.244.0.0/16,fd00:10:244::/56",
];

/** One Service shape of the corpus. */
export interface Shape {
  /** The Service's name (namespace `dp`). */
  readonly name: string;
  readonly svc: ServiceSpecLite;
  /** Endpoints; none means no EndpointSlice. */
  readonly eps: EndpointLite[];
  /** IPv6 endpoints (dual-stack shapes). */
  readonly eps6?: EndpointLite[];
}

const local = (ip: string, extra: Partial<EndpointLite> = {}): EndpointLite => ({ ip, node: NODE, ...extra });
const remote = (ip: string, extra: Partial<EndpointLite> = {}): EndpointLite => ({
  ip,
  node: OTHER,
  ...extra,
});

/** Every shape: ClusterIP, NodePort, LoadBalancer (with and without source ranges), externalIPs, traffic policies
 * with and without local endpoints, affinity, no endpoints, terminating-only endpoints, UDP, dual-stack. */
export const SHAPES: readonly Shape[] = [
  {
    name: "clusterip",
    svc: { name: "clusterip", clusterIP: "10.96.1.1" },
    eps: [local(POD.a), remote(POD.c)],
  },
  {
    name: "nodeport",
    svc: {
      name: "nodeport",
      clusterIP: "10.96.1.2",
      type: "NodePort",
      ports: [{ port: 80, nodePort: 30082 }],
    },
    eps: [local(POD.a), local(POD.b)],
  },
  {
    name: "lb",
    svc: {
      name: "lb",
      clusterIP: "10.96.1.3",
      type: "LoadBalancer",
      ports: [{ port: 80, nodePort: 30083 }],
      lbIPs: ["172.30.1.3"],
    },
    eps: [local(POD.a), remote(POD.c)],
  },
  {
    name: "lbsr",
    svc: {
      name: "lbsr",
      clusterIP: "10.96.1.4",
      type: "LoadBalancer",
      ports: [{ port: 80, nodePort: 30084 }],
      lbIPs: ["172.30.1.4"],
      sourceRanges: ["203.0.113.0/24"],
    },
    eps: [local(POD.a)],
  },
  {
    name: "extip",
    svc: { name: "extip", clusterIP: "10.96.1.5", externalIPs: ["172.30.2.5"] },
    eps: [remote(POD.c)],
  },
  {
    name: "etp",
    svc: {
      name: "etp",
      clusterIP: "10.96.1.6",
      type: "NodePort",
      ports: [{ port: 80, nodePort: 30086 }],
      eTPLocal: true,
    },
    eps: [local(POD.a), remote(POD.c)],
  },
  {
    name: "etp-nolocal",
    svc: {
      name: "etp-nolocal",
      clusterIP: "10.96.1.7",
      type: "NodePort",
      ports: [{ port: 80, nodePort: 30087 }],
      eTPLocal: true,
    },
    eps: [remote(POD.c)],
  },
  {
    name: "itp",
    svc: { name: "itp", clusterIP: "10.96.1.8", iTPLocal: true },
    eps: [local(POD.b), remote(POD.c)],
  },
  {
    name: "itp-nolocal",
    svc: { name: "itp-nolocal", clusterIP: "10.96.1.9", iTPLocal: true },
    eps: [remote(POD.c)],
  },
  {
    name: "sticky",
    svc: { name: "sticky", clusterIP: "10.96.1.10", affinitySeconds: 300 },
    eps: [local(POD.a), local(POD.b), remote(POD.c)],
  },
  { name: "empty", svc: { name: "empty", clusterIP: "10.96.1.11" }, eps: [] },
  {
    name: "terminating",
    svc: { name: "terminating", clusterIP: "10.96.1.12" },
    eps: [
      local(POD.a, { ready: false, terminating: true }),
      remote(POD.c, { ready: false, terminating: true }),
    ],
  },
  {
    name: "udp",
    svc: { name: "udp", clusterIP: "10.96.1.13", ports: [{ port: 53, protocol: "UDP" }] },
    eps: [local(POD.a)],
  },
  {
    name: "dual",
    svc: {
      name: "dual",
      clusterIP: "10.96.1.14",
      clusterIPs: ["10.96.1.14", "fd00:96::14"],
      ipFamilies: ["IPv4", "IPv6"],
      ipFamilyPolicy: "RequireDualStack",
    },
    eps: [local(POD.a)],
    eps6: [local(POD6.a)],
  },
  {
    name: "lb-local",
    svc: {
      name: "lb-local",
      clusterIP: "10.96.1.15",
      type: "LoadBalancer",
      ports: [{ port: 80, nodePort: 30085 }],
      lbIPs: ["172.30.1.15"],
      eTPLocal: true,
      healthCheckNodePort: 32015,
    },
    eps: [local(POD.a), remote(POD.c)],
  },
];

/** The shape's objects. Terminating endpoints are serving, as the EndpointSlice controller reports them. */
export function shapeObjects(s: Shape): KubeObject[] {
  const out: KubeObject[] = [service(s.svc)];
  if (s.eps.length > 0) out.push(servingSlice(endpointSlice(s.name, s.eps, s.svc.ports), s.eps));
  if (s.eps6) {
    out.push(
      servingSlice(
        endpointSlice(s.name, s.eps6, s.svc.ports, { addressType: "IPv6", name: `${s.name}-v6` }),
        s.eps6,
      ),
    );
  }
  return out;
}

function servingSlice(slice: EndpointSlice, eps: EndpointLite[]): EndpointSlice {
  slice.endpoints = slice.endpoints!.map((e, i) => ({
    ...e,
    conditions: { ...e.conditions, serving: eps[i].terminating ? true : e.conditions?.serving },
  }));
  return slice;
}

/** This node, dual-stack. */
export function corpusNode(): Node {
  return dualStackNodeObject(NODE, [NODE_IP, NODE_IP6], ["10.244.0.0/24", "fd00:10:244::/64"]);
}

/** Every shape's objects and the node, as one multi-document YAML. */
export function corpusYaml(shapes: readonly Shape[] = SHAPES): string {
  const objs: KubeObject[] = [corpusNode(), ...shapes.flatMap(shapeObjects)];
  return objs.map((o) => stringify(o)).join("---\n");
}

/** The corpus's Services by name (for assertions). */
export function corpusService(name: string): Service {
  return service(SHAPES.find((s) => s.name === name)!.svc);
}

/** What one run of a subcommand printed. */
export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs `kube-proxy <argv>` in-process with captured output; `stdin` is what `-f -` reads, `runner` runs the
 * programs `explain --live` runs (e.g. inside a network namespace).
 */
export async function runCli(argv: string[], stdin = "", runner?: CommandRunner): Promise<CliRun> {
  let stdout = "", stderr = "";
  try {
    const code = await runSubcommand(argv, {
      stdout: (s) => stdout += s,
      stderr: (s) => stderr += s,
      hostname: () => "machine-hostname",
      readStdin: () => Promise.resolve(stdin),
      runner,
    });
    return { code, stdout, stderr };
  } finally {
    configureLogging({ sink: () => {}, verbosity: 0 });
  }
}

export type { EndpointSlice };

/** The options of `mode` with the corpus flags, and the first sync of `yaml` (the corpus unless given). */
export async function corpusSetup(
  mode: "iptables" | "nftables" | "ipvs",
  yaml = corpusYaml(),
): Promise<{ opts: ProxyOptions; sync: FirstSync }> {
  const parsed = await parseCommandLine([...CORPUS_FLAGS, `--proxy-mode=${mode}`], {
    stdout: () => {},
    stderr: (s) => {
      throw new Error(s);
    },
  });
  if (!("options" in parsed)) throw new Error("no options");
  const opts = parsed.options;
  const { input, problems } = checkObjects(parseManifestText(yaml, "corpus.yaml").objects);
  if (problems.length > 0) throw new Error(JSON.stringify(problems));
  const node = resolveNode(opts.hostname, input.nodes, [], false);
  return { opts, sync: await firstSync(opts, { node, ...input }) };
}

/** The first sync of the corpus in `mode` (with the corpus flags), as render and explain compute it. */
export async function corpusFirstSync(mode: "iptables" | "nftables" | "ipvs"): Promise<FirstSync> {
  return (await corpusSetup(mode)).sync;
}

/** A trace's outcomes as `verdict [endpoint] [masq] share` lines, for exact assertions. */
export function outcomeLines(
  t: {
    outcomes: readonly {
      verdict: string;
      endpoint: string | null;
      masqueraded: boolean;
      probability: number;
    }[];
  },
): string[] {
  return t.outcomes.map((x) =>
    `${x.verdict}${x.endpoint ? ` ${x.endpoint}` : ""}${x.masqueraded ? " masq" : ""} ${x.probability}`
  );
}

/** A new TCP connection's first packet for the tracers, the node's own addresses `local`. */
export function tcpPacket(
  src: string,
  from: TracePacket["from"],
  dst: string,
  dport: number,
  local: readonly string[],
): TracePacket {
  return {
    family: familyOf(dst),
    src,
    dst,
    protocol: "tcp",
    dport,
    from,
    inInterface: "",
    localAddresses: local,
  };
}
