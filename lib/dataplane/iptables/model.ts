/**
 * iptables rules as typed objects: one parser for what the agent writes (`iptables-restore` input) and what the
 * kernel gives back (`iptables-save`), so that state written and state read back are the same model. A rule is
 * parsed into its matches (address, protocol, interface and each `-m` module's options) and its target, and
 * gets a canonical key in which the spellings the tools differ in no longer differ (`10.0.0.1` vs
 * `10.0.0.1/32`, `0x00004000` vs `0x4000`, `--probability 0.5000000000` vs `0.50000000000`, defaults
 * `iptables-save` adds such as `--reject-with icmp-port-unreachable` or `-m recent --mask ... --rsource`).
 *
 * {@linkcode IptablesTables} applies restore input with `--noflush` semantics (what the agent runs) and
 * prints itself as `iptables-save` does, so it serves as the Fake of the iptables tools.
 * @module
 */
import { parseCIDR, parseIP } from "../../net/ip.ts";

/** One option of a match or target: `--dport 80` is `{ name: "dport", values: ["80"], negated: false }`. */
export interface IptOption {
  readonly name: string;
  readonly values: readonly string[];
  readonly negated: boolean;
}

/** A match module (`-m tcp --dport 80`) or the built-in matches (`-s`, `-d`, `-p`, `-i`, `-o`: module "" ). */
export interface IptMatch {
  readonly module: string;
  readonly options: readonly IptOption[];
}

/** One rule of a chain. */
export interface IptRule {
  readonly chain: string;
  /** The built-in matches first (module ""), then the modules in order. */
  readonly matches: readonly IptMatch[];
  /** `-j` or `-g` target (a chain or an extension), null for a rule without one (a counter or comment). */
  readonly target: string | null;
  readonly goto: boolean;
  readonly targetOptions: readonly IptOption[];
  /** The rule as written, after `-A CHAIN`. */
  readonly text: string;
  /** The canonical form: equal keys mean the kernel treats the rules the same. */
  readonly key: string;
}

/** A chain: its policy (`-` for user chains) and rules. */
export interface IptChain {
  readonly name: string;
  policy: string;
  rules: IptRule[];
}

/** Raised for input the parser cannot read; says the line. */
export class IptablesParseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "IptablesParseError";
  }
}

const BUILTIN_CHAINS: Readonly<Record<string, readonly string[]>> = {
  filter: ["INPUT", "FORWARD", "OUTPUT"],
  nat: ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
  mangle: ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
  raw: ["PREROUTING", "OUTPUT"],
  security: ["INPUT", "FORWARD", "OUTPUT"],
};

/** Whether `chain` is a built-in chain of `table`. */
export function isBuiltinChain(table: string, chain: string): boolean {
  return BUILTIN_CHAINS[table]?.includes(chain) ?? false;
}

/** Joins words back into a rule line, quoting those with spaces or quotes as `iptables-save` does. */
export function joinWords(words: readonly string[]): string {
  return words.map((w) => /[\s"]/.test(w) || w === "" ? `"${w.replaceAll('"', '\\"')}"` : w).join(" ");
}

/** Splits a rule line into words as the shell would (double quotes, `\"` inside them). */
export function splitWords(line: string): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < line.length) {
    while (line[i] === " " || line[i] === "\t") i++;
    if (i >= line.length) break;
    let word = "";
    while (i < line.length && line[i] !== " " && line[i] !== "\t") {
      if (line[i] === '"') {
        i++;
        while (i < line.length && line[i] !== '"') {
          if (line[i] === "\\" && i + 1 < line.length) i++;
          word += line[i++];
        }
        if (line[i] !== '"') throw new IptablesParseError(`unterminated quote in: ${line}`);
        i++;
      } else {
        word += line[i++];
      }
    }
    out.push(word);
  }
  return out;
}

const SHORT: Readonly<Record<string, string>> = {
  "-s": "source",
  "--source": "source",
  "--src": "source",
  "-d": "destination",
  "--destination": "destination",
  "--dst": "destination",
  "-p": "protocol",
  "--protocol": "protocol",
  "-i": "in-interface",
  "--in-interface": "in-interface",
  "-o": "out-interface",
  "--out-interface": "out-interface",
};

