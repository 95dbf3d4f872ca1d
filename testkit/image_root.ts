/**
 * The container image's file set as a directory (`scripts/assemble_rootfs.sh`), and programs run inside it the way
 * a container runtime runs the image: a private mount namespace and PID namespace, `/proc` (of that PID namespace),
 * a read-only `/sys`, a small tmpfs `/dev` with null/zero/full/random/urandom, a tmpfs `/run`, the volumes given as
 * bind mounts, an environment holding only what is passed, and `chroot` into the directory. Nothing of the host is
 * reachable from the program: it sees the image's files, its own processes and the mounts listed here. The network
 * namespace is the caller's (start the command with `ip netns exec`, e.g. through `Sandbox.spawn`).
 *
 * The image runs the `deno compile` binary, which cannot be built here (no `denort`); the test root carries the
 * `deno` binary instead (staged by the same script with its ldd closure) plus the project's sources and npm cache,
 * and runs `deno run` with the `start` task's permission flags.
 * @module
 */

import { type CommandOutput, runCommand } from "./command.ts";
import { PROJECT_ROOT } from "./agent_command.ts";

/** The image's PATH, as distroless sets it. */
export const IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Where the test root keeps the project (the compiled binary's embedded payload in the image). */
export const ROOT_APP_DIR = "/app";
/** Where the test root keeps Deno's cache (DENO_DIR). */
export const ROOT_DENO_DIR = "/deno-dir";
/** Where the test root keeps the deno binary. */
export const ROOT_DENO = "/usr/local/bin/deno";

/** The shared file list of the Dockerfile and the test root. */
export const FILES_LIST = `${PROJECT_ROOT}deploy/image/files.txt`;

/** One entry of deploy/image/files.txt. */
export interface ImageEntry {
  kind: "program" | "helper" | "plugins" | "data" | "base";
  name: string;
  pkg: string;
}

/** Parses deploy/image/files.txt (or `text`). */
export function readImageList(text = Deno.readTextFileSync(FILES_LIST)): ImageEntry[] {
  const out: ImageEntry[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.replace(/#.*/, "").trim();
    if (!line) continue;
    const [kind, name, pkg, ...rest] = line.split(/\s+/);
    if (!["program", "helper", "plugins", "data", "base"].includes(kind) || !pkg || rest.length > 0) {
      throw new Error(`bad entry in ${FILES_LIST}: ${raw}`);
    }
    out.push({ kind: kind as ImageEntry["kind"], name, pkg });
  }
  return out;
}

/** A volume: `source` on the host mounted at `target` inside the root. */
export interface RootMount {
  source: string;
  target: string;
  readOnly?: boolean;
}

/** Options of {@linkcode inRootCommand}. */
export interface InRootOptions {
  /** Bind mounts (files or directories), like a pod's volumes. */
  mounts?: RootMount[];
  /** The whole environment of the program (PATH defaults to {@linkcode IMAGE_PATH}). */
  env?: Record<string, string>;
}

// Runs as root on the host, inside fresh mount and PID namespaces (unshare), then chroots into the root.
const LAUNCHER = `
set -eu
root=$1; shift
mounts=()
while [ "$1" != -- ]; do mounts+=("$1"); shift; done; shift
envs=()
while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/run"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=64k tmpfs "$root/dev"
for d in null zero full random urandom; do : >"$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done
mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs "$root/run"
for m in \${mounts[@]+"\${mounts[@]}"}; do
  mode=\${m%%:*}; rest=\${m#*:}; src=\${rest%%:*}; dst=$root\${rest#*:}
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : >>"$dst"; fi
  mount --bind "$src" "$dst"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst"; fi
done
chroot=$(command -v chroot)
exec env -i \${envs[@]+"\${envs[@]}"} "$chroot" "$root" "$@"
`;

/**
 * `[cmd, args]` that run `argv` inside `root` as described in the module doc. Start it in the wanted network
 * namespace (`ip netns exec NS cmd args`). The first process inside is PID 1 of its namespace; when the returned
 * command's process dies, the program gets SIGTERM (`unshare --kill-child`).
 */
export function inRootCommand(root: string, argv: string[], opts: InRootOptions = {}): [string, string[]] {
  for (const m of opts.mounts ?? []) {
    if (m.source.includes(":") || m.target.includes(":") || !m.target.startsWith("/")) {
      throw new Error(`unsupported mount ${m.source} -> ${m.target}`);
    }
  }
  const env = { PATH: IMAGE_PATH, ...opts.env };
  return ["unshare", [
    "--mount",
    "--pid",
    "--fork",
    "--propagation",
    "private",
    "--kill-child=SIGTERM",
    "bash",
    "-c",
    LAUNCHER,
    "image-root",
    root,
    ...(opts.mounts ?? []).map((m) => `${m.readOnly ? "ro" : "rw"}:${m.source}:${m.target}`),
    "--",
    ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
    "--",
    ...argv,
  ]];
}

/** The outcome of {@linkcode runInRoot}. */
export type RootRunResult = CommandOutput;

/** Runs `argv` inside `root` (in network namespace `netns` when given) and collects its output. */
export async function runInRoot(
  root: string,
  argv: string[],
  opts: InRootOptions & { netns?: string; stdin?: string } = {},
): Promise<RootRunResult> {
  const [cmd, args] = inRootCommand(root, argv, opts);
  return await runCommand(cmd, args, opts);
}

/** Runs `cmd args` on the host (in `netns` when given) with only PATH set, for comparison with the root. */
export async function runOnHost(
  argv: string[],
  opts: { netns?: string; stdin?: string } = {},
): Promise<RootRunResult> {
  return await runCommand("env", ["-i", `PATH=${IMAGE_PATH}`, ...argv], opts);
}

/** Options of {@linkcode assembleTestRoot}. */
export interface TestRootOptions {
  /** Also copy the project and Deno's npm cache so that `deno run` of the agent works inside (default true). */
  withAgent?: boolean;
}

/** Deno's npm cache directory as the running deno uses it. */
async function npmCache(): Promise<string> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json"],
    stdout: "piped",
    stderr: "null",
  })
    .output();
  if (!out.success) throw new Error("deno info --json failed");
  return JSON.parse(new TextDecoder().decode(out.stdout)).npmCache;
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "piped" }).output();
  if (!out.success) {
    const dec = new TextDecoder();
    throw new Error(`${cmd} ${args.join(" ")} failed:\n${dec.decode(out.stdout)}${dec.decode(out.stderr)}`);
  }
}

