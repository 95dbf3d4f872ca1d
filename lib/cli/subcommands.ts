/**
 * The words that make `kube-proxy` run a subcommand instead of the agent. Kept apart from the subcommands
 * themselves, which main.ts imports only when one is named, so that the agent's start path loads none of
 * them (nor @kubernetes/client-node, which they use).
 * @module
 */

/** `kube-proxy render ...`, `kube-proxy explain ...`. */
export const SUBCOMMANDS: readonly string[] = ["render", "explain"];

/** True when argv (without the program name) names a subcommand as its first word. */
export function isSubcommand(argv: readonly string[]): boolean {
  return argv.length > 0 && SUBCOMMANDS.includes(argv[0]);
}
