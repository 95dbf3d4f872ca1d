/**
 * The agent's Deno permissions (deno.json's `start` and `compile` tasks) are enough for everything it
 * does: static checks of the task strings and of the programs lib/ spawns, and the real agent run under the
 * `start` task's exact flags, in a network namespace, against the API server simulator with every
 * kubeconfig form upstream accepts (token, tokenFile, client certificate, insecure-skip-tls-verify, exec
 * plugin, in-cluster service account), asserting that it programs a Service.
 */
import assert from "node:assert/strict";
import { agentCommand, EXTRA_PERMISSIONS_VAR, PROJECT_ROOT } from "../testkit/agent_command.ts";
import { SimulatorProcess } from "../testkit/apiserver_process.ts";
import { makeTestPki } from "../testkit/certs.ts";
import { privilegedTest } from "../testkit/privileged.ts";
import { Sandbox, sandboxUnavailableReason } from "../testkit/sandbox.ts";
import { usePrivateXtablesLock } from "../testkit/xtables_lock.ts";
import { endpointSlice, eventually, nodeObject, service } from "./packets/helpers.ts";

const denoJson = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));

/** A task's command line (a task is a string, or an object with `command` and `description`). */
function taskCommand(task: string | { command: string }): string {
  return typeof task === "string" ? task : task.command;
}

function permissionFlags(task: string): string[] {
  return task.split(/\s+/).filter((w) => w.startsWith("--allow-"));
}

function runtimeFlags(task: string): string[] {
  return task.split(/\s+/).filter((w) => w.startsWith("--v8-flags="));
}

function allowRun(flags: string[]): Set<string> {
  const flag = flags.find((f) => f.startsWith("--allow-run="));
  return new Set(flag ? flag.slice("--allow-run=".length).split(",") : []);
}

async function* sourceFiles(dir: URL): AsyncGenerator<URL> {
  for await (const e of Deno.readDir(dir)) {
    if (e.isDirectory) yield* sourceFiles(new URL(`${e.name}/`, dir));
    else if (e.name.endsWith(".ts")) yield new URL(e.name, dir);
  }
}

Deno.test("start and compile tasks grant exactly the same permissions and V8 settings", () => {
  const compile = taskCommand(denoJson.tasks.compile);
  assert.deepEqual(permissionFlags(compile), permissionFlags(denoJson.tasks.start));
  assert.deepEqual(runtimeFlags(compile), runtimeFlags(denoJson.tasks.start));
  assert.ok(!denoJson.tasks.start.includes("--allow-all"), "the agent must not run with --allow-all");
  for (const task of [denoJson.tasks.start, denoJson.tasks.compile].map(taskCommand)) {
    const vars = task.match(/\$\w+/g) ?? [];
    assert.deepEqual(vars, [`$${EXTRA_PERMISSIONS_VAR}`], "the only variable: operator-granted permissions");
    assert.ok(
      task.includes(`$${EXTRA_PERMISSIONS_VAR} main.ts`),
      "expanded among deno's flags, before main.ts",
    );
    assert.ok(!/--allow-sys(\s|$)/.test(task), "--allow-sys only with a name list");
  }
});

