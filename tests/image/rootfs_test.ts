/**
 * The container image's contents, checked without Docker (issue 14 item 1). scripts/assemble_rootfs.sh assembles
 * deploy/image/files.txt (the Dockerfile's list) into a directory, plus what the distroless base holds and the
 * deno binary; every program the agent may spawn then runs inside that directory (chroot in private mount and PID
 * namespaces, nothing of the host visible) and must behave as on the host; and the agent itself, started there
 * with the DaemonSet's command line and the ConfigMap's config.conf, syncs a sandbox node's network namespace
 * against the API server simulator and carries real traffic.
 */

import assert from "node:assert/strict";
import { parse as parseYaml, stringify } from "yaml";
import { PROJECT_ROOT, startTaskFlags } from "../../testkit/agent_command.ts";
import { SimulatorProcess } from "../../testkit/apiserver_process.ts";
import { deployObject, expandCommand, kubeProxyContainer } from "../../testkit/deploy.ts";
import {
  assembleTestRoot,
  IMAGE_PATH,
  inRootCommand,
  type InRootOptions,
  readImageList,
  ROOT_APP_DIR,
  ROOT_DENO,
  ROOT_DENO_DIR,
  type RootMount,
  runInRoot,
  runOnHost,
} from "../../testkit/image_root.ts";
import { withNetns } from "../../testkit/netns.ts";
import { Sandbox, type SandboxProcess, sandboxUnavailableReason } from "../../testkit/sandbox.ts";
import {
  endpointSlice,
  eventually,
  nodeObject,
  service,
  serviceChainLines,
  tally,
} from "../packets/helpers.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const unavailable = sandboxUnavailableReason([
  "ip",
  "iptables",
  "unshare",
  "chroot",
  "ldd",
  "sysctl",
  "modprobe",
]);
const NODE = "node1";

/** How each program shows its version: `--version`, except `ip` (-V) and `nfacct` (a `version` command). */
function versionArgs(program: string): string[] {
  return program === "ip" ? ["-V"] : program === "nfacct" ? ["version"] : ["--version"];
}

function allowRunList(): string[] {
  const flag = startTaskFlags().find((f) => f.startsWith("--allow-run="));
  assert.ok(flag, "the start task has --allow-run");
  return flag.slice("--allow-run=".length).split(",");
}

/** The environment of programs in the root: the image's PATH plus Deno's cache location for `deno run`. */
const ROOT_ENV = { PATH: IMAGE_PATH, DENO_DIR: ROOT_DENO_DIR, DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" };

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}

const CAP_SYS_RESOURCE = 24;

/** Whether this process has capability number `cap` in its effective set. */
async function hasCapability(cap: number): Promise<boolean> {
  const status = await Deno.readTextFile("/proc/self/status");
  const hex = /^CapEff:\s*([0-9a-f]+)$/m.exec(status)?.[1] ?? "0";
  return ((BigInt(`0x${hex}`) >> BigInt(cap)) & 1n) === 1n;
}

/** An HTTP GET from inside `ns`; resolves with the status code. */
async function httpStatus(sb: Sandbox, ns: string, url: string): Promise<number> {
  const code = `const r = await fetch(${
    JSON.stringify(url)
  }); await r.body?.cancel(); console.log(r.status);`;
  const r = await sb.exec(ns, Deno.execPath(), ["eval", code]);
  return Number(r.stdout.trim());
}

