/**
 * The systemd unit (deploy/kube-proxy.service) and its sample configuration (issue 14 item 2): `systemd-analyze
 * verify` accepts the unit without a single warning, `systemd-analyze security` rates its exposure, the sandboxing
 * directives are the ones a netfilter daemon can live with, its command line parses with the agent's flags, and
 * the sample KubeProxyConfiguration loads with the agent's own loader.
 */

import assert from "node:assert/strict";
import { decodeConfiguration, loadConfigFile } from "../../lib/config/load.ts";
import { Options } from "../../lib/config/options.ts";
import { validateConfiguration } from "../../lib/config/validate.ts";
import { DEPLOY_DIR } from "../../testkit/deploy.ts";
import { privilegedTest } from "../../testkit/privileged.ts";

const UNIT = `${DEPLOY_DIR}kube-proxy.service`;
const SAMPLE_CONFIG = `${DEPLOY_DIR}kube-proxy-config.yaml`;
/** Where the unit expects the sample configuration. */
const CONFIG_PATH = "/etc/kubernetes/kube-proxy-config.yaml";
/** The highest `systemd-analyze security` exposure accepted (0 = fully sandboxed, 10 = unprotected). */
const MAX_EXPOSURE = 3.0;

function analyzeUnavailable(): string | undefined {
  try {
    new Deno.Command("systemd-analyze", { args: ["--version"], stdout: "null", stderr: "null" }).outputSync();
    return undefined;
  } catch {
    return "systemd-analyze is not installed (scripts/install.sh installs it)";
  }
}
const unavailable = analyzeUnavailable();

/** The unit's directives: section -> key -> values in order (repeated keys accumulate). */
function parseUnit(text: string): Map<string, Map<string, string[]>> {
  const out = new Map<string, Map<string, string[]>>();
  let section = "";
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#") || line.startsWith(";")) continue;
    const s = /^\[(.+)\]$/.exec(line);
    if (s) {
      section = s[1];
      if (!out.has(section)) out.set(section, new Map());
      continue;
    }
    const eq = line.indexOf("=");
    assert.ok(eq > 0 && section, `bad unit line: ${raw}`);
    const key = line.slice(0, eq), value = line.slice(eq + 1);
    const sec = out.get(section)!;
    sec.set(key, [...(sec.get(key) ?? []), value]);
  }
  return out;
}

const unit = parseUnit(Deno.readTextFileSync(UNIT));
const service = unit.get("Service")!;
const one = (key: string): string | undefined => service.get(key)?.at(-1);
const words = (key: string): string[] =>
  (service.get(key) ?? []).flatMap((v) => v.split(/\s+/)).filter(Boolean);

/** The program of an Exec*= line, without systemd's prefixes (`+`, `-`, `@`, `:`, `!`). */
function execProgram(line: string): string {
  return line.replace(/^[-+@:!]+/, "").split(/\s+/)[0];
}

/**
 * A root for `systemd-analyze --root`: the unit in /etc/systemd/system, systemd's own units (targets the unit
 * depends on), and every Exec program at its path: the host's file where the host has it (e.g. /bin/touch),
 * an executable stand-in for /usr/local/bin/kube-proxy (the compiled agent, not built here).
 */
async function analyzeRoot(unitText: string): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "dkp-systemd-root-" });
  await Deno.mkdir(`${root}/etc/systemd/system`, { recursive: true });
  await Deno.writeTextFile(`${root}/etc/systemd/system/kube-proxy.service`, unitText);
  const systemdUnits = ["/usr/lib/systemd/system", "/lib/systemd/system"].find((d) => {
    try {
      return Deno.statSync(d).isDirectory;
    } catch {
      return false;
    }
  });
  assert.ok(systemdUnits, "systemd's unit directory");
  await Deno.mkdir(`${root}/usr/lib/systemd`, { recursive: true });
  const cp = await new Deno.Command("cp", { args: ["-a", systemdUnits, `${root}/usr/lib/systemd/system`] })
    .output();
  assert.ok(cp.success);
  for (const [key, values] of service) {
    if (!key.startsWith("Exec")) continue;
    for (const v of values) {
      const program = execProgram(v);
      await Deno.mkdir(`${root}${program.slice(0, program.lastIndexOf("/"))}`, { recursive: true });
      if (program === "/usr/local/bin/kube-proxy") {
        await Deno.writeTextFile(`${root}${program}`, "#!/bin/sh\nexit 0\n", { mode: 0o755 });
      } else {
        await Deno.copyFile(program, `${root}${program}`); // fails when the host has no such program
        await Deno.chmod(`${root}${program}`, 0o755);
      }
    }
  }
  return root;
}

