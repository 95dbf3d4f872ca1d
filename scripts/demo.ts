/**
 * The demo: a node with three web pods in network namespaces, the API server simulator loaded with
 * `examples/`, and the agent (under its production permissions) programming real iptables in the node
 * namespace. It shows how real requests spread over the pods, changes endpoints live, prints one
 * service's rules, and removes everything, also when interrupted (Ctrl-C).
 *
 * Run as root: `bash scripts/demo.sh` (or `deno task demo` once Deno is installed); `--proxy-mode nftables`
 * runs the agent in nftables mode and shows the nftables rules instead.
 * @module
 */
import { cleanupStale, Sandbox, sandboxUnavailableReason } from "../testkit/sandbox.ts";
import { readManifest, SimulatorProcess } from "../testkit/apiserver_process.ts";
import { agentCommand, PROJECT_ROOT } from "../testkit/agent_command.ts";
import type { EndpointSlice } from "../lib/kube/types.ts";
import type { Probe } from "../testkit/probe.ts";

const WEB_VIP = "10.96.0.10";
const DNS_VIP = "10.96.0.53";
const NODE_PORT = 30080;
const PODS: [string, string][] = [["web-1", "10.244.0.11"], ["web-2", "10.244.0.12"], [
  "web-3",
  "10.244.0.13",
]];

