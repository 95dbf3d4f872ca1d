/**
 * Node namespace and iptables call recorder for the scale harness.
 *
 * - {@linkcode NodeNamespace}: `ip netns add dkp-scale-<pid>[-k]`, loopback up, a veth pair (both ends inside)
 *   giving the node an IP, and the wanted iptables backend forced with a `KUBE-IPTABLES-HINT` chain in that
 *   backend's mangle table. `destroy()` kills what is left in the namespace (only processes this harness
 *   started run there) and deletes it. Nothing outside the namespace is touched.
 * - {@linkcode writeWrappers}: a directory of `iptables*` / `ip6tables*` (and, for the nftables mode, `nft`)
 *   wrapper scripts, put first in the agent's PATH, that log every invocation (ns timestamps, pid, args, exit
 *   code) and, for `*-restore` and `nft -f -` (not `--check`), keep a copy of the payload so the harness can
 *   find which restore or transaction carried which endpoint.
 * @module
 */
import { runCommand } from "../testkit/command.ts";

/** Runs a command; rejects with its stderr on a non-zero exit. */
export async function sh(cmd: string, args: string[], stdin?: string): Promise<string> {
  const out = await runCommand(cmd, args, { stdin });
  if (out.code !== 0) throw new Error(`${cmd} ${args.join(" ")}: exit ${out.code}: ${out.stderr}`);
  return out.stdout;
}

let seq = 0;

/** A network namespace standing in for the node. */
export class NodeNamespace {
  private constructor(readonly name: string, readonly nodeIP: string) {}

  /** Creates the namespace, its veth pair and the backend hint. Cleans up on failure. */
  static async create(backend: "legacy" | "nft", nodeIP = "10.250.0.2"): Promise<NodeNamespace> {
    const name = `dkp-scale-${Deno.pid}${seq++ ? `-${seq}` : ""}`;
    await sh("ip", ["netns", "add", name]);
    const ns = new NodeNamespace(name, nodeIP);
    try {
      await sh("ip", ["-n", name, "link", "set", "lo", "up"]);
      await sh("ip", ["-n", name, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]);
      await sh("ip", ["-n", name, "addr", "add", `${nodeIP}/24`, "dev", "veth0"]);
      await sh("ip", ["-n", name, "link", "set", "veth0", "up"]);
      await sh("ip", ["-n", name, "link", "set", "veth1", "up"]);
      // lib/dataplane/iptables/backend.ts: kubelet's hint chain in the backend's mangle table decides.
      await sh("ip", [
        "netns",
        "exec",
        name,
        `iptables-${backend}`,
        "-t",
        "mangle",
        "-N",
        "KUBE-IPTABLES-HINT",
      ]);
    } catch (err) {
      await ns.destroy();
      throw err;
    }
    return ns;
  }

  /** Runs a program inside the namespace. */
  exec(cmd: string, args: string[]): Promise<string> {
    return sh("ip", ["netns", "exec", this.name, cmd, ...args]);
  }

  /** Kills every process left in the namespace (all started by this harness) and deletes it. */
  async destroy(): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      let pids: number[] = [];
      try {
        pids = (await sh("ip", ["netns", "pids", this.name])).split(/\s+/).filter(Boolean).map(Number);
      } catch {
        break;
      }
      if (pids.length === 0) break;
      for (const pid of pids) {
        try {
          Deno.kill(pid, attempt === 0 ? "SIGTERM" : "SIGKILL");
        } catch { /* gone */ }
      }
      await new Promise((r) => setTimeout(r, 500));
    }
    await sh("ip", ["netns", "del", this.name]).catch(() => {});
  }
}

/** Program names the agent may run (the iptables part of the start task's --allow-run). */
export const IPTABLES_PROGRAMS: readonly string[] = (() => {
  const out: string[] = [];
  for (const base of ["iptables", "ip6tables"]) {
    for (const mid of ["", "-legacy", "-nft"]) {
      for (const suf of ["", "-save", "-restore"]) out.push(`${base}${mid}${suf}`);
    }
  }
  return out;
})();

/** Resolves a program through PATH (`command -v`), or null. */
async function which(name: string): Promise<string | null> {
  try {
    return (await sh("sh", ["-c", `command -v ${name}`])).trim() || null;
  } catch {
    return null;
  }
}

/** True for an `nft` invocation that applies a transaction read from stdin (`-f -`, not `--check`). */
export function isNftApply(name: string, argv: readonly string[]): boolean {
  if (name !== "nft" || argv.includes("--check") || argv.includes("-c")) return false;
  for (let i = 0; i + 1 < argv.length; i++) if (argv[i] === "-f" && argv[i + 1] === "-") return true;
  return false;
}

