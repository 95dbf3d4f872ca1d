/** `kube-proxy render`: output, flags, exit codes, errors on bad input, and the agent's start path. */
import assert from "node:assert/strict";
import { parseRenderOutput } from "../../lib/cli/render_output.ts";
import { configureLogging } from "../../lib/log.ts";
import { agentCommand } from "../../testkit/agent_command.ts";
import { mainModules } from "../../testkit/module_graph.ts";
import { CORPUS_FLAGS, corpusYaml, NODE, NODE_IP, runCli, SHAPES } from "./helpers.ts";

configureLogging({ sink: () => {} });

const MODES = ["iptables", "nftables", "ipvs"] as const;

Deno.test("render: the corpus renders in every mode with exit 0, one section per command and family", async () => {
  const yaml = corpusYaml();
  const expected: Record<string, string[]> = {
    iptables: [
      "sysctl -w net.ipv4.conf.all.route_localnet=1 (IPv4)",
      "nfacct add ct_state_invalid_dropped_pkts (IPv4)",
      "nfacct add localhost_nps_accepted_pkts (IPv4)",
      "iptables-nft-restore --noflush --counters -w 5 -W 100000 (IPv4)",
      "ip6tables-nft-restore --noflush --counters -w 5 -W 100000 (IPv6)",
      "ip6tables-nft -w 5 -t filter -N KUBE-FIREWALL (IPv6)",
      "ip6tables-nft -w 5 -t filter -I INPUT 1 -j KUBE-FIREWALL (IPv6)",
      "ip6tables-nft -w 5 -t filter -I OUTPUT 1 -j KUBE-FIREWALL (IPv6)",
    ],
    nftables: ["nft -f - (IPv4)", "nft -f - (IPv6)"],
    ipvs: [
      "ipset restore (IPv4)",
      "ipvsadm -R (IPv4)",
      "iptables-nft-restore --noflush --counters -w 5 -W 100000 (IPv4)",
      "ip -force -batch - (IPv4)",
      "ipset restore (IPv6)",
      "ipvsadm -R (IPv6)",
      "ip6tables-nft-restore --noflush --counters -w 5 -W 100000 (IPv6)",
      "ip -force -batch - (IPv6)",
    ],
  };
  for (const mode of MODES) {
    const r = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, `--proxy-mode=${mode}`], yaml);
    assert.equal(r.stderr, "", `${mode}: ${r.stderr}`);
    assert.equal(r.code, 0);
    const cmds = parseRenderOutput(r.stdout);
    assert.deepEqual(cmds.map((c) => `${[c.cmd, ...c.args].join(" ")} (${c.family})`), expected[mode], mode);
    const text = r.stdout;
    // Every ClusterIP of the corpus is in the rules (as a DNAT dispatch, a reject/drop, or a virtual server).
    for (const s of SHAPES) {
      assert.ok(text.includes(s.svc.clusterIP), `${mode}: ${s.name} ${s.svc.clusterIP}`);
    }
    assert.ok(text.includes("fd00:96::14"), `${mode}: the dual-stack Service's IPv6 ClusterIP`);
  }
});

Deno.test("render: --ip-family keeps one family; the output parses back into the commands", async () => {
  const yaml = corpusYaml();
  const all = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables"], yaml);
  const v6 = await runCli(
    ["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables", "--ip-family=IPv6"],
    yaml,
  );
  const cmds = parseRenderOutput(all.stdout);
  assert.deepEqual(parseRenderOutput(v6.stdout), cmds.filter((c) => c.family === "IPv6"));
  assert.ok(cmds[0].stdin.startsWith("add table ip kube-proxy"));
  assert.ok(cmds[1].stdin.startsWith("add table ip6 kube-proxy"));
  assert.ok(!v6.stdout.includes("add table ip kube-proxy"));
  const bad = await runCli(["render", "-f", "-", ...CORPUS_FLAGS, "--ip-family=v4"], yaml);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /--ip-family must be IPv4 or IPv6/);
});