/** Parses the words of a rule after `-A CHAIN` (or `-I CHAIN [n]`). */
export function parseRule(chain: string, words: readonly string[], text = joinWords(words)): IptRule {
  const builtin: IptOption[] = [];
  const modules: { module: string; options: IptOption[] }[] = [];
  let target: string | null = null;
  let goto = false;
  const targetOptions: IptOption[] = [];
  let current: IptOption[] | null = null;
  let negate = false;
  for (let i = 0; i < words.length; i++) {
    const w = words[i];
    if (w === "!") {
      negate = true;
      continue;
    }
    const top = SHORT[w];
    if (top !== undefined) {
      const v = words[++i];
      if (v === undefined) throw new IptablesParseError(`${w} needs a value in: ${text}`);
      builtin.push({ name: top, values: [v], negated: negate });
      negate = false;
      continue;
    }
    if (w === "-m" || w === "--match") {
      const m = words[++i];
      if (m === undefined) throw new IptablesParseError(`-m needs a module in: ${text}`);
      const options: IptOption[] = [];
      modules.push({ module: m, options });
      current = options;
      continue;
    }
    if (w === "-j" || w === "--jump" || w === "-g" || w === "--goto") {
      target = words[++i] ?? null;
      if (target === null) throw new IptablesParseError(`${w} needs a target in: ${text}`);
      goto = w === "-g" || w === "--goto";
      current = targetOptions;
      continue;
    }
    if (w.startsWith("--") && current === null) {
      // `-p tcp --dport 80` without `-m tcp`: iptables loads the protocol's match implicitly.
      const proto = builtin.find((o) => o.name === "protocol")?.values[0]?.toLowerCase();
      if (proto === "tcp" || proto === "udp" || proto === "sctp") {
        current = [];
        modules.push({ module: proto, options: current });
      }
    }
    if (w.startsWith("--") && current !== null) {
      const values: string[] = [];
      while (i + 1 < words.length && !words[i + 1].startsWith("-") && words[i + 1] !== "!") {
        values.push(words[++i]);
      }
      current.push({ name: w.slice(2), values, negated: negate });
      negate = false;
      continue;
    }
    throw new IptablesParseError(`unexpected "${w}" in: ${text}`);
  }
  const matches: IptMatch[] = [];
  if (builtin.length > 0) matches.push({ module: "", options: builtin });
  matches.push(...modules);
  return {
    chain,
    matches,
    target,
    goto,
    targetOptions,
    text,
    key: ruleKey(matches, target, goto, targetOptions),
  };
}

/** The option's value in canonical form (see the module doc). */
function canonicalValue(module: string, name: string, v: string): string {
  if (name === "source" || name === "destination") {
    const c = parseCIDR(v.includes("/") ? v : `${v}/${v.includes(":") ? 128 : 32}`);
    return c ? c.cidr : v;
  }
  if (name === "protocol") return v.toLowerCase();
  if (
    name === "mark" || name === "or-mark" || name === "xor-mark" || name === "set-xmark" ||
    name === "and-mark"
  ) {
    return v.split("/").map((x) => "0x" + BigInt(x).toString(16)).join("/");
  }
  if (name === "probability") return Number(v).toFixed(6);
  if (name === "to-destination") {
    const m = v.match(/^\[([^\]]+)\](:.*)?$/) ?? v.match(/^([^:]+)(:.*)?$/);
    const ip = m ? parseIP(m[1]) : null;
    if (ip) return (ip.family === "IPv6" ? `[${ip.ip}]` : ip.ip) + (m![2] ?? "");
  }
  if (module === "conntrack" && name === "ctstate") return v.split(",").sort().join(",");
  return v;
}

/** Options `iptables-save` prints that only spell out a default; left out of the key. */
function isDefault(module: string, o: IptOption): boolean {
  if (module === "recent") {
    return (o.name === "mask" && /^(255\.255\.255\.255|ffff(:ffff){7})$/.test(o.values[0])) ||
      o.name === "rsource";
  }
  if (module === "REJECT") return o.name === "reject-with" && /^icmp6?-port-unreachable$/.test(o.values[0]);
  return false;
}

function optionKey(module: string, o: IptOption): string {
  return `${o.negated ? "!" : ""}${o.name}=${
    o.values.map((v) => canonicalValue(module, o.name, v)).join(" ")
  }`;
}

/** MARK's `--or-mark X` and `--xor-mark X` as the `--set-xmark X/X` and `--set-xmark X/0` iptables-save prints. */
function markTargetOptions(options: readonly IptOption[]): readonly IptOption[] {
  return options.map((o) =>
    o.name === "or-mark"
      ? { name: "set-xmark", values: [`${o.values[0]}/${o.values[0]}`], negated: false }
      : o.name === "xor-mark"
      ? { name: "set-xmark", values: [`${o.values[0]}/0`], negated: false }
      : o
  );
}

function ruleKey(
  matches: readonly IptMatch[],
  target: string | null,
  goto: boolean,
  options: readonly IptOption[],
): string {
  let targetOptions = options;
  const parts = matches
    .filter((m) => !(m.module === "tcp" || m.module === "udp" || m.module === "sctp") || m.options.length > 0)
    .map((m) =>
      `${m.module}(${
        m.options.filter((o) => !isDefault(m.module, o)).map((o) => optionKey(m.module, o)).sort().join(",")
      })`
    )
    .sort();
  if (target === "MARK") targetOptions = markTargetOptions(targetOptions);
  const t = target === null
    ? ""
    : `${goto ? "goto" : "jump"} ${target}(${
      targetOptions.filter((o) => !isDefault(target, o)).map((o) => optionKey(target, o)).sort().join(",")
    })`;
  return parts.join(" ") + " -> " + t;
}

