/**
 * iptables rules as typed objects on the way out: a rule is its chain and its arguments (one string per
 * argument, as `iptables` takes them), and {@linkcode ruleLine} is the one place that checks and quotes them
 * into a line of `iptables-restore` input, as `iptables-save` prints it (an argument with whitespace in double
 * quotes). No renderer writes quotes by hand. The read side is `iptables/model.ts` (the same line form parsed
 * back into chains, matches and targets), so what the agent writes and what the kernel shows are one model.
 *
 * Shared by the iptables and ipvs modes (both write iptables rules).
 * @module
 */

/**
 * A run of arguments already checked and quoted (what {@linkcode comment}, {@linkcode protocol},
 * {@linkcode jump} and {@linkcode args} return): built once, written into many rules without checking again.
 */
export class RuleFragment {
  /** @param text the arguments as rule text, each preceded by a space. */
  private constructor(readonly text: string) {}

  /** The fragment of already checked text (this module's constructors only). */
  static of(text: string): RuleFragment {
    return new RuleFragment(text);
  }
}

/** A rule's arguments: single arguments, lists of them, or checked fragments, in order. */
export type RuleArgs = readonly (string | RuleFragment | readonly string[])[];

/** Raised for a rule iptables would refuse or read differently (a bad chain name, an unquotable argument). */
export class IptablesRuleError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "IptablesRuleError";
  }
}

/** The longest chain name iptables accepts (XT_EXTENSION_MAXNAMELEN - 1). */
export const MAX_CHAIN_NAME = 28;
/** The longest `-m comment` text the kernel keeps (XT_MAX_COMMENT_LEN - 1). */
export const MAX_COMMENT = 255;

const encoder = new TextEncoder();

/**
 * Checks a chain name as iptables does: 1-28 characters, no whitespace, not an option (`-`) or negation (`!`).
 * @throws {IptablesRuleError} When iptables would refuse it.
 */
export function checkChainName(name: string): string {
  if (
    name.length === 0 || name.length > MAX_CHAIN_NAME || /[\s"]/.test(name) || name[0] === "-" ||
    name[0] === "!"
  ) {
    throw new IptablesRuleError(`invalid iptables chain name ${JSON.stringify(name)}`);
  }
  return name;
}

/** `-m comment --comment TEXT` (checked for the kernel's length limit). */
export function comment(text: string): RuleFragment {
  // UTF-8 takes at most 3 bytes per UTF-16 unit: only a long text needs counting.
  if (text.length * 3 > MAX_COMMENT && encoder.encode(text).length > MAX_COMMENT) {
    throw new IptablesRuleError(`iptables comment longer than ${MAX_COMMENT} bytes: ${JSON.stringify(text)}`);
  }
  return RuleFragment.of(" -m comment --comment" + arg(text));
}

const PROTOCOLS = new Map<string, RuleFragment>();

/** `-m PROTO -p PROTO` (protocol match and its port options' module). */
export function protocol(proto: string): RuleFragment {
  let f = PROTOCOLS.get(proto);
  if (f === undefined) PROTOCOLS.set(proto, f = args("-m", proto, "-p", proto));
  return f;
}

/** `-j TARGET [options]`. */
export function jump(target: string, ...options: string[]): RuleFragment {
  return args("-j", target, ...options);
}

/** Arguments checked and quoted once, to be written into many rules. */
export function args(...list: string[]): RuleFragment {
  let text = "";
  for (const a of list) text += arg(a);
  return RuleFragment.of(text);
}

/** Splits a fixed run of match arguments written as one string (`! -s 10.0.0.0/8`) into its arguments. */
export function words(s: string): RuleFragment {
  return s === "" ? args() : args(...s.split(" "));
}

/**
 * One line of `iptables-restore` input, `-A CHAIN ARG...\n`: each argument checked (not empty; no newline,
 * NUL or double quote, which iptables-restore's quoting cannot carry) and quoted when it has whitespace.
 * @throws {IptablesRuleError} For a bad chain name or argument.
 */
export function ruleLine(chain: string, ...list: RuleArgs): string {
  return "-A " + checkChainName(chain) + argsText(list) + "\n";
}

/**
 * `-I CHAIN POSITION ARG...\n`: a rule inserted at `position` (1 is first), checked and quoted as
 * {@linkcode ruleLine}.
 * @throws {IptablesRuleError} For a bad chain name or argument.
 */
export function insertLine(chain: string, position: number, ...list: RuleArgs): string {
  return `-I ${checkChainName(chain)} ${position}` + argsText(list) + "\n";
}

/** The arguments as a rule's text after its chain (each preceded by a space), checked and quoted. */
function argsText(list: RuleArgs): string {
  let line = "";
  for (const a of list) {
    if (typeof a === "string") line += arg(a);
    else if (a instanceof RuleFragment) line += a.text;
    else for (const x of a) line += arg(x);
  }
  return line;
}

/** ` ARG`, quoted when it has whitespace. */
function arg(a: string): string {
  if (a === "") throw new IptablesRuleError("empty iptables argument");
  if (!NEEDS_CARE.test(a)) return " " + a;
  if (BAD.test(a)) {
    throw new IptablesRuleError(`iptables argument iptables-restore cannot carry: ${JSON.stringify(a)}`);
  }
  return ` "${a}"`;
}

const NEEDS_CARE = /[\s"\0]/;
const BAD = /["\n\r\0]/;

/** `:CHAIN POLICY [0:0]` (the declaration `iptables-restore` takes; `-` for a user chain). */
export function chainLine(name: string, policy = "-"): string {
  return `:${checkChainName(name)} ${policy} [0:0]\n`;
}

/** `-X CHAIN` (deletes an emptied user chain). */
export function deleteChainLine(name: string): string {
  return `-X ${checkChainName(name)}\n`;
}
