/**
 * Runs a program to completion for tests, scripts and benchmarks: optional stdin text, optionally inside a
 * network namespace (`ip netns exec`), output decoded.
 * @module
 */

/** Exit code and decoded output of {@linkcode runCommand}. */
export interface CommandOutput {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `cmd args` (in `netns` when given) with `stdin` as its input, and waits for it. */
export async function runCommand(
  cmd: string,
  args: string[],
  opts: { stdin?: string; netns?: string } = {},
): Promise<CommandOutput> {
  const child = new Deno.Command(opts.netns ? "ip" : cmd, {
    args: opts.netns ? ["netns", "exec", opts.netns, cmd, ...args] : args,
    stdin: opts.stdin === undefined ? "null" : "piped",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  if (opts.stdin !== undefined) {
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode(opts.stdin));
    await w.close();
  }
  const out = await child.output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}