async function analyze(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command("systemd-analyze", { args, stdout: "piped", stderr: "piped" }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

async function verify(unitText: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const root = await analyzeRoot(unitText);
  try {
    return await analyze(["verify", "--man=no", `--root=${root}`, "kube-proxy.service"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

privilegedTest(unavailable, {
  name: "systemd: systemd-analyze verify accepts the unit without a warning",
  fn: async () => {
    const r = await verify(Deno.readTextFileSync(UNIT));
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stderr + r.stdout, "");
  },
});

privilegedTest(unavailable, {
  name: "systemd: the verify check catches a misspelt or invalid directive",
  fn: async () => {
    const text = Deno.readTextFileSync(UNIT);
    for (const bad of ["ProtectSytem=strict", "ProtectSystem=stricter", "RestrictAddressFamilies=AF_NOPE"]) {
      const r = await verify(text.replace("[Install]", `${bad}\n\n[Install]`));
      // e.g. "kube-proxy.service:63: Unknown key 'ProtectSytem' in section [Service], ignoring."
      assert.match(r.stderr, /kube-proxy\.service:\d+: /, `${bad} went unnoticed`);
    }
  },
});

privilegedTest(unavailable, {
  name: `systemd: systemd-analyze security rates the unit's exposure at most ${MAX_EXPOSURE}`,
  fn: async () => {
    const root = await analyzeRoot(Deno.readTextFileSync(UNIT));
    try {
      const r = await analyze([
        "security",
        "--offline=true",
        `--root=${root}`,
        "--no-pager",
        "kube-proxy.service",
      ]);
      const m = /Overall exposure level for kube-proxy\.service: ([0-9.]+)/.exec(r.stdout);
      assert.ok(m, r.stdout + r.stderr);
      assert.ok(Number(m[1]) <= MAX_EXPOSURE, `exposure ${m[1]}:\n${r.stdout}`);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test("systemd: the unit grants the netfilter capabilities only and writes nothing but the xtables lock", () => {
  assert.deepEqual(
    new Set(words("CapabilityBoundingSet")),
    new Set(["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_RESOURCE"]),
  );
  assert.deepEqual(
    new Set(words("RestrictAddressFamilies")),
    new Set(["AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"]),
  );
  assert.equal(one("NoNewPrivileges"), "yes");
  assert.equal(one("ProtectSystem"), "strict");
  assert.deepEqual(words("ReadWritePaths"), ["/run/xtables.lock"]);
  assert.equal(one("ProtectHome"), "yes");
  assert.equal(one("PrivateTmp"), "yes");
  // The agent writes conntrack and route_localnet sysctls, and V8 generates code at run time.
  assert.equal(service.get("ProtectKernelTunables"), undefined);
  assert.equal(service.get("MemoryDenyWriteExecute"), undefined);
  // The lock is created before the sandbox is set up, so that ReadWritePaths= can bind it.
  assert.ok((service.get("ExecStartPre") ?? []).some((l) => /^\+\S*\/touch \/run\/xtables\.lock$/.test(l)));
});

Deno.test("systemd: ExecStart's flags parse with the agent's flag set and point at the sample config's place", () => {
  const execStart = one("ExecStart")!;
  const [program, ...args] = execStart.replaceAll("%H", "node-1").split(/\s+/);
  assert.equal(program, "/usr/local/bin/kube-proxy");
  const o = new Options();
  o.parse(args);
  assert.equal(o.configFile, CONFIG_PATH);
  assert.equal(o.hostnameOverride, "node-1");
});

Deno.test("systemd: the sample config is a KubeProxyConfiguration the agent loads, strictly and valid", async () => {
  const { config, strictErrors } = decodeConfiguration(await Deno.readTextFile(SAMPLE_CONFIG));
  assert.deepEqual(strictErrors, []);
  assert.deepEqual(validateConfiguration(config).map((e) => e.toString()), []);
  // The agent's file loader (what --config uses) gives the same configuration.
  assert.deepEqual(await loadConfigFile(SAMPLE_CONFIG), config);
  // Files the unit hides from the service cannot hold its kubeconfig.
  const kubeconfig = config.clientConnection.kubeconfig;
  assert.ok(kubeconfig.startsWith("/"), kubeconfig);
  for (const hidden of ["/home/", "/root/", "/run/user/", "/tmp/", "/var/tmp/"]) {
    assert.ok(!kubeconfig.startsWith(hidden), `${kubeconfig} is hidden by the unit`);
  }
  assert.equal(config.oomScoreAdj, Number(one("OOMScoreAdjust")));
});
