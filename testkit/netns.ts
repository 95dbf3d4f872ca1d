/**
 * A throwaway network namespace and a CommandRunner that runs everything inside it, with a private xtables
 * lock (./xtables_lock.ts).
 */
import { type CommandResult, type CommandRunner, type CommandSpec, DenoCommandRunner } from "../lib/exec.ts";
import { usePrivateXtablesLock } from "./xtables_lock.ts";

const host = new DenoCommandRunner();

/** Why network namespaces cannot be created here (not root, no `ip`), or undefined when they can. */
export function netnsUnavailableReason(): string | undefined {
  try {
    if (Deno.uid() !== 0) return "network namespace tests need root";
    if (!new Deno.Command("ip", { args: ["netns", "list"] }).outputSync().success) {
      return "`ip netns list` fails";
    }
    return undefined;
  } catch (e) {
    return `cannot run \`ip netns\`: ${(e as Error).message}`;
  }
}

/** True when we can create namespaces (root). */
export function canUseNetns(): boolean {
  return netnsUnavailableReason() === undefined;
}

/** Runs programs inside a namespace via `ip netns exec`. */
export class NetnsRunner implements CommandRunner {
  constructor(readonly ns: string, readonly inner: CommandRunner = host) {
    usePrivateXtablesLock();
  }
  private wrap(spec: CommandSpec): CommandSpec {
    return { ...spec, cmd: "ip", args: ["netns", "exec", this.ns, spec.cmd, ...spec.args] };
  }
  run(spec: CommandSpec): Promise<CommandResult> {
    return this.inner.run(this.wrap(spec));
  }
  tryRun(spec: CommandSpec): Promise<CommandResult> {
    return this.inner.tryRun(this.wrap(spec));
  }
}

/** Creates `dkp-ipt-<random>`, runs fn, deletes the namespace whatever happens. */
export async function withNetns<T>(fn: (runner: NetnsRunner, ns: string) => Promise<T>): Promise<T> {
  usePrivateXtablesLock();
  const ns = `dkp-ipt-${crypto.randomUUID().slice(0, 8)}`;
  await host.run({ cmd: "ip", args: ["netns", "add", ns] });
  try {
    const r = new NetnsRunner(ns);
    await r.run({ cmd: "ip", args: ["link", "set", "lo", "up"] });
    return await fn(r, ns);
  } finally {
    await host.tryRun({ cmd: "ip", args: ["netns", "del", ns] });
  }
}
