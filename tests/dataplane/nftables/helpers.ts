/**
 * Helpers for comparing the fake with the kernel: a throwaway network namespace with a command runner
 * inside it, and the normalization of `nft list table` output. (The netns part mirrors
 * tests/iptables/netns.ts, kept here so this folder stands alone while the test support moves.)
 * @module
 */
import {
  type CommandResult,
  type CommandRunner,
  type CommandSpec,
  DenoCommandRunner,
} from "../../../lib/exec.ts";

const host = new DenoCommandRunner();

/** True when network namespaces can be made (root, `ip` present, `nft` present). */
export function canUseNetns(): boolean {
  try {
    return Deno.uid() === 0 &&
      new Deno.Command("ip", { args: ["netns", "list"] }).outputSync().success &&
      new Deno.Command("nft", { args: ["--version"], stdout: "null" }).outputSync().success;
  } catch {
    return false;
  }
}

/** Runs programs inside a namespace through `ip netns exec`. */
export class NetnsRunner implements CommandRunner {
  constructor(readonly ns: string) {}
  #wrap(spec: CommandSpec): CommandSpec {
    return { ...spec, cmd: "ip", args: ["netns", "exec", this.ns, spec.cmd, ...spec.args] };
  }
  run(spec: CommandSpec): Promise<CommandResult> {
    return host.run(this.#wrap(spec));
  }
  tryRun(spec: CommandSpec): Promise<CommandResult> {
    return host.tryRun(this.#wrap(spec));
  }
}

/** Creates `dkp-nft-<random>`, runs fn inside, and deletes the namespace whatever happens. */
export async function withNetns<T>(fn: (runner: NetnsRunner) => Promise<T>): Promise<T> {
  const ns = `dkp-nft-${crypto.randomUUID().slice(0, 8)}`;
  await host.run({ cmd: "ip", args: ["netns", "add", ns] });
  try {
    return await fn(new NetnsRunner(ns));
  } finally {
    await host.tryRun({ cmd: "ip", args: ["netns", "del", ns] });
  }
}

/** Splits the inside of `{ … }` into items and the delimiters between them, respecting quotes. */
function splitItems(body: string): { items: string[]; delims: string[] } {
  const items: string[] = [];
  const delims: string[] = [];
  let cur = "";
  let quoted = false;
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (c === '"') quoted = !quoted;
    if (!quoted && c === ",") {
      const m = /^,(?:\n\t\t\t {5}| )/.exec(body.slice(i));
      if (m) {
        items.push(cur);
        delims.push(m[0]);
        cur = "";
        i += m[0].length - 1;
        continue;
      }
    }
    cur += c;
  }
  items.push(cur);
  return { items, delims };
}

/**
 * Normalizes `nft list table` output (the kernel's or the fake's) for comparison, removing only what the
 * kernel adds at run time or orders at random:
 * - ` expires <time>` of elements with a timeout (the time left, which keeps falling);
 * - the order of elements of sets and maps without the interval flag (the kernel lists hash sets in hash
 *   order, seeded at random); the line wrapping (which depends only on the count) is kept and compared.
 */
export function normalizeListing(text: string): string {
  const lines = text.split("\n");
  const out: string[] = [];
  let interval = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (/^\t(?:set|map) \S+ \{$/.test(line)) interval = false;
    if (/^\t\tflags \S*interval/.test(line)) interval = true;
    if (!line.startsWith("\t\telements = { ")) {
      out.push(line);
      continue;
    }
    let block = line;
    while (!block.endsWith(" }") && i + 1 < lines.length) block += "\n" + lines[++i];
    const body = block.slice("\t\telements = { ".length, -2);
    const { items, delims } = splitItems(body);
    const cleaned = items.map((it) => it.replace(/ expires [0-9dhms]+/, ""));
    if (!interval) cleaned.sort();
    let joined = cleaned[0];
    for (let k = 1; k < cleaned.length; k++) joined += delims[k - 1] + cleaned[k];
    out.push(...`\t\telements = { ${joined} }`.split("\n"));
  }
  return out.join("\n");
}