/** The value of option `name` of the rule's module `module` ("" for the built-in matches), if present. */
export function ruleOption(rule: IptRule, module: string, name: string): IptOption | undefined {
  for (const m of rule.matches) {
    if (m.module !== module) continue;
    const o = m.options.find((x) => x.name === name);
    if (o) return o;
  }
  return undefined;
}

/** The value of a target option (`to-destination`, `or-mark`...), if present. */
export function targetOption(rule: IptRule, name: string): string | undefined {
  return rule.targetOptions.find((o) => o.name === name)?.values[0];
}

/** The comment of a rule, if it has one. */
export function ruleComment(rule: IptRule): string | undefined {
  return ruleOption(rule, "comment", "comment")?.values[0];
}

/** The tables of one IP family: applies restore input and prints as `iptables-save`. */
export class IptablesTables {
  readonly tables = new Map<string, Map<string, IptChain>>();

  /** Parses an `iptables-save` dump (or restore input) into fresh tables. */
  static parse(text: string): IptablesTables {
    const t = new IptablesTables();
    t.restore(text, false);
    return t;
  }

  /** The chain `table`/`name`, if it exists. */
  chain(table: string, name: string): IptChain | undefined {
    return this.tables.get(table)?.get(name);
  }

  private table(name: string): Map<string, IptChain> {
    let t = this.tables.get(name);
    if (!t) {
      t = new Map();
      for (const c of BUILTIN_CHAINS[name] ?? []) t.set(c, { name: c, policy: "ACCEPT", rules: [] });
      this.tables.set(name, t);
    }
    return t;
  }

  /**
   * Applies `iptables-restore` input. With `noflush` (the agent's `--noflush`), tables are kept and a
   * `:CHAIN` line flushes that chain; without it, each table named is replaced.
   * @throws {IptablesParseError} For a line it cannot read or a rule naming a missing chain.
   */
  restore(text: string, noflush = true): void {
    let table: Map<string, IptChain> | null = null;
    let tableName = "";
    for (const raw of text.split("\n")) {
      const line = raw.trim();
      if (line === "" || line.startsWith("#")) continue;
      if (line.startsWith("*")) {
        tableName = line.slice(1);
        if (!noflush) this.tables.delete(tableName);
        table = this.table(tableName);
        continue;
      }
      if (table === null) throw new IptablesParseError(`no table before: ${line}`);
      if (line === "COMMIT") {
        table = null;
        continue;
      }
      if (line.startsWith(":")) {
        const [name, policy] = line.slice(1).split(/\s+/);
        const c = table.get(name);
        if (c) {
          if (policy !== "-") c.policy = policy;
          if (!isBuiltinChain(tableName, name) || !noflush) c.rules = [];
        } else {
          table.set(name, { name, policy: policy ?? "-", rules: [] });
        }
        continue;
      }
      const words = splitWords(line);
      const op = words[0];
      const chainName = words[1];
      const c = chainName === undefined ? undefined : table.get(chainName);
      if (op === "-X" || op === "--delete-chain") {
        table.delete(chainName);
        continue;
      }
      if (!c) throw new IptablesParseError(`chain ${chainName} does not exist in ${tableName}: ${line}`);
      if (op === "-A" || op === "--append") {
        c.rules.push(parseRule(chainName, words.slice(2)));
      } else if (op === "-I" || op === "--insert") {
        const n = /^\d+$/.test(words[2] ?? "") ? Number(words[2]) : 1;
        const rest = words.slice(/^\d+$/.test(words[2] ?? "") ? 3 : 2);
        c.rules.splice(n - 1, 0, parseRule(chainName, rest));
      } else if (op === "-D" || op === "--delete") {
        const r = parseRule(chainName, words.slice(2));
        const i = c.rules.findIndex((x) => x.key === r.key);
        if (i < 0) throw new IptablesParseError(`no such rule in ${chainName}: ${line}`);
        c.rules.splice(i, 1);
      } else if (op === "-F" || op === "--flush") {
        c.rules = [];
      } else {
        throw new IptablesParseError(`unknown command "${op}" in: ${line}`);
      }
    }
  }

  /** The tables as `iptables-save` prints them (without counters and the header comments). */
  dump(): string {
    const out: string[] = [];
    for (const [name, chains] of [...this.tables].sort(([a], [b]) => a.localeCompare(b))) {
      out.push(`*${name}`);
      for (const c of chains.values()) out.push(`:${c.name} ${c.policy} [0:0]`);
      for (const c of chains.values()) for (const r of c.rules) out.push(`-A ${c.name} ${r.text}`);
      out.push("COMMIT");
    }
    return out.join("\n") + "\n";
  }
}
