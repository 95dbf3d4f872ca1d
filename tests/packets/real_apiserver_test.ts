/**
 * The agent against the real kube-apiserver (issue 12 item 2): kube-apiserver v1.37.2 and etcd, built by
 * scripts/build_k8s.sh, run in a control-plane namespace joined to the sandbox's node namespace
 * (testkit/kube_apiserver.ts); the agent runs in the node namespace with the `start` task's permissions.
 *
 * It authenticates first as a static-token user bound to the built-in `system:node-proxier` ClusterRole
 * (the role deploy/daemonset.yaml binds), then, after a restart of the agent, with a ServiceAccount token
 * from the TokenRequest API in a kubeconfig, the ServiceAccount and ClusterRoleBinding taken verbatim from
 * deploy/daemonset.yaml. Services and EndpointSlices are created, changed and deleted through the API
 * (ClusterIPs and NodePorts allocated by the server), and real packets show each result; the agent's
 * Events are read back; kube-apiserver is restarted under traffic.
 */

import assert from "node:assert/strict";
import { parseAllDocuments } from "yaml";
import { KubeApiServer, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { PROJECT_ROOT } from "../../testkit/agent_command.ts";
import { createKubeClient } from "../../lib/kube/client.ts";
import { EventRecorder, nodeRef } from "../../lib/kube/events.ts";
import type { Probe } from "../../testkit/probe.ts";
import { listNetns, Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import type { KubeEvent, KubeObject, Service } from "../../lib/kube/types.ts";
import {
  endpointSlice,
  eventually,
  nodeObject,
  NS,
  type PortSpec,
  service,
  sleep,
  startSandboxAgent,
  tally,
} from "./helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason(["ip", "iptables", "iptables-save", "conntrack", "sysctl"]) ??
  kubeApiServerUnavailableReason();
const NODE = "node1";
const OTHER_NODE = "node2";
const PROXIER_USER = "dkp-proxier";

function startAgent(sb: Sandbox, kubeconfig: string): SandboxProcess {
  return startSandboxAgent(sb, kubeconfig, { nodeName: NODE, syncPeriodS: 5 });
}

/** Pod names answering `count` sequential TCP probes (or outcomes like `refused`). */
async function hits(probe: Probe, host: string, port: number, count: number): Promise<string[]> {
  return await probe.repeat({ op: "tcp", host, port, timeoutMs: 1000 }, count);
}

/**
 * Waits until a TCP probe to host:port gives `want`: a pod name, an outcome (`refused`), or `ok` for any
 * answer; fails at once if the agent exits.
 */
async function until(
  agent: SandboxProcess,
  probe: Probe,
  host: string,
  port: number,
  want: string,
  timeoutMs = 15_000,
): Promise<void> {
  let exited = false;
  agent.status.then(() => exited = true);
  await eventually(
    `${host}:${port} to answer ${want}`,
    async () => {
      if (exited) throw new Error("the agent exited");
      const r = await probe.tcp(host, port, { timeoutMs: 300 });
      const got = r.result === "ok" ? r.answer!.split(" ")[0] : r.result;
      return got === want || (want === "ok" && r.result === "ok") ? got : undefined;
    },
    timeoutMs,
    100,
  ).catch((err) => {
    throw new Error(`${err.message}\nagent output:\n${agent.tail()}`);
  });
}

/** The objects of deploy/daemonset.yaml of the given kinds. */
async function deployObjects(...kinds: string[]): Promise<KubeObject[]> {
  const text = await Deno.readTextFile(`${PROJECT_ROOT}deploy/daemonset.yaml`);
  return parseAllDocuments(text).map((d) => d.toJSON() as KubeObject).filter((o) => kinds.includes(o.kind!));
}

/** The agent's events.k8s.io Events about its Node with `reason`. */
async function nodeEvents(api: KubeApiServer, reason: string): Promise<KubeEvent[]> {
  return (await api.events("default")).filter((e) =>
    e.reason === reason && e.regarding?.kind === "Node" && e.regarding?.name === NODE
  );
}

privilegedTest(unavailable, {
  name:
    "real kube-apiserver: the agent with node-proxier RBAC serves what the API says and survives a restart",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    const [api, sb] = await Promise.all([
      KubeApiServer.start({ tokenUsers: [PROXIER_USER] }),
      Sandbox.create({ pods: ["pod-a", "pod-b", "pod-c", "pod-x"] }),
    ]);
    let agent: SandboxProcess | undefined;
    try {
      await api.attach(sb.node);
      const a = sb.pod("pod-a"), b = sb.pod("pod-b"), c = sb.pod("pod-c"), x = sb.pod("pod-x");
      await Promise.all([a, b, c].map((p) => sb.startServer(p.ns, { tcp: [8080], udp: [8081] })));
      const local = (ip: string) => ({ ip, node: NODE });

      await api.create({ apiVersion: "v1", kind: "Namespace", metadata: { name: NS } });
      await api.create(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      await api.create(nodeObject(OTHER_NODE, "192.168.78.1", "10.244.1.0/24"));
      await api.create({
        apiVersion: "rbac.authorization.k8s.io/v1",
        kind: "ClusterRoleBinding",
        metadata: { name: "dkp-proxier-user" },
        roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node-proxier" },
        subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name: PROXIER_USER }],
      } as KubeObject);
      await api.create(service({ name: "web", clusterIP: "10.96.0.10" }));
      await api.create(endpointSlice("web", [local(a.ip), local(b.ip)]));

      const kubeconfig = await api.writeKubeconfig({ token: api.tokens.get(PROXIER_USER) });
      agent = startAgent(sb, kubeconfig);
      const px = await sb.probe(x.ns);
      const pclient = await sb.probe(sb.client);

      await t.step("synced as a system:node-proxier user: the ClusterIP reaches both endpoints", async () => {
        await until(agent!, px, "10.96.0.10", 80, "ok", 30_000);
        const got = tally(await hits(px, "10.96.0.10", 80, 40));
        assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));
      });

      await t.step("the agent's Starting Event about its Node is on the server", async () => {
        const [ev] = await eventually("the Starting event", async () => {
          const evs = await nodeEvents(api, "Starting");
          return evs.length > 0 ? evs : undefined;
        });
        assert.equal(ev.type, "Normal");
        assert.equal(ev.action, "StartKubeProxy");
        assert.equal(ev.reportingController, "kube-proxy");
        assert.equal(ev.reportingInstance, `kube-proxy-${NODE}`);
        assert.deepEqual(ev.regarding, { kind: "Node", apiVersion: "v1", name: NODE, uid: NODE });
      });

      await t.step("as the same user, a repeated Event becomes a series (POST, then PATCH)", async () => {
        const kc = await api.writeKubeconfig({ token: api.tokens.get(PROXIER_USER), local: true });
        const client = await createKubeClient({ kubeconfig: kc });
        try {
          const rec = new EventRecorder(client, { hostname: "series-check" });
          for (let i = 0; i < 3; i++) {
            rec.event(nodeRef(OTHER_NODE), "Warning", "SeriesCheck", "Check", "same");
          }
          await rec.flush();
          assert.deepEqual(rec.counts, { posted: 1, patched: 2, dropped: 0, failed: 0 });
        } finally {
          client.close();
        }
        const evs = (await api.events("default")).filter((e) => e.reason === "SeriesCheck");
        assert.equal(evs.length, 1, JSON.stringify(evs));
        assert.equal(evs[0].series?.count, 3, JSON.stringify(evs[0]));
      });

      let np: Service | undefined;
      const npPorts: PortSpec[] = [{ name: "tcp", port: 80 }, { name: "udp", port: 53, protocol: "UDP" }];
      await t.step(
        "a NodePort Service whose ClusterIP and NodePorts the server allocates (TCP and UDP)",
        async () => {
          const want = service({ name: "np", clusterIP: "", type: "NodePort", ports: npPorts });
          delete want.spec!.clusterIP;
          delete want.spec!.clusterIPs;
          np = await api.create(want);
          const clusterIP = np.spec!.clusterIP!;
          const [tcpPort, udpPort] = np.spec!.ports!.map((p) => p.nodePort!);
          assert.match(clusterIP, /^10\.96\./);
          assert.ok(tcpPort >= 30000 && udpPort >= 30000, JSON.stringify(np.spec!.ports));
          await api.create(endpointSlice("np", [local(c.ip)], npPorts));
          await until(agent!, pclient, sb.nodeIP, tcpPort, "pod-c");
          assert.equal((await px.tcp(clusterIP, 80)).answer?.split(" ")[0], "pod-c");
          const u = await pclient.udp(sb.nodeIP, udpPort);
          assert.equal(u.answer?.split(" ")[0], "pod-c", JSON.stringify(u));
          const u2 = await px.udp(clusterIP, 53);
          assert.equal(u2.answer?.split(" ")[0], "pod-c", JSON.stringify(u2));
        },
      );

      await t.step("an EndpointSlice update moves web's traffic to pod-c", async () => {
        await api.update(endpointSlice("web", [local(c.ip)]));
        await eventually("web to reach only pod-c", async () => {
          const got = tally(await hits(px, "10.96.0.10", 80, 20));
          return Object.keys(got).join() === "pod-c" ? got : undefined;
        });
      });

      await t.step("no endpoints: REJECT; Service deleted: its rules are gone", async () => {
        const clusterIP = np!.spec!.clusterIP!;
        const tcpPort = np!.spec!.ports![0].nodePort!;
        await api.remove(endpointSlice("np", [], npPorts));
        await until(agent!, px, clusterIP, 80, "refused");
        assert.equal((await pclient.tcp(sb.nodeIP, tcpPort, { timeoutMs: 2000 })).result, "refused");
        await api.remove(np!);
        await eventually("np's rules to go", async () => {
          const nat = (await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout;
          const filter = (await sb.exec(sb.node, "iptables-save", ["-t", "filter"])).stdout;
          return nat.includes(`${NS}/np:`) || filter.includes(`${NS}/np:`) ? undefined : true;
        });
        // Nothing owns the ClusterIP any more: it is routed like any address, towards the client, which
        // does not forward it: no answer at all.
        assert.equal((await px.tcp(clusterIP, 80, { timeoutMs: 500 })).result, "timeout");
      });

      await t.step(
        "kube-apiserver restarts: no failed connection meanwhile, a Service created afterwards is served",
        async () => {
          const held = await px.open("10.96.0.10", 80);
          assert.equal(held.result, "ok", JSON.stringify(held));
          const logBefore = agent!.output.length;
          let stop = false;
          const outcomes: string[] = [];
          const traffic = (async () => {
            while (!stop) {
              const r = await px.tcp("10.96.0.10", 80, { timeoutMs: 1000 });
              outcomes.push(r.result === "ok" ? r.answer!.split(" ")[0] : r.result);
              const h = await px.send(held.conn!, 1000);
              outcomes.push(h.result === "ok" ? `held:${h.answer!.split(" ")[0]}` : `held:${h.result}`);
              await sleep(20);
            }
          })();
          try {
            const downMs = await api.restart();
            await api.create(service({ name: "after", clusterIP: "10.96.0.30" }));
            await api.create(endpointSlice("after", [local(a.ip)]));
            const t0 = performance.now();
            await until(agent!, px, "10.96.0.30", 80, "pod-a", 30_000);
            console.log(
              `kube-apiserver away ${Math.round(downMs)} ms; the new Service served ${
                Math.round(performance.now() - t0)
              } ms after its creation`,
            );
          } finally {
            stop = true;
            await traffic;
          }
          const got = tally(outcomes);
          assert.deepEqual(Object.keys(got).sort(), ["held:pod-c", "pod-c"], JSON.stringify(got));
          assert.ok(outcomes.length > 40, `only ${outcomes.length} probes during the restart`);
          // The restart was real for the agent: its watches broke and it reconnected.
          const during = agent!.output.slice(logBefore);
          assert.match(
            during,
            /Watch connection failed|Watch failed|List failed|relisting/,
            during.slice(-3000),
          );
          await px.closeConn(held.conn!);
        },
      );

      await t.step(
        "default/kubernetes: the server's own Service reaches kube-apiserver through the rules",
        async () => {
          const caFile = `${api.dir}/ca.crt`;
          const script = `const c = Deno.createHttpClient({ caCerts: [Deno.readTextFileSync(${
            JSON.stringify(caFile)
          })] }); const r = await fetch("https://10.96.0.1:443/readyz", { client: c }); console.log(r.status, await r.text());`;
          const r = await sb.exec(sb.node, Deno.execPath(), ["eval", script]);
          assert.equal(r.stdout.trim(), "200 ok");
        },
      );

      await t.step(
        "a ServiceAccount token from TokenRequest (tokenFile), with deploy/daemonset.yaml's RBAC",
        async () => {
          const startsBefore = (await nodeEvents(api, "Starting")).length;
          await agent!.stop(5000);
          for (const obj of await deployObjects("ServiceAccount", "ClusterRoleBinding")) {
            await api.create(obj);
          }
          const sa = (await deployObjects("ServiceAccount"))[0].metadata!;
          // In a token file, as the projected volume in-cluster config reads.
          const tokenFile = `${api.dir}/sa-token`;
          await Deno.writeTextFile(tokenFile, await api.createToken(sa.namespace!, sa.name!));
          const kc = await api.writeKubeconfig({ tokenFile });
          agent = startAgent(sb, kc);
          await api.create(service({ name: "sa", clusterIP: "10.96.0.31" }));
          await api.create(endpointSlice("sa", [local(b.ip)]));
          await until(agent, px, "10.96.0.31", 80, "pod-b", 30_000);
          assert.equal((await px.tcp("10.96.0.10", 80)).answer?.split(" ")[0], "pod-c");
          await eventually("a second Starting event", async () => {
            const n = (await nodeEvents(api, "Starting")).length;
            return n > startsBefore ? n : undefined;
          });
          assert.doesNotMatch(agent.output, /Forbidden|Unauthorized/, agent.tail());
        },
      );
    } finally {
      await agent?.stop(5000).catch(() => {});
      await sb.destroy();
      await api.stop();
    }
    assert.deepEqual(listNetns().filter((n) => n.startsWith(sb.prefix) || n === api.netns), []);
  },
});
