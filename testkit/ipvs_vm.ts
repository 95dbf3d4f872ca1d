/**
 * Runs test files inside a QEMU VM that has a real IPVS kernel (the host kernel has none), from a test
 * on the host. The VM is `scripts/ipvs_vm.sh`: Debian's 6.1 kernel with ip_vs, ip_set and netfilter
 * modules, iproute2, ipvsadm, ipset, iptables (legacy and nft), nft, conntrack, sysctl and choom, 2 vCPUs,
 * no network card. The checkout, the Deno binary and the Deno cache are shared read-only over 9p at their
 * host paths, so the files run unchanged (`deno test --no-check`: they were type-checked on the host).
 *
 * A test file opts in by its name, `*_vmtest.ts` (anywhere under `tests/`): `deno test` on the host does
 * not pick such names up, and {@linkcode findVmTestFiles} does. Inside the VM the usual network-namespace
 * sandbox (`sandbox.ts`) works as on the host.
 *
 * The first run installs qemu-system-x86, cpio and kmod with apt, downloads the kernel package and builds
 * the image (about 30 s); later runs boot a cached image in about 4 s.
 * @module
 */

import { PROJECT_ROOT } from "./agent_command.ts";
import { sandboxUnavailableReason } from "./sandbox.ts";

/** How one test (or test step) inside the VM ended, from Deno's JUnit report. */
export interface VmTestCase {
  /** The test file, as Deno names it (`./tests/...`). */
  file: string;
  /** The test's name; a step is `parent > step`. */
  name: string;
  outcome: "passed" | "failed" | "ignored";
  /** The failure message and stack, for `failed`. */
  failure?: string;
}

/** The result of {@linkcode runInIpvsVm}. */
export interface IpvsVmRun {
  /** Exit code of `deno test` inside the VM (99: the VM reported nothing, 124: timed out). */
  code: number;
  /** The VM's console and the script's log, as printed. */
  output: string;
  /** Every test and step that ran, in report order (empty when no report came back). */
  cases: VmTestCase[];
  /** Wall time of the whole run, including any first-time build. */
  wallMs: number;
}

/** Options of {@linkcode runInIpvsVm}. */
export interface IpvsVmOptions {
  /**
   * Limit for the VM run, from QEMU's start to its power-off. Default 40 minutes: the whole VM suite takes about
   * 8 minutes on a quiet 2-core host and about 25 beside `stress-ng --cpu 2` (emulated CPUs get what is left).
   */
  timeoutMs?: number;
  /** Called with every output line as it arrives (e.g. to echo it into the host test's log). */
  onLine?: (line: string) => void;
  /** Extra flags for `deno test` inside the VM (e.g. `--filter`). */
  denoTestFlags?: string[];
}

const SCRIPT = `${PROJECT_ROOT}scripts/ipvs_vm.sh`;

function commandExists(cmd: string): boolean {
  try {
    const out = new Deno.Command("sh", { args: ["-c", `command -v ${cmd}`], stdout: "null", stderr: "null" })
      .outputSync();
    return out.code === 0;
  } catch {
    return false;
  }
}

/**
 * Why VM tests cannot run here, or undefined when they can. As root the script installs what it needs,
 * so root on x86-64 Linux always runs them; other users need qemu-system-x86_64, cpio and kmod already.
 */
export function ipvsVmUnavailableReason(): string | undefined {
  if (Deno.build.os !== "linux" || Deno.build.arch !== "x86_64") return "the IPVS VM needs x86-64 Linux";
  try {
    if (Deno.uid() === 0) return undefined;
  } catch {
    return "cannot read the uid (run with --allow-sys)";
  }
  const missing = ["qemu-system-x86_64", "cpio", "depmod", "apt-get"].filter((c) => !commandExists(c));
  if (missing.length > 0) return `not root, and ${missing.join(", ")} missing (root installs them)`;
  return undefined;
}

/** Every `*_vmtest.ts` file under `dir` (default the project's `tests/`), sorted, as absolute paths. */
export function findVmTestFiles(dir = `${PROJECT_ROOT}tests`): string[] {
  const found: string[] = [];
  const walk = (d: string) => {
    for (const e of Deno.readDirSync(d)) {
      const path = `${d}/${e.name}`;
      if (e.isDirectory) walk(path);
      else if (e.isFile && e.name.endsWith("_vmtest.ts")) found.push(path);
    }
  };
  walk(dir.replace(/\/$/, ""));
  return found.sort();
}

const ENTITIES: Record<string, string> = { lt: "<", gt: ">", amp: "&", quot: '"', apos: "'" };

function unescapeXml(text: string): string {
  return text.replace(/&(#x[0-9a-fA-F]+|#[0-9]+|[a-z]+);/g, (whole, ref: string) => {
    if (ref.startsWith("#x")) return String.fromCodePoint(parseInt(ref.slice(2), 16));
    if (ref.startsWith("#")) return String.fromCodePoint(Number(ref.slice(1)));
    return ENTITIES[ref] ?? whole;
  });
}

function attribute(attrs: string, name: string): string | undefined {
  const m = new RegExp(`(?:^|\\s)${name}="([^"]*)"`).exec(attrs);
  return m ? unescapeXml(m[1]) : undefined;
}