/**
 * Assembles the image's file set plus the distroless base's share (`--with-base`) and the `deno` binary into a new
 * temporary directory (returned; the caller removes it). With `withAgent`, also copies main.ts, lib/, deno.json and
 * deno.lock to {@linkcode ROOT_APP_DIR} and Deno's npm cache to {@linkcode ROOT_DENO_DIR}.
 */
export async function assembleTestRoot(opts: TestRootOptions = {}): Promise<string> {
  const root = await Deno.makeTempDir({ prefix: "dkp-image-root-" });
  try {
    await run("bash", [
      `${PROJECT_ROOT}scripts/assemble_rootfs.sh`,
      "--with-base",
      `--program=${Deno.realPathSync(Deno.execPath())}=${ROOT_DENO}`,
      FILES_LIST,
      root,
    ]);
    if (opts.withAgent ?? true) {
      await Deno.mkdir(`${root}${ROOT_APP_DIR}`, { recursive: true });
      await run("cp", [
        "-a",
        ...["main.ts", "lib", "deno.json", "deno.lock"].map((f) => PROJECT_ROOT + f),
        `${root}${ROOT_APP_DIR}/`,
      ]);
      await Deno.mkdir(`${root}${ROOT_DENO_DIR}`, { recursive: true });
      await run("cp", ["-a", "--reflink=auto", await npmCache(), `${root}${ROOT_DENO_DIR}/`]);
    }
    return root;
  } catch (err) {
    await Deno.remove(root, { recursive: true }).catch(() => {});
    throw err;
  }
}