/** Paths of the recorder. */
export interface Wrappers {
  /** Directory to put first in PATH. */
  bin: string;
  /** One line per start/end: `<ns> start <pid> <name> <args>` / `<ns> end <pid> <name> <rc>`. */
  log: string;
  /** Payload copies: `p-<startNs>-<pid>`. */
  payloads: string;
}

/**
 * Writes wrapper scripts for every iptables program found on this host into `dir`. With `backend`, the plain
 * names (`iptables`, `iptables-restore`, ...) run that backend's programs, as the iptables-wrapper of upstream's
 * kube-proxy image picks one; an agent that names the backend itself (this one) is unaffected. With `nft`, an
 * `nft` wrapper too, keeping the input of every `nft -f -` that is not a `--check`.
 */
export async function writeWrappers(
  dir: string,
  backend?: "legacy" | "nft",
  opts: { nft?: boolean } = {},
): Promise<Wrappers> {
  const w: Wrappers = { bin: `${dir}/bin`, log: `${dir}/calls.log`, payloads: `${dir}/payloads` };
  await Deno.mkdir(w.bin, { recursive: true });
  await Deno.mkdir(w.payloads, { recursive: true });
  await Deno.writeTextFile(w.log, "");
  for (const name of IPTABLES_PROGRAMS) {
    const plain = !name.includes("-legacy") && !name.includes("-nft");
    const target = plain && backend ? name.replace(/^(ip6?tables)/, `$1-${backend}`) : name;
    const real = await which(target);
    if (!real) continue;
    const run = name.endsWith("-restore") ? `tee "${w.payloads}/p-$n-$$" | ${real} "$@"` : `${real} "$@"`;
    // Arguments are logged separated by \037 so that they can be replayed exactly.
    const script = `#!/bin/sh
n=$(date +%s%N)
echo "$n start $$ ${name} $(printf '%s\\037' "$@")" >> ${w.log}
${run}
rc=$?
echo "$(date +%s%N) end $$ ${name} $rc" >> ${w.log}
exit $rc
`;
    await Deno.writeTextFile(`${w.bin}/${name}`, script, { mode: 0o755 });
  }
  if (opts.nft) {
    const real = await which("nft");
    if (!real) throw new Error("nft not found");
    // The same log lines; the input is kept for `-f -` unless `--check`/`-c` is among the arguments
    // (the condition of isNftApply).
    const script = `#!/bin/sh
n=$(date +%s%N)
echo "$n start $$ nft $(printf '%s\\037' "$@")" >> ${w.log}
keep=0; check=0; prev=
for a in "$@"; do
  [ "$prev" = "-f" ] && [ "$a" = "-" ] && keep=1
  case "$a" in --check|-c) check=1;; esac
  prev=$a
done
if [ $keep = 1 ] && [ $check = 0 ]; then
  tee "${w.payloads}/p-$n-$$" | ${real} "$@"
else
  ${real} "$@"
fi
rc=$?
echo "$(date +%s%N) end $$ nft $rc" >> ${w.log}
exit $rc
`;
    await Deno.writeTextFile(`${w.bin}/nft`, script, { mode: 0o755 });
  }
  return w;
}

/** One recorded invocation. */
export interface Call {
  pid: number;
  name: string;
  /** The arguments joined with spaces (for display and matching). */
  args: string;
  /** The arguments exactly. */
  argv: string[];
  /** Wall-clock ms. */
  start: number;
  end: number | null;
  rc: number | null;
  /** Payload copy (restores and `nft -f -` only). */
  file: string | null;
}

/** Parses the call log (complete and still-running invocations). */
export function parseCalls(text: string, payloads: string): Call[] {
  const calls: Call[] = [];
  const open = new Map<number, Call>();
  for (const line of text.split("\n")) {
    const m = line.match(/^(\d+) (start|end) (\d+) (\S+) ?(.*)$/);
    if (!m) continue;
    const ms = Number(BigInt(m[1]) / 1000n) / 1000;
    const pid = Number(m[3]);
    if (m[2] === "start") {
      const argv = m[5] === "" ? [] : m[5].split("\x1f");
      if (argv.at(-1) === "") argv.pop();
      const c: Call = {
        pid,
        name: m[4],
        args: argv.join(" "),
        argv,
        start: ms,
        end: null,
        rc: null,
        file: m[4].endsWith("-restore") || isNftApply(m[4], argv) ? `${payloads}/p-${m[1]}-${pid}` : null,
      };
      calls.push(c);
      open.set(pid, c);
    } else {
      const c = open.get(pid);
      if (c) {
        c.end = ms;
        c.rc = Number(m[5]);
        open.delete(pid);
      }
    }
  }
  return calls;
}
