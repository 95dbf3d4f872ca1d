/**
 * `/statusz`, `/flagz` and `/configz` side by side with upstream kube-proxy v1.37.2 (built by
 * scripts/build_k8s.sh): both run with the same flags against one real kube-apiserver, each in the node
 * namespace of its own sandbox (whatever they write to netfilter stays there), and the same requests go to
 * both listeners. What must match: which listener serves which page, status codes, content types and
 * `Warning` headers under every kind of `Accept`, the text pages' layout, the objects' fields, every flag's
 * value and the whole configuration (but for the kubeconfig path, which differs by design); what may differ is
 * each binary's own facts (start time, uptime, `Go version` / `goVersion`, binary version) and the random
 * delimiter of the text pages (upstream picks one of `:`, `: `, `=`, ` ` so that nobody parses them).
 */

import assert from "node:assert/strict";
import { KubeApiServer, kubeApiServerUnavailableReason } from "../../testkit/kube_apiserver.ts";
import { agentCommand } from "../../testkit/agent_command.ts";
import { privilegedTest } from "../../testkit/privileged.ts";
import { Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import {
  LISTENER_NODE,
  nsGet,
  type NsResponse,
  prepareProxyUser,
  startUpstreamProxy,
  waitForListener,
} from "../../testkit/upstream_listener.ts";

const unavailable = sandboxUnavailableReason(["ip", "iptables", "iptables-save", "conntrack", "sysctl"]) ??
  kubeApiServerUnavailableReason(["kube-apiserver", "etcd", "kube-proxy"]);

const METRICS = "http://127.0.0.1:10249";
const HEALTHZ = "http://127.0.0.1:10256";
const JSON_BETA = "application/json;as=Statusz;v=v1beta1;g=config.k8s.io";

/** The text page's lines with the delimiter (one of upstream's four) normalized to `|`. */
function statuszLines(body: string): string[] {
  return body.split("\n").map((l) =>
    l.replace(/^(Started|Up|Go version|Binary version|Emulation version|Paths)(: |:|=| ) /, "$1| ")
  );
}

/** Drops the binary's own facts from a statusz page (text lines or object). */
function withoutOwnFacts(lines: string[]): string[] {
  return lines.map((l) => l.replace(/^(Started|Up|Go version|Binary version)\| .*/, "$1| <own>"));
}

function flagzLines(body: string): string[] {
  return body.split("\n").map((l) => l.replace(/^([a-z0-9-]+)(: |:|=| )/, "$1|"));
}

privilegedTest(unavailable, {
  name: "/statusz, /flagz and /configz: the same pages, types and content as upstream kube-proxy v1.37.2",
  async fn() {
    await using api = await KubeApiServer.start({ tokenUsers: ["zp-upstream", "zp-ours"] });
    await using upSb = await Sandbox.create();
    await using ourSb = await Sandbox.create();
    const procs: SandboxProcess[] = [];
    try {
      await api.attach(upSb.node);
      await api.attach(ourSb.node);
      await prepareProxyUser(api, "zp-upstream", upSb);
      await prepareProxyUser(api, "zp-ours", ourSb);
      // Kubeconfig paths that differ by a suffix only (each side has its own token), normalized below.
      const kubeconfig = `${api.dir}/zpages-kubeconfig.yaml`;
      // Upstream's (startUpstreamProxy) flags.
      const common = [
        `--hostname-override=${LISTENER_NODE}`,
        "--cluster-cidr=10.244.0.0/16",
        "--conntrack-max-per-core=0",
      ];
      await api.writeKubeconfig({ token: api.tokens.get("zp-upstream"), path: `${kubeconfig}.up` });
      await api.writeKubeconfig({ token: api.tokens.get("zp-ours"), path: `${kubeconfig}.ours` });
      procs.push(startUpstreamProxy(upSb, `${kubeconfig}.up`));
      const [cmd, ...args] = agentCommand([`--kubeconfig=${kubeconfig}.ours`, ...common]);
      procs.push(ourSb.spawn(ourSb.node, cmd, args));
      const [up, ours] = [[upSb, procs[0]], [ourSb, procs[1]]] as const;
      await Promise.all([up, ours].map(([sb, p]) => waitForListener(sb, sb.node, `${METRICS}/healthz`, p)));
      const get = (side: readonly [Sandbox, SandboxProcess], url: string, h: Record<string, string> = {}) =>
        nsGet(side[0], side[0].node, url, h);
      const both = async (
        url: string,
        h: Record<string, string> = {},
      ): Promise<[NsResponse, NsResponse]> => [await get(up, url, h), await get(ours, url, h)];
      const headersOf = (r: NsResponse) => ({
        status: r.status,
        type: r.headers["content-type"],
        warning: r.headers["warning"],
      });

      // Which listener serves what.
      for (const path of ["/statusz", "/flagz", "/configz"]) {
        const [u, o] = await both(`${HEALTHZ}${path}`);
        assert.equal(u.status, 404, `upstream ${HEALTHZ}${path}`);
        assert.equal(o.status, 404, `ours ${HEALTHZ}${path}`);
      }

      // statusz as text, under no Accept, text/plain and */*.
      for (const accept of [undefined, "text/plain", "*/*"]) {
        const [u, o] = await both(`${METRICS}/statusz`, accept ? { accept } : {});
        assert.deepEqual(headersOf(o), headersOf(u), `statusz, Accept ${accept}`);
        assert.deepEqual(withoutOwnFacts(statuszLines(o.body)), withoutOwnFacts(statuszLines(u.body)));
        assert.match(o.body, /\nGo version(: |:|=| ) deno \d+\.\d+\.\d+\n/);
      }
      // statusz as objects: JSON (compact, pretty for curl), YAML, the deprecated v1alpha1.
      for (
        const h of <Record<string, string>[]> [
          { accept: JSON_BETA },
          { accept: JSON_BETA, "user-agent": "curl/8.5.0" },
          { accept: JSON_BETA.replace("v1beta1", "v1alpha1") },
          { accept: JSON_BETA.replace("application/json", "application/yaml") },
        ]
      ) {
        const [u, o] = await both(`${METRICS}/statusz`, h);
        assert.deepEqual(headersOf(o), headersOf(u), JSON.stringify(h));
        // JSON (compact or indented) and YAML alike: the value after each own key.
        const own = /("?(?:startTime|uptimeSeconds|goVersion|binaryVersion)"?: ?)("[^"]*"|[^,\n}]+)/g;
        assert.equal(o.body.replace(own, "$1<own>"), u.body.replace(own, "$1<own>"), JSON.stringify(h));
      }
      // Not acceptable: a plain structured type, an unknown one, a wrong group.
      for (
        const accept of [
          "application/json",
          "application/yaml",
          "text/html",
          JSON_BETA.replace("config.k8s.io", "x"),
        ]
      ) {
        const [u, o] = await both(`${METRICS}/statusz`, { accept });
        assert.deepEqual(headersOf(o), headersOf(u), accept);
        assert.equal(o.body, u.body, accept);
      }

      // flagz: every flag, every value (the kubeconfig path differs by its suffix).
      const sameKubeconfig = (s: string) =>
        s.replace(/zpages-kubeconfig\.yaml\.(up|ours)/g, "zpages-kubeconfig.yaml");
      for (const accept of [undefined, "text/plain"]) {
        const [u, o] = await both(`${METRICS}/flagz`, accept ? { accept } : {});
        assert.deepEqual(headersOf(o), headersOf(u));
        assert.deepEqual(flagzLines(sameKubeconfig(o.body)), flagzLines(sameKubeconfig(u.body)));
      }
      const flagzJson = JSON_BETA.replace("Statusz", "Flagz");
      const [uf, of] = await both(`${METRICS}/flagz`, { accept: flagzJson });
      assert.deepEqual(headersOf(of), headersOf(uf));
      assert.deepEqual(JSON.parse(sameKubeconfig(of.body)), JSON.parse(sameKubeconfig(uf.body)));

      // configz: the whole configuration.
      const [uc, oc] = await both(`${METRICS}/configz`);
      assert.deepEqual(headersOf(oc), headersOf(uc));
      assert.deepEqual(JSON.parse(sameKubeconfig(oc.body)), JSON.parse(sameKubeconfig(uc.body)));
    } finally {
      await Promise.all(procs.map((p) => p.stop(5000).catch(() => {})));
    }
  },
});

privilegedTest(unavailable, {
  name: "/flagz off by its gate, /statusz and /configz in nftables mode: as upstream kube-proxy v1.37.2",
  async fn() {
    await using api = await KubeApiServer.start({ tokenUsers: ["zp-upstream", "zp-ours"] });
    await using upSb = await Sandbox.create();
    await using ourSb = await Sandbox.create();
    const procs: SandboxProcess[] = [];
    try {
      await api.attach(upSb.node);
      await api.attach(ourSb.node);
      await prepareProxyUser(api, "zp-upstream", upSb);
      await prepareProxyUser(api, "zp-ours", ourSb);
      const kubeconfig = `${api.dir}/zpages-kubeconfig.yaml`;
      await api.writeKubeconfig({ token: api.tokens.get("zp-upstream"), path: `${kubeconfig}.up` });
      await api.writeKubeconfig({ token: api.tokens.get("zp-ours"), path: `${kubeconfig}.ours` });
      const flags = [
        "--proxy-mode=nftables",
        "--masquerade-all",
        "--feature-gates=ComponentFlagz=false",
        "--iptables-sync-period=40s",
      ];
      procs.push(startUpstreamProxy(upSb, `${kubeconfig}.up`, flags));
      const [cmd, ...args] = agentCommand([
        `--kubeconfig=${kubeconfig}.ours`,
        `--hostname-override=${LISTENER_NODE}`,
        "--cluster-cidr=10.244.0.0/16",
        "--conntrack-max-per-core=0",
        ...flags,
      ]);
      procs.push(ourSb.spawn(ourSb.node, cmd, args));
      const sides = [[upSb, procs[0]], [ourSb, procs[1]]] as const;
      await Promise.all(sides.map(([sb, p]) => waitForListener(sb, sb.node, `${METRICS}/healthz`, p)));
      const both = (url: string, h: Record<string, string> = {}) =>
        Promise.all(sides.map(([sb]) => nsGet(sb, sb.node, url, h)));
      const [uf, of] = await both(`${METRICS}/flagz`);
      assert.equal(uf.status, 404);
      assert.equal(of.status, 404);
      const [us, os] = await both(`${METRICS}/statusz`, { accept: JSON_BETA });
      assert.deepEqual(JSON.parse(os.body).paths, JSON.parse(us.body).paths);
      assert.ok(!JSON.parse(us.body).paths.includes("/flagz"));
      const sameKubeconfig = (s: string) =>
        s.replace(/zpages-kubeconfig\.yaml\.(up|ours)/g, "zpages-kubeconfig.yaml");
      const [uc, oc] = await both(`${METRICS}/configz`);
      assert.deepEqual(JSON.parse(sameKubeconfig(oc.body)), JSON.parse(sameKubeconfig(uc.body)));
    } finally {
      await Promise.all(procs.map((p) => p.stop(5000).catch(() => {})));
    }
  },
});