privilegedTest(unavailable, {
  name:
    "image: the assembled root runs every tool and the agent, which syncs a node namespace from inside it",
  sanitizeResources: false,
  sanitizeOps: false,
  fn: async (t) => {
    if (unavailable) console.log(`skipped: ${unavailable}`);
    const entries = readImageList();
    const programs = entries.filter((e) => e.kind === "program").map((e) => e.name);
    const helpers = entries.filter((e) => e.kind === "helper").map((e) => e.name);
    const root = await assembleTestRoot();
    try {
      await t.step("the list's programs are exactly deno.json's --allow-run", () => {
        assert.deepEqual([...programs].sort(), [...allowRunList()].sort());
      });

      await t.step("the root holds every program and no shell or package manager", async () => {
        const dirs = IMAGE_PATH.split(":");
        for (const h of helpers) assert.ok(await exists(`${root}${h}`), `${h} is not in the root`);
        for (const p of programs) {
          const found = [];
          for (const d of dirs) if (await exists(`${root}${d}/${p}`)) found.push(d);
          assert.ok(found.length > 0, `${p} is not in the root's PATH`);
        }
        for (const p of ["sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg"]) {
          for (const d of dirs) assert.ok(!(await exists(`${root}${d}/${p}`)), `${d}/${p} is in the root`);
        }
        // Package metadata for scanners, as upstream's image has (only where dpkg knows the files).
        if (await exists("/var/lib/dpkg/status")) {
          const pkgs = [...new Set(entries.filter((e) => e.kind !== "base").map((e) => e.pkg))];
          for (const pkg of pkgs) {
            const status = await Deno.readTextFile(`${root}/var/lib/dpkg/status.d/${pkg}`);
            assert.match(status, new RegExp(`^Package: ${pkg}$`, "m"));
            assert.ok(await exists(`${root}/usr/share/doc/${pkg}/copyright`), `copyright of ${pkg}`);
          }
        }
      });

      await t.step(
        "inside, a program sees only the root, its own processes and the runtime's mounts",
        async () => {
          const code = `console.log(JSON.stringify({
          root: [...Deno.readDirSync("/")].map((e) => e.name).sort(),
          pids: [...Deno.readDirSync("/proc")].filter((e) => /^[0-9]+$/.test(e.name)).map((e) => e.name),
          mounts: Deno.readTextFileSync("/proc/self/mounts").split("\\n").filter(Boolean).length,
        }))`;
          const r = await runInRoot(root, [ROOT_DENO, "eval", code], { env: ROOT_ENV });
          assert.equal(r.code, 0, r.stderr);
          const seen = JSON.parse(r.stdout);
          const expected = [...Deno.readDirSync(root)].map((e) => e.name);
          for (const m of ["proc", "sys", "dev", "run"]) if (!expected.includes(m)) expected.push(m);
          assert.deepEqual(seen.root, expected.sort());
          assert.ok(
            !seen.root.includes("work") && !seen.root.includes("root") && !seen.root.includes("home"),
          );
          assert.deepEqual(seen.pids, ["1"], "only the program itself, as PID 1");
        },
      );

      await t.step("every program the agent may spawn starts inside the root as on the host", async () => {
        await withNetns(async (_runner, ns) => {
          for (const p of [...programs, ...helpers]) {
            const argv = [p, ...versionArgs(p)];
            const inside = await runInRoot(root, argv, { netns: ns });
            if (p === "ipvsadm") {
              // Not compared with the host: without IPVS loaded, ipvsadm runs modprobe ip_vs, which on the host
              // could load a module into the host's kernel. Inside there is no /lib/modules, so nothing loads.
              if (inside.code !== 0) {
                assert.match(
                  inside.stderr,
                  /^modprobe: FATAL: Module ip_vs not found in directory \/lib\/modules\//m,
                );
                assert.match(inside.stderr, /^Can't initialize ipvs: Protocol not available$/m);
                continue;
              }
            } else {
              const host = await runOnHost(argv, { netns: ns });
              assert.deepEqual(inside, host, `${argv.join(" ")}: root and host differ`);
            }
            assert.equal(inside.code, 0, `${argv.join(" ")}: ${inside.stderr}`);
            assert.match(inside.stdout, /\d+(\.\d+)+|version \d+/, `${argv.join(" ")} prints a version`);
          }
        });
      });

      await t.step("ipset and both iptables backends program a namespace from inside the root", async () => {
        await withNetns(async (_runner, ns) => {
          const inRoot = async (argv: string[], stdin?: string) => {
            const r = await runInRoot(root, argv, { netns: ns, stdin });
            assert.equal(r.code, 0, `${argv.join(" ")}: ${r.stderr}`);
            return r.stdout;
          };
          await inRoot(["ipset", "create", "KUBE-IMAGE-TEST", "hash:ip,port"]);
          await inRoot(["ipset", "add", "KUBE-IMAGE-TEST", "10.0.0.1,tcp:80"]);
          assert.match(await inRoot(["ipset", "list", "KUBE-IMAGE-TEST"]), /^10\.0\.0\.1,tcp:80$/m);
          await inRoot(["ipset", "destroy", "KUBE-IMAGE-TEST"]);
          // The extensions the agent's rules use (comment, mark, statistic, recent, conntrack, addrtype, ...).
          const rules = [
            "*nat",
            ":KUBE-SVC-X - [0:0]",
            ":KUBE-SEP-X - [0:0]",
            "-A OUTPUT -m comment --comment svc -m addrtype --dst-type LOCAL -j KUBE-SVC-X",
            "-A KUBE-SVC-X -m statistic --mode random --probability 0.5 -j KUBE-SEP-X",
            "-A KUBE-SEP-X -m recent --name KUBE-SEP-X --set --mask 255.255.255.255 --rsource" +
            " -p tcp -m tcp -j DNAT --to-destination 10.0.0.1:80",
            "-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully",
            "COMMIT",
            "*filter",
            ":KUBE-FW - [0:0]",
            "-A KUBE-FW -m conntrack --ctstate INVALID -j DROP",
            "-A KUBE-FW -p tcp -m tcp --dport 81 -j REJECT --reject-with icmp-port-unreachable",
            "COMMIT",
            "",
          ].join("\n");
          const saved: Record<string, string[]> = {};
          for (const backend of ["legacy", "nft"]) {
            await inRoot([`iptables-${backend}-restore`, "-w", "5"], rules);
            const out = await inRoot([`iptables-${backend}-save`]);
            saved[backend] = out.split("\n").filter((l) => l.startsWith("-A ")).sort();
          }
          assert.equal(saved.legacy.length, rules.split("\n").filter((l) => l.startsWith("-A ")).length);
          assert.deepEqual(saved.legacy, saved.nft);
          for (
            const part of ["--probability 0.50000000000", "--to-destination 10.0.0.1:80", "--random-fully"]
          ) {
            assert.ok(saved.legacy.some((l) => l.includes(part)), `${part} in ${saved.legacy.join("\n")}`);
          }
        });
      });

      await t.step(
        "the agent, run as the DaemonSet runs it, syncs a node namespace from inside the root",
        async () => {
          await runAgentInRoot(root);
        },
      );
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

/** The sandbox part: simulator, the agent inside the root, traffic, health probes and the kernel state. */
async function runAgentInRoot(root: string): Promise<void> {
  const sb = await Sandbox.create({ pods: ["pod-a", "pod-b", "pod-x"] });
  const volumes = await Deno.makeTempDir({ prefix: "dkp-image-volumes-" });
  let agent: SandboxProcess | undefined;
  let sim: SimulatorProcess | undefined;
  try {
    const a = sb.pod("pod-a"), b = sb.pod("pod-b"), x = sb.pod("pod-x");
    await Promise.all([a, b].map((p) => sb.startServer(p.ns, { tcp: [8080] })));
    sim = await SimulatorProcess.start({ netns: sb.node });
    await sim.upsert(nodeObject(NODE, sb.nodeIP, sb.podCIDR));
    await sim.upsert(service({ name: "web", clusterIP: "10.96.0.10" }));
    await sim.upsert(endpointSlice("web", [{ ip: a.ip, node: NODE }, { ip: b.ip, node: NODE }]));

    // The ConfigMap volume: its config.conf (one change: nf_conntrack_max is global to the host, so the test
    // must not set it) and the simulator's kubeconfig as kubeconfig.conf.
    const cm = deployObject("ConfigMap", "kube-proxy");
    const config = parseYaml(cm.data["config.conf"]);
    config.conntrack.maxPerCore = 0;
    assert.equal(config.clientConnection.kubeconfig, "/var/lib/kube-proxy/kubeconfig.conf");
    assert.equal(
      config.clusterCIDR,
      "10.244.0.0/16",
      "the sandbox's pods are in the ConfigMap's clusterCIDR",
    );
    await Deno.mkdir(`${volumes}/config`);
    await Deno.writeTextFile(`${volumes}/config/config.conf`, stringify(config));
    await Deno.copyFile(sim.kubeconfig, `${volumes}/config/kubeconfig.conf`);
    await Deno.writeTextFile(`${volumes}/xtables.lock`, "");

    // The DaemonSet's container: its command (with the deno binary and the project in place of the compiled
    // binary), its environment and its volume mounts.
    const c = kubeProxyContainer();
    const ds = deployObject("DaemonSet", "kube-proxy");
    const env: Record<string, string> = { ...ROOT_ENV };
    for (const e of c.env) {
      env[e.name] = e.valueFrom?.fieldRef?.fieldPath === "spec.nodeName" ? NODE : e.value;
    }
    const command = expandCommand(c.command, env);
    assert.equal(command[0], "/usr/local/bin/kube-proxy");
    const argv = [ROOT_DENO, "run", ...startTaskFlags(), `${ROOT_APP_DIR}/main.ts`, ...command.slice(1)];
    const mounts: RootMount[] = [];
    for (const vm of c.volumeMounts) {
      const vol = ds.spec.template.spec.volumes.find((v: { name: string }) => v.name === vm.name);
      if (vol.configMap) mounts.push({ source: `${volumes}/config`, target: vm.mountPath, readOnly: true });
      else if (vol.hostPath.path === "/run/xtables.lock") {
        mounts.push({ source: `${volumes}/xtables.lock`, target: vm.mountPath }); // not the host's lock
      } else {
        // /lib/modules is left out: with it, modprobe inside the root could load modules into the host's kernel.
        assert.equal(vol.hostPath.path, "/lib/modules");
      }
    }
    const opts: InRootOptions = { mounts, env };
    const [cmd, args] = inRootCommand(root, argv, opts);
    agent = sb.spawn(sb.node, cmd, args);
    const running = agent;
    let exited = false;
    running.status.then(() => exited = true);

    const px = await sb.probe(x.ns);
    await eventually(
      "traffic through the agent's rules",
      async () => {
        if (exited) throw new Error("the agent exited");
        const r = await px.tcp("10.96.0.10", 80, { timeoutMs: 300 });
        return r.result === "ok" ? r : undefined;
      },
      60_000,
      200,
    ).catch((err) => {
      throw new Error(`${err.message}\nagent output:\n${running.tail()}`);
    });
    const got = tally(await px.repeat({ op: "tcp", host: "10.96.0.10", port: 80, timeoutMs: 1000 }, 40));
    assert.deepEqual(Object.keys(got).sort(), ["pod-a", "pod-b"], JSON.stringify(got));

    // The DaemonSet's probes, as the kubelet sends them (to the node IP: hostNetwork).
    for (const probe of [c.startupProbe, c.livenessProbe, c.readinessProbe]) {
      const url = `http://${sb.nodeIP}:${probe.httpGet.port}${probe.httpGet.path}`;
      assert.equal(await httpStatus(sb, sb.node, url), 200, url);
    }

    // What the agent's children did, seen from inside the root and from the host.
    const inNode = async (argv: string[]) => {
      const r = await runInRoot(root, argv, { netns: sb.node });
      assert.equal(r.code, 0, `${argv.join(" ")}: ${r.stderr}`);
      return r.stdout;
    };
    const insideSave = await inNode(["iptables-nft-save", "-t", "nat"]);
    const hostSave = (await sb.exec(sb.node, "iptables-nft-save", ["-t", "nat"])).stdout;
    assert.ok(serviceChainLines(insideSave).some((l) => l.startsWith(":KUBE-SVC-")), insideSave);
    assert.deepEqual(serviceChainLines(insideSave), serviceChainLines(hostSave));
    assert.match(await inNode(["nft", "list", "tables"]), /^table ip nat$/m);
    // conntrack timeouts from the ConfigMap (24h established), written through sysctl by the agent.
    assert.equal(
      (await inNode(["sysctl", "-n", "net.netfilter.nf_conntrack_tcp_timeout_established"])).trim(),
      "86400",
    );
    await inNode(["conntrack", "-L"]);
    // The OOM score the agent set on itself with choom (the ConfigMap's oomScoreAdj).
    const pids = (await sb.exec(sb.node, "ip", ["netns", "pids", sb.node])).stdout.split(/\s+/).filter(
      Boolean,
    );
    let agentAdj: string | undefined;
    for (const pid of pids) {
      const cmdline = await Deno.readTextFile(`/proc/${pid}/cmdline`).catch(() => "");
      if (cmdline.startsWith(`${ROOT_DENO}\0run\0`) && cmdline.includes(`${ROOT_APP_DIR}/main.ts`)) {
        agentAdj = (await Deno.readTextFile(`/proc/${pid}/oom_score_adj`)).trim();
      }
    }
    if (await hasCapability(CAP_SYS_RESOURCE)) assert.equal(agentAdj, String(config.oomScoreAdj));
    else {
      // Without CAP_SYS_RESOURCE (this machine's container lacks it) the kernel refuses a negative score: choom ran
      // inside the root and reported the kernel's answer, and the agent carried on, as upstream does.
      assert.equal(agentAdj, "0");
      assert.match(
        running.output,
        /Failed to apply OOMScore" err="choom: failed to set score adjust value: Permission/,
      );
    }
    assert.doesNotMatch(
      running.output,
      /error while loading shared libraries|command not found|No such file/,
    );
  } finally {
    // unshare ignores SIGTERM while it waits; killing it sends the agent SIGTERM (--kill-child).
    agent?.kill("SIGKILL");
    await agent?.status;
    await sim?.close();
    await sb.destroy();
    await Deno.remove(volumes, { recursive: true });
  }
}

Deno.test("image: the Dockerfile stages the tested list with the tested script onto a Debian 12 distroless base", async () => {
  const dockerfile = await Deno.readTextFile(`${PROJECT_ROOT}Dockerfile`);
  const froms = [...dockerfile.matchAll(/^FROM (\S+)/gm)].map((m) => m[1]);
  // Builder stages and base share Debian 12 (glibc 2.36), so the staged libraries match the base's.
  assert.deepEqual(froms, ["debian:bookworm-slim", "debian:bookworm-slim", "gcr.io/distroless/cc-debian12"]);
  assert.match(dockerfile, /^COPY deploy\/image\/files\.txt scripts\/assemble_rootfs\.sh \/stage\/$/m);
  assert.match(dockerfile, /\$\(bash \/stage\/assemble_rootfs\.sh --packages \/stage\/files\.txt\)/);
  assert.match(
    dockerfile,
    /assemble_rootfs\.sh --program \/stage\/kube-proxy=\/usr\/local\/bin\/kube-proxy \\\n\s+\/stage\/files\.txt \/rootfs/,
  );
  assert.match(dockerfile, /^COPY --from=stage \/rootfs\/ \/$/m);
  // The packages installed for staging are the list's (base entries come with the distroless base).
  const out = await new Deno.Command("bash", {
    args: [
      `${PROJECT_ROOT}scripts/assemble_rootfs.sh`,
      "--packages",
      `${PROJECT_ROOT}deploy/image/files.txt`,
    ],
    stdout: "piped",
  }).output();
  const pkgs = new TextDecoder().decode(out.stdout).trim().split("\n");
  const expected = [...new Set(readImageList().filter((e) => e.kind !== "base").map((e) => e.pkg))].sort();
  assert.deepEqual(pkgs, expected);
});