const bold = (s: string) => (Deno.noColor ? s : `\x1b[1m${s}\x1b[0m`);
const step = (s: string) => console.log(`\n${bold("==> " + s)}`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends `n` requests and prints how many each pod answered, plus the source address the pods saw. */
async function spread(probe: Probe, label: string, host: string, port: number, n = 30, udp = false) {
  const counts = new Map<string, number>();
  const sources = new Set<string>();
  for (let i = 0; i < n; i++) {
    const r = udp
      ? await probe.udp(host, port, { timeoutMs: 800 })
      : await probe.tcp(host, port, { timeoutMs: 800 });
    const who = r.result === "ok" ? r.answer!.split(" ")[0] : r.result;
    if (r.result === "ok") sources.add(r.answer!.split(" ")[1].replace(/:\d+$/, ""));
    counts.set(who, (counts.get(who) ?? 0) + 1);
  }
  const parts = [...counts.entries()].sort().map(([k, v]) => `${k}=${v}`).join("  ");
  console.log(`  ${label.padEnd(44)} ${parts}   (pods saw source ${[...sources].join(", ") || "-"})`);
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(200);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** `--proxy-mode X` / `--proxy-mode=X`; iptables by default. */
function demoMode(args: string[]): "iptables" | "nftables" {
  const i = args.findIndex((a) => a === "--proxy-mode" || a.startsWith("--proxy-mode="));
  const mode = i < 0 ? "iptables" : args[i].includes("=") ? args[i].split("=")[1] : args[i + 1];
  if (mode !== "iptables" && mode !== "nftables") {
    console.error(`demo: --proxy-mode must be iptables or nftables, not ${JSON.stringify(mode)}`);
    Deno.exit(2);
  }
  return mode;
}

async function main() {
  const mode = demoMode(Deno.args);
  const why = sandboxUnavailableReason();
  if (why) {
    console.error(`demo: ${why}`);
    Deno.exit(1);
  }
  cleanupStale();
  step("Building a node with three web pods and an outside client (network namespaces)");
  const sb = await Sandbox.create({});
  let sim: SimulatorProcess | undefined;
  let agent: ReturnType<Sandbox["spawn"]> | undefined;
  try {
    for (const [name, ip] of PODS) {
      await sb.addPod(name, ip);
      await sb.startServer(sb.pod(name).ns, { tcp: [8080], udp: [5353] });
    }
    await sb.addPod("client-pod", "10.244.0.50");
    console.log(
      `  node ${sb.node} (${sb.nodeIP}), client ${sb.client} (${sb.clientIP}), pods ${
        PODS.map((p) => p[1]).join(", ")
      }`,
    );

    step("Starting the API server simulator with examples/*.yaml");
    const examples = ["node.yaml", "web.yaml", "dns.yaml", "broken.yaml"].map((f) =>
      `${PROJECT_ROOT}examples/${f}`
    );
    sim = await SimulatorProcess.start({ netns: sb.node, load: examples });
    console.log(`  serving ${sim.url} inside the node namespace`);

    /** The mode's rules as an operator lists them: iptables-save, or the nftables table. */
    const rules = async (): Promise<string> =>
      mode === "nftables"
        ? (await sb.tryExec(sb.node, "nft", ["list", "table", "ip", "kube-proxy"])).stdout
        : (await sb.tryExec(sb.node, "iptables-save", [])).stdout;
    const webVIP = mode === "nftables" ? `${WEB_VIP} . tcp . 80 : goto` : "demo/web:http cluster IP";
    const dnsVIP = mode === "nftables" ? `${DNS_VIP} . udp . 53 : goto` : "demo/dns:dns cluster IP";
    const webRejected = mode === "nftables"
      ? `${WEB_VIP} . tcp . 80 comment "demo/web:http" : goto reject-chain`
      : "demo/web:http has no endpoints";

    step(`Starting deno-kube-proxy in ${mode} mode in the node namespace (the \`start\` task's permissions)`);
    const cmd = agentCommand([
      "--proxy-mode",
      mode,
      "--kubeconfig",
      sim.kubeconfig,
      "--hostname-override",
      "node1",
      "--cluster-cidr",
      "10.244.0.0/16",
      "--iptables-min-sync-period",
      "0s",
      "--healthz-bind-address",
      "127.0.0.1:10256",
    ]);
    agent = sb.spawn(sb.node, cmd[0], cmd.slice(1));
    await waitFor("the first sync", async () => {
      const r = await rules();
      return r.includes(webVIP) && r.includes(dnsVIP);
    });
    const logLines = agent.output.split("\n").filter((l) => /Using|backend|skip|invalid|Invalid/i.test(l));
    for (const l of logLines.slice(0, 8)) console.log(`  agent: ${l.slice(0, 160)}`);

    const fromPod = await sb.probe(sb.pod("client-pod").ns);
    const fromClient = await sb.probe(sb.client);
    const fromNode = await sb.probe(sb.node);

    step("Traffic: 30 requests each");
    await spread(fromPod, `pod -> ClusterIP ${WEB_VIP}:80`, WEB_VIP, 80);
    await spread(fromNode, `node -> ClusterIP ${WEB_VIP}:80`, WEB_VIP, 80);
    await spread(fromClient, `outside client -> NodePort ${sb.nodeIP}:${NODE_PORT}`, sb.nodeIP, NODE_PORT);
    await spread(fromPod, `pod -> UDP ${DNS_VIP}:53 (ClientIP affinity)`, DNS_VIP, 53, 10, true);

    step("Live change: web-3 becomes not ready (EndpointSlice update)");
    const slice = (await readWebSlice())!;
    slice.endpoints![2].conditions = { ready: false, serving: false, terminating: true };
    await sim.upsert(slice);
    await waitFor("web-3 to leave the rules", async () => !(await rules()).includes("10.244.0.13:8080"));
    await spread(fromPod, `pod -> ClusterIP ${WEB_VIP}:80`, WEB_VIP, 80);

    step("Live change: every web endpoint removed -> connections are rejected at once");
    await sim.upsert({ ...slice, endpoints: [] } as EndpointSlice);
    await waitFor("the reject rule", async () => (await rules()).includes(webRejected));
    await spread(fromPod, `pod -> ClusterIP ${WEB_VIP}:80`, WEB_VIP, 80, 5);

    step("Live change: all three pods back");
    slice.endpoints![2].conditions = { ready: true, serving: true, terminating: false };
    await sim.upsert(slice);
    await waitFor("web endpoints back", async () => {
      const r = await rules();
      return r.includes("10.244.0.13:8080") && r.includes("10.244.0.11:8080");
    });
    await spread(fromPod, `pod -> ClusterIP ${WEB_VIP}:80`, WEB_VIP, 80);

    if (mode === "nftables") {
      step("The rules of demo/web (nft list table ip kube-proxy, its chains and map elements)");
      let inWeb = false;
      let container = "";
      for (const line of (await rules()).split("\n")) {
        const head = line.match(/^\t(?:map|set|chain) (\S+) \{$/);
        if (head) container = head[1];
        if (/^\tchain \S*demo\/web\//.test(line)) inWeb = true;
        if (inWeb) console.log(`  ${line}`);
        else if (line.includes(`${WEB_VIP} . tcp`)) {
          for (const el of line.replace(/^.*\{\s*|\s*\}\s*$/g, "").split(/,\s*/)) {
            if (el.includes(WEB_VIP)) console.log(`  \telement of ${container}: ${el.trim()}`);
          }
        }
        if (inWeb && line === "\t}") inWeb = false;
      }
    } else {
      step("The rules of demo/web (iptables-save -t nat, as an operator would grep them)");
      const nat = (await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout;
      const svcChain = nat.match(/-j (KUBE-SVC-[A-Z0-9]{16})/m)?.[1];
      for (const line of nat.split("\n")) {
        if (line.includes("demo/web") || (svcChain && line.includes(svcChain))) console.log(`  ${line}`);
      }
    }

    step("Health and the malformed Service");
    const health = await sb.tryExec(sb.node, Deno.execPath(), [
      "eval",
      "const r = await fetch('http://127.0.0.1:10256/livez'); console.log(r.status, await r.text())",
    ]);
    console.log(`  /livez: ${health.stdout.trim()}`);
    const broken = agent.output.split("\n").find((l) => l.includes("demo/broken"));
    console.log(`  agent: ${broken?.slice(0, 200) ?? "(no log line for demo/broken)"}`);
  } finally {
    step("Cleaning up: agent, simulator, namespaces");
    await agent?.stop().catch(() => {});
    await sim?.close().catch(() => {});
    await sb.destroy();
    console.log("  done");
  }

  async function readWebSlice(): Promise<EndpointSlice> {
    const objs = await readManifest(`${PROJECT_ROOT}examples/web.yaml`);
    return objs.find((o) => o.kind === "EndpointSlice") as EndpointSlice;
  }
}

if (import.meta.main) await main();
