/**
 * The text `kube-proxy render` prints, and its reverse: each command the agent would run as a comment line
 * `# <cmd> <args> (<family>)`, followed by what the command reads on stdin (nothing for a command without
 * input, such as `sysctl -w`). `#` starts a comment for iptables-restore, nft, ipset restore and ip -batch,
 * so a section can be fed to its program as it is.
 * @module
 */
import type { IPFamily } from "../proxy/types.ts";
import type { RenderedCommand } from "./engine.ts";

/** The header line of a command. */
export function commandHeader(c: { cmd: string; args: readonly string[]; family: IPFamily }): string {
  return `# ${[c.cmd, ...c.args].join(" ")} (${c.family})`;
}

/** Render's output for these commands. */
export function formatCommands(commands: readonly RenderedCommand[]): string {
  let out = "";
  for (const c of commands) {
    out += commandHeader(c) + "\n";
    if (c.stdin !== "") out += c.stdin.endsWith("\n") ? c.stdin : c.stdin + "\n";
  }
  return out;
}

const HEADER = /^# (\S+)((?: \S+)*) \((IPv4|IPv6)\)$/;

/**
 * Splits render's output back into commands (for scripts and tests): every header line starts a command, the
 * lines up to the next header are its stdin. Text before the first header is ignored.
 */
export function parseRenderOutput(text: string): RenderedCommand[] {
  const out: { cmd: string; args: string[]; stdin: string; family: IPFamily }[] = [];
  for (const line of text.split("\n")) {
    const m = HEADER.exec(line);
    if (m) {
      out.push({
        cmd: m[1],
        args: m[2].trim() === "" ? [] : m[2].trim().split(" "),
        stdin: "",
        family: m[3] as IPFamily,
      });
    } else if (out.length > 0) {
      out[out.length - 1].stdin += line + "\n";
    }
  }
  // The split leaves one extra "\n" after the last line of the text.
  for (const c of out) c.stdin = c.stdin.replace(/\n+$/, "\n").replace(/^\n$/, "");
  return out;
}