Deno.test("every program the agent spawns is in --allow-run; the only other spawn is the exec plugin", async () => {
  const allowed = allowRun(permissionFlags(denoJson.tasks.start));
  const spawned = new Set<string>();
  const commandSites: string[] = [];
  for await (const file of sourceFiles(new URL("../lib/", import.meta.url))) {
    const text = await Deno.readTextFile(file);
    for (const m of text.matchAll(/\bcmd:\s*"([^"]+)"/g)) spawned.add(m[1]);
    if (/new Deno\.Command\(/.test(text)) commandSites.push(file.pathname.slice(PROJECT_ROOT.length));
  }
  assert.ok(spawned.size > 0, "expected to find spawned programs in lib/");
  const missing = [...spawned].filter((c) => !allowed.has(c));
  assert.deepEqual(missing, [], `programs spawned but not allowed: ${missing.join(", ")}`);
  // Programs are started in two places only: the command runner (fixed names, checked above) and the exec
  // credential plugin runner (the operator's program, granted through $DKP_EXTRA_PERMISSIONS).
  assert.deepEqual(commandSites.sort(), ["lib/exec.ts", "lib/kube/exec_credential.ts"]);
});

Deno.test("agentCommand expands $DKP_EXTRA_PERMISSIONS like the task shell", () => {
  const plain = agentCommand(["--version"], { extraPermissions: [] });
  assert.equal(plain.at(-1), "--version");
  assert.ok(!plain.some((w) => w.includes("$")));
  const extra = agentCommand(["--version"], { extraPermissions: ["--allow-run=/opt/plugin"] });
  assert.equal(extra.length, plain.length + 1);
  assert.equal(extra[extra.indexOf(`${PROJECT_ROOT}main.ts`) - 1], "--allow-run=/opt/plugin");
});

// ---------------------------------------------------------------------------------------------------------
// The real agent under the start task's flags, every kubeconfig form.

const unavailable = sandboxUnavailableReason(["ip", "iptables", "iptables-save", "sysctl", "unshare"]);
const NODE = "node1";

interface Form {
  name: string;
  /** Which simulator: "token" (HTTPS, bearer token) or "mtls" (HTTPS, client certificates). */
  sim: "token" | "mtls";
  /** The kubeconfig's cluster and user sections (YAML lines at 4 spaces), given the simulator's URL. */
  cluster?: (url: string) => string;
  user?: string;
  /** Run the agent in-cluster (no kubeconfig): service-account files and KUBERNETES_SERVICE_* env. */
  inCluster?: boolean;
  /** `$DKP_EXTRA_PERMISSIONS` for this run. */
  extraPermissions?: string[];
  /** The run must fail with this message instead of syncing. */
  fails?: RegExp;
}

function kubeconfigText(url: string, form: Form, caFile: string): string {
  const cluster = form.cluster
    ? form.cluster(url)
    : `    server: ${url}\n    certificate-authority: ${caFile}`;
  return `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
${cluster}
users:
- name: u
  user:
${form.user ?? "    {}"}
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`;
}

privilegedTest(unavailable, {
  name: "permissions: under the start task's exact flags the agent syncs with every kubeconfig form",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async (t) => {
    const lock = usePrivateXtablesLock();
    const pki = await makeTestPki();
    const dir = pki.dir;
    const b64 = (s: string) => btoa(s);
    await Deno.writeTextFile(`${dir}/token`, "tok\n");
    const plugin = `${dir}/credential-plugin.sh`;
    await Deno.writeTextFile(
      plugin,
      `#!/bin/sh\necho '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok"}}'\n`,
    );
    await Deno.chmod(plugin, 0o755);
    const exec =
      `    exec: {apiVersion: client.authentication.k8s.io/v1, command: ${plugin}, interactiveMode: Never}`;
    const forms: Form[] = [
      { name: "token", sim: "token", user: "    token: tok" },
      {
        name: "tokenfile",
        sim: "token",
        cluster: (url) => `    server: ${url}\n    certificate-authority-data: ${b64(pki.caCert)}`,
        user: `    tokenFile: ${dir}/token`,
      },
      {
        name: "clientcert",
        sim: "mtls",
        user: `    client-certificate: ${pki.paths.clientCert}\n    client-key: ${pki.paths.clientKeySec1}`,
      },
      {
        name: "insecure",
        sim: "token",
        cluster: (url) => `    server: ${url}\n    insecure-skip-tls-verify: true`,
        user: "    token: tok",
      },
      { name: "exec", sim: "token", user: exec, extraPermissions: [`--allow-run=${plugin}`] },
      { name: "incluster", sim: "token", inCluster: true },
      {
        name: "exec-not-granted",
        sim: "token",
        user: exec,
        fails: new RegExp(`not among the programs the agent may run.*--allow-run=${plugin}`),
      },
      {
        name: "auth-provider",
        sim: "token",
        user: "    auth-provider: {name: oidc, config: {id-token: abc}}",
        fails: /no Auth Provider found for name \\"oidc\\"/, // klog escapes the quotes
      },
    ];

    const sb = await Sandbox.create();
    const sims: SimulatorProcess[] = [];
    try {
      const tlsFiles = { certFile: pki.paths.serverCert, keyFile: pki.paths.serverKey };
      const tokenSim = await SimulatorProcess.start({ netns: sb.node, tls: tlsFiles, token: "tok" });
      sims.push(tokenSim);
      const mtlsSim = await SimulatorProcess.start({
        netns: sb.node,
        tls: tlsFiles,
        clientCAFile: pki.paths.caCert,
      });
      sims.push(mtlsSim);
      for (const sim of sims) await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
      let n = 10;
      for (const form of forms) {
        await t.step(form.name, async () => {
          const sim = form.sim === "token" ? tokenSim : mtlsSim;
          // A Service that only this run can have programmed.
          const ip = `10.96.0.${n++}`;
          await sim.upsert(service({ name: form.name, clusterIP: ip }));
          await sim.upsert(endpointSlice(form.name, [{ ip: "10.244.0.50", node: NODE }]));
          const kc = `${dir}/${form.name}.kubeconfig`;
          await Deno.writeTextFile(kc, kubeconfigText(sim.url, form, pki.paths.caCert));
          const agentArgs = [
            ...(form.inCluster ? [] : ["--kubeconfig", kc]),
            "--hostname-override",
            NODE,
            "--cluster-cidr=10.244.0.0/16",
            "--iptables-min-sync-period=0s",
            "--conntrack-max-per-core=0",
          ];
          const [deno, ...args] = agentCommand(agentArgs, { extraPermissions: form.extraPermissions ?? [] });
          const proc = form.inCluster
            // A private mount namespace with a tmpfs on /run (/var/run) holding the service-account files.
            ? sb.spawn(sb.node, "env", [
              `KUBERNETES_SERVICE_HOST=127.0.0.1`,
              `KUBERNETES_SERVICE_PORT=${new URL(sim.url).port}`,
              `XTABLES_LOCKFILE=${lock}`,
              "unshare",
              "-m",
              "sh",
              "-c",
              `set -e; mount -t tmpfs tmpfs /run; d=/run/secrets/kubernetes.io/serviceaccount; mkdir -p $d; ` +
              `cp ${dir}/token $d/token; cp ${pki.paths.caCert} $d/ca.crt; exec "$@"`,
              "sh",
              deno,
              ...args,
            ])
            : sb.spawn(sb.node, deno, args);
          try {
            if (form.fails) {
              const status = await proc.status;
              assert.equal(status.code, 1, proc.tail());
              assert.match(proc.output.replace(/\n/g, " "), form.fails);
              return;
            }
            await eventually(`the ${form.name} service programmed`, async () => {
              const save = (await sb.exec(sb.node, "iptables-save", ["-t", "nat"])).stdout;
              return save.includes(`"dp/${form.name}:p cluster IP"`) ? true : undefined;
            }, 20_000).catch((e) => {
              throw new Error(`${e.message}\nagent output:\n${proc.tail()}`);
            });
            assert.ok(!/NotCapable|Requires \w+ access/.test(proc.output), proc.tail());
          } finally {
            await proc.stop();
          }
        });
      }
    } finally {
      for (const s of sims) await s.close();
      await sb.destroy();
      await Deno.remove(dir, { recursive: true });
    }
  },
});

privilegedTest(sandboxUnavailableReason(["ip", "iptables-legacy", "flock"]), {
  name:
    "permissions: XTABLES_LOCKFILE reaches iptables started by the agent's runner though --allow-env does not list it",
  sanitizeOps: false,
  sanitizeResources: false,
  fn: async () => {
    const lock = await Deno.makeTempFile({ prefix: "dkp-lock-test-", suffix: ".lock" });
    const ns = `dkp-${Deno.pid}-locktest`;
    await new Deno.Command("ip", { args: ["netns", "add", ns] }).output();
    const script = new URL("./testdata/run_command.ts", import.meta.url).pathname;
    const [deno, ...args] = agentCommand([], { extraPermissions: [] });
    // The start task's flags, with our script in place of main.ts.
    const flags = args.slice(0, args.indexOf(`${PROJECT_ROOT}main.ts`));
    const run = async () => {
      const out = await new Deno.Command(deno, {
        args: [
          ...flags,
          script,
          "ip",
          "netns",
          "exec",
          ns,
          "iptables-legacy",
          "-w",
          "1",
          "-t",
          "filter",
          "-S",
        ],
        env: { XTABLES_LOCKFILE: lock, NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
      }).output();
      return JSON.parse(new TextDecoder().decode(out.stdout)) as { code: number; stderr: string };
    };
    // --no-fork: flock execs sleep, so killing it releases the lock.
    const holder = new Deno.Command("flock", { args: ["--no-fork", "-x", lock, "sleep", "30"] }).spawn();
    try {
      // Wait until flock holds the lock.
      await eventually("the lock held", async () => {
        const probe = await new Deno.Command("flock", { args: ["-n", lock, "true"] }).output();
        return probe.code !== 0 ? true : undefined;
      });
      const blocked = await run();
      assert.notEqual(
        blocked.code,
        0,
        "iptables-legacy waited on our private lock, so it saw XTABLES_LOCKFILE",
      );
      assert.match(blocked.stderr, /xtables lock/i);
      holder.kill("SIGKILL");
      await holder.status;
      const free = await run();
      assert.equal(free.code, 0, free.stderr);
    } finally {
      try {
        holder.kill("SIGKILL");
      } catch { /* gone */ }
      await holder.status;
      await new Deno.Command("ip", { args: ["netns", "del", ns] }).output();
      await Deno.remove(lock);
    }
  },
});

Deno.test("the compile task documents DENORT_BIN and the Dockerfile passes it through as a build argument", async () => {
  const compile = denoJson.tasks.compile;
  assert.equal(typeof compile, "object", "compile is a task with a description");
  assert.match(compile.description, /DENORT_BIN/);
  const dockerfile = await Deno.readTextFile(new URL("../Dockerfile", import.meta.url));
  assert.match(dockerfile, /^ARG DENORT_BIN=?$/m);
  assert.match(dockerfile, /export DENORT_BIN=.*deno task compile/s);
});

Deno.test("the agent holds no write permission: --write-config-to needs that one file granted, and says how", async () => {
  const dir = await Deno.makeTempDir({ prefix: "dkp-write-config-" });
  try {
    const file = `${dir}/out.yaml`;
    const run = async (extraPermissions: string[]) => {
      const [cmd, ...args] = agentCommand(["--write-config-to", file], { extraPermissions });
      const r = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" })
        .output();
      return { code: r.code, stderr: new TextDecoder().decode(r.stderr) };
    };
    const denied = await run([]);
    assert.equal(denied.code, 1, denied.stderr);
    assert.match(denied.stderr, /DKP_EXTRA_PERMISSIONS=--allow-write=/);
    assert.equal(await Deno.stat(file).then(() => true, () => false), false);
    const granted = await run([`--allow-write=${file}`]);
    assert.equal(granted.code, 0, granted.stderr);
    assert.match(await Deno.readTextFile(file), /kind: KubeProxyConfiguration/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