Deno.test("render: bad input is reported with file, line, object and field, exit 2, and the rest is rendered", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kp-render-" });
  try {
    await Deno.writeTextFile(`${dir}/cluster.yaml`, corpusYaml(SHAPES.filter((s) => s.name === "clusterip")));
    await Deno.writeTextFile(
      `${dir}/broken.yaml`,
      "apiVersion: v1\nkind: Service\nmetadata: {name: broken, namespace: dp}\nspec:\n  clusterIP: 10.96.0.999\n" +
        "  clusterIPs: [10.96.0.999]\n  ports: [{port: 80}]\n",
    );
    await Deno.writeTextFile(
      `${dir}/typo.yaml`,
      "apiVersion: v1\nkind: Service\nmetadata: {name: typo, namespace: dp}\nspec:\n  clusterIP: 10.96.0.7\n" +
        "  ports:\n    - port: 80\n      targetport: 8080\n",
    );
    await Deno.writeTextFile(`${dir}/syntax.yaml`, "apiVersion: v1\nkind: Service\nmetadata: {name: x\n");
    await Deno.writeTextFile(
      `${dir}/partly.yaml`,
      "apiVersion: v1\nkind: Service\nmetadata: {name: partly, namespace: dp}\nspec:\n  clusterIP: 10.96.0.8\n" +
        "  externalIPs: [172.30.0.8, 172.30.0.300]\n  ports: [{port: 80}]\n",
    );
    const r = await runCli(["render", "-f", dir, ...CORPUS_FLAGS, "--ip-family=IPv4"]);
    assert.equal(r.code, 2);
    assert.deepEqual(r.stderr.trimEnd().split("\n"), [
      `error: ${dir}/syntax.yaml:4:1: not valid YAML or JSON: Flow map in block collection must be sufficiently indented ` +
      "and end with a }; nothing in this document is used",
      `error: ${dir}/typo.yaml:8:7: Service dp/typo: spec.ports[0].targetport: unknown field "targetport" ` +
      "(Kubernetes API type V1Service); nothing is rendered for it",
      `error: ${dir}/broken.yaml:6:16: Service dp/broken: spec.clusterIPs[0]: Service has an invalid cluster IP: ` +
      "nothing is rendered for this Service",
      `error: ${dir}/partly.yaml:6:29: Service dp/partly: spec.externalIPs[1]: Skipping invalid IP: the agent ` +
      "ignores this value and renders the rest",
    ]);
    assert.ok(r.stdout.includes('"dp/clusterip:p cluster IP"'), "the good Service is rendered");
    // No endpoints: the valid externalIP gets its REJECT rule, the invalid one nothing.
    assert.ok(
      r.stdout.includes('"dp/partly has no endpoints"') && r.stdout.includes("-d 172.30.0.8 --dport 80"),
    );
    for (const gone of ["dp/broken", "dp/typo", "10.96.0.999", "172.30.0.300"]) {
      assert.ok(!r.stdout.includes(gone), gone);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("render: the node comes from its manifest or --node-ip; without either it says what to give", async () => {
  const svc = corpusYaml(SHAPES.filter((s) => s.name === "nodeport")).replace(/^[\s\S]*?---\n/, ""); // no Node
  const none = await runCli(["render", "-f", "-", "--hostname-override", NODE], svc);
  assert.equal(none.code, 2);
  assert.match(none.stderr, /no Node named "node1" among the manifests: give its manifest, or --node-ip/);
  const other = await runCli(["render", "-f", "-", "--hostname-override", "node9"], corpusYaml([]));
  assert.match(other.stderr, /no Node named "node9" among the manifests \(there is "node1"\)/);
  const byFlag = await runCli([
    "render",
    "-f",
    "-",
    ...CORPUS_FLAGS,
    "--node-ip",
    NODE_IP,
    "--ip-family=IPv4",
  ], svc);
  assert.equal(byFlag.code, 0, byFlag.stderr);
  const withNode = await runCli(
    ["render", "-f", "-", ...CORPUS_FLAGS, "--ip-family=IPv4"],
    corpusYaml([]) + "---\n" + svc,
  );
  assert.equal(withNode.stdout, byFlag.stdout, "same rules either way");
  assert.ok(byFlag.stdout.includes("KUBE-NODEPORTS"));
  const nodeCIDR = await runCli(
    ["render", "-f", "-", "--hostname-override", NODE, "--node-ip", NODE_IP, "--detect-local-mode=NodeCIDR"],
    svc,
  );
  assert.equal(nodeCIDR.code, 2);
  assert.match(nodeCIDR.stderr, /no spec.podCIDRs, which --detect-local-mode=NodeCIDR needs/);
  const badIP = await runCli(["render", "-f", "-", "--hostname-override", NODE, "--node-ip", "1.2.3"], svc);
  assert.match(badIP.stderr, /--node-ip: "1.2.3" is not an IP address/);
});

Deno.test("render: takes the agent's flags and config, its own -f, and refuses what is not for it", async () => {
  const help = await runCli(["render", "--help"]);
  assert.equal(help.code, 0);
  assert.match(help.stdout, /Usage:\n {2}kube-proxy render \[flags\]/);
  assert.match(help.stdout, / {2}-f, --manifests stringArray {2,}Manifest files or directories/);
  assert.match(help.stdout, /--proxy-mode ProxyMode/, "the agent's flags");
  assert.equal((await runCli(["render", "--bogus"])).code, 2);
  const noFiles = await runCli(["render", "--hostname-override", NODE]);
  assert.equal(noFiles.code, 2);
  assert.match(noFiles.stderr, /no manifests: give -f FILE, -f DIR or -f - \(stdin\)/);
  assert.match(
    (await runCli(["render", "-f", "x", "--cleanup"])).stderr,
    /--cleanup and --init-only are not for/,
  );
  assert.match((await runCli(["render", "extra"])).stderr, /"kube-proxy render" does not take any arguments/);
  // An invalid configuration fails as the agent's does (exit 1).
  const invalid = await runCli(["render", "-f", "-", "--iptables-masquerade-bit=40"]);
  assert.equal(invalid.code, 1);
  assert.match(invalid.stderr, /failed validate/);
  // A config file, as the agent reads it.
  const dir = await Deno.makeTempDir({ prefix: "kp-render-" });
  try {
    await Deno.writeTextFile(
      `${dir}/config.yaml`,
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n" +
        "clusterCIDR: 10.244.0.0/16\nhostnameOverride: node1\n",
    );
    const r = await runCli(
      ["render", "-f", "-", "--config", `${dir}/config.yaml`, "--ip-family=IPv4"],
      corpusYaml(),
    );
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stdout.startsWith("# nft -f - (IPv4)\n"));
    assert.ok(
      r.stdout.includes(
        "add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.244.0.0/16 mark set mark or 0x00004000",
      ),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("render: the agent's start path imports neither lib/cli (beyond the dispatch) nor client-node", async () => {
  const statics = await mainModules(false);
  assert.ok(statics.some((s) => s.endsWith("/lib/agent.ts")));
  assert.deepEqual(
    statics.filter((s) => s.includes("/lib/cli/")).map((s) => s.replace(/^.*\/lib\//, "lib/")),
    [
      "lib/cli/subcommands.ts",
    ],
  );
  assert.deepEqual(statics.filter((s) => s.includes("client-node")), []);
});

Deno.test({
  name: "render: runs under the agent's own permissions (the start task's flags), from stdin",
  fn: async () => {
    const [cmd, ...args] = agentCommand(["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables"]);
    const child = new Deno.Command(cmd, { args, stdin: "piped", stdout: "piped", stderr: "piped" }).spawn();
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(corpusYaml()));
    await w.close();
    const out = await child.output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    const inProcess = await runCli(
      ["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables"],
      corpusYaml(),
    );
    assert.equal(new TextDecoder().decode(out.stdout), inProcess.stdout);
  },
});