/**
 * The test files `deno test` ran at least one test of, from its "running N tests from ./path" lines. A file's
 * tests may be registered by a module it imports (the packet suite is defined in tests/packets/suite.ts), and
 * the JUnit report names that module, so which files ran is read from these lines, not from the report.
 */
export function filesWithTests(output: string): Set<string> {
  const files = new Set<string>();
  for (const m of output.matchAll(/^running ([1-9]\d*) tests? from (\S+?)\r?$/gm)) files.add(m[2]);
  return files;
}

/**
 * The test cases of a JUnit report as `deno test --junit-path` writes it: one `<testcase>` per test and
 * per step, with a `<failure>` or `<skipped/>` child. Throws on a report with no `<testsuites>` root.
 */
export function parseDenoJUnit(xml: string): VmTestCase[] {
  if (!/<testsuites[\s>]/.test(xml)) throw new Error("not a JUnit report: no <testsuites> element");
  const cases: VmTestCase[] = [];
  const re = /<testcase\s([^>]*?)(\/>|>([\s\S]*?)<\/testcase>)/g;
  for (const m of xml.matchAll(re)) {
    const attrs = m[1];
    const body = m[3] ?? "";
    const name = attribute(attrs, "name");
    const file = attribute(attrs, "classname");
    if (name === undefined || file === undefined) {
      throw new Error(`testcase without name or classname: ${attrs}`);
    }
    const failure = /<failure\b[^>]*>([\s\S]*?)<\/failure>|<failure\b([^>]*)\/>/.exec(body);
    if (failure) {
      const text = failure[1] !== undefined
        ? unescapeXml(failure[1])
        : attribute(failure[2], "message") ?? "";
      cases.push({ file, name, outcome: "failed", failure: text });
    } else if (/<skipped\b/.test(body)) {
      cases.push({ file, name, outcome: "ignored" });
    } else {
      cases.push({ file, name, outcome: "passed" });
    }
  }
  return cases;
}

/**
 * Boots the IPVS VM once and runs `deno test` on `files` inside it (building the image first if needed).
 * Resolves when the VM has powered off; never rejects for test failures (see `code` and `cases`).
 */
export async function runInIpvsVm(files: string[], opts: IpvsVmOptions = {}): Promise<IpvsVmRun> {
  if (files.length === 0) throw new Error("runInIpvsVm: no files");
  const timeoutMs = opts.timeoutMs ?? 40 * 60_000;
  const junit = await Deno.makeTempFile({ prefix: "ipvs-vm-junit-", suffix: ".xml" });
  const started = Date.now();
  const child = new Deno.Command("bash", {
    args: [SCRIPT, "test", ...files, "--", ...(opts.denoTestFlags ?? [])],
    cwd: PROJECT_ROOT,
    env: { IPVS_VM_TIMEOUT: String(Math.ceil(timeoutMs / 1000)), IPVS_VM_JUNIT: junit, NO_COLOR: "1" },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  // The script bounds the VM; this bounds everything else too (a first-time build takes about a minute).
  const guard = setTimeout(() => {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
  }, timeoutMs + 10 * 60_000);
  let output = "";
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    let partial = "";
    for await (const text of stream.pipeThrough(new TextDecoderStream())) {
      output += text;
      const lines = (partial + text).split("\n");
      partial = lines.pop()!;
      for (const line of lines) opts.onLine?.(line);
    }
    if (partial) opts.onLine?.(partial);
  };
  try {
    const [status] = await Promise.all([child.status, pump(child.stdout), pump(child.stderr)]);
    let cases: VmTestCase[] = [];
    try {
      const xml = await Deno.readTextFile(junit);
      if (xml.trim() !== "") cases = parseDenoJUnit(xml);
    } catch (err) {
      if (!(err instanceof Deno.errors.NotFound)) throw err;
    }
    return { code: status.code, output, cases, wallMs: Date.now() - started };
  } finally {
    clearTimeout(guard);
    await Deno.remove(junit).catch(() => {});
  }
}

/**
 * Why this kernel cannot carry the ipvs mode's tests (the sandbox's needs, `ipvsadm`, IPVS in the kernel,
 * the dummy link type), or undefined when it can: on the host (no IPVS) it says so; inside the VM it is
 * undefined. `tools` are more programs the caller needs.
 */
export function ipvsKernelUnavailableReason(tools: string[] = []): string | undefined {
  const base = sandboxUnavailableReason(["ip", "ipvsadm", "ipset", "iptables-restore", "sysctl", ...tools]);
  if (base) return base;
  try {
    Deno.statSync("/proc/net/ip_vs");
  } catch {
    return "this kernel has no IPVS (the VM runs it: bash scripts/ipvs_vm.sh test <file>)";
  }
  const dummy = new Deno.Command("ip", { args: ["link", "add", "dkp-dummy-probe", "type", "dummy"] })
    .outputSync();
  if (!dummy.success) return "no dummy link type in this kernel (kube-ipvs0 needs it)";
  new Deno.Command("ip", { args: ["link", "del", "dkp-dummy-probe"] }).outputSync();
  return undefined;
}
