/**
 * A small pflag-compatible flag set (github.com/spf13/pflag semantics, no dependency).
 *
 * Supports `--f=v`, `--f v`, `-v=4`, `-v4`, `-v 4`, `--bool`, `--bool=false`, `--` ending flags, `_` normalised to
 * `-` in names (Kubernetes' `WordSepNormalizeFunc`), `Changed` tracking, deprecated and hidden flags, pflag's error
 * messages and pflag's `FlagUsages` help layout.
 * @module
 */

import { isIP, splitHostPort } from "../net/ip.ts";
import { formatDuration, goQuote, parseDuration } from "./duration.ts";

/** A flag's value: parses text, prints itself, names its type (as pflag's `Value`). */
export interface FlagValue {
  /** Parses and stores `s`; throws an Error whose message becomes pflag's "invalid argument" reason. */
  set(s: string): void;
  /** The value as text (used for defaults in help). */
  string(): string;
  /** The type name printed in help (`string`, `duration`, `int32`, ...). */
  type(): string;
}

/** One registered flag. */
export interface Flag {
  name: string;
  shorthand: string;
  usage: string;
  value: FlagValue;
  /** Default value text, captured at registration. */
  defValue: string;
  /** Value used when the flag is given without `=value` (bools: "true"). */
  noOptDefVal: string;
  /** True once the flag was set on the command line. */
  changed: boolean;
  /** When non-empty the flag is hidden from help and a notice is printed on use. */
  deprecated: string;
  hidden: boolean;
}

/** Options for registering a flag. */
export interface FlagOptions {
  shorthand?: string;
  noOptDefVal?: string;
  deprecated?: string;
  hidden?: boolean;
}

/** A command-line parse error; `message` is pflag's wording. */
export class FlagError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FlagError";
  }
}

/** Thrown by `parse` for `--help` / `-h` when no such flag is defined (pflag's ErrHelp). */
export class HelpRequested extends Error {
  constructor() {
    super("pflag: help requested");
    this.name = "HelpRequested";
  }
}

// ---- values -------------------------------------------------------------------------------------------------

/** strconv.ParseBool. */
export function parseGoBool(s: string): boolean {
  switch (s) {
    case "1":
    case "t":
    case "T":
    case "TRUE":
    case "true":
    case "True":
      return true;
    case "0":
    case "f":
    case "F":
    case "FALSE":
    case "false":
    case "False":
      return false;
  }
  throw new Error(`strconv.ParseBool: parsing ${goQuote(s)}: invalid syntax`);
}

/** strconv.ParseInt(s, 0, bits) with Go's messages. */
export function parseGoInt(s: string, bits: number, fn = "strconv.ParseInt", unsigned = false): number {
  let t = s;
  let neg = false;
  if (!unsigned && (t.startsWith("-") || t.startsWith("+"))) {
    neg = t[0] === "-";
    t = t.slice(1);
  }
  let base = 10;
  if (/^0[xX]/.test(t)) [base, t] = [16, t.slice(2)];
  else if (/^0[bB]/.test(t)) [base, t] = [2, t.slice(2)];
  else if (/^0[oO]/.test(t)) [base, t] = [8, t.slice(2)];
  else if (/^0[0-7_]/.test(t)) [base, t] = [8, t.slice(1)];
  t = t.replace(/(?<=[0-9a-fA-F])_(?=[0-9a-fA-F])/g, "");
  const digits = base === 16
    ? /^[0-9a-fA-F]+$/
    : base === 8
    ? /^[0-7]+$/
    : base === 2
    ? /^[01]+$/
    : /^[0-9]+$/;
  if (!digits.test(t)) throw new Error(`${fn}: parsing ${goQuote(s)}: invalid syntax`);
  const v = (neg ? -1 : 1) * parseInt(t, base);
  const max = unsigned ? 2 ** bits - 1 : 2 ** (bits - 1) - 1;
  const min = unsigned ? 0 : -(2 ** (bits - 1));
  if (v > max || v < min) throw new Error(`${fn}: parsing ${goQuote(s)}: value out of range`);
  return v;
}

/** strconv.ParseFloat. */
export function parseGoFloat(s: string): number {
  const t = s.replace(/_/g, "");
  if (
    !/^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|[iI]nf(inity)?|NaN|0[xX][0-9a-fA-F.]+[pP][+-]?\d+)$/
      .test(t)
  ) {
    throw new Error(`strconv.ParseFloat: parsing ${goQuote(s)}: invalid syntax`);
  }
  return Number(t.replace(/^([+-]?)[iI]nf(inity)?$/, "$1Infinity"));
}

/** A value backed by getter/setter closures, so flags can write straight into a config object. */
export class BoundValue<T> implements FlagValue {
  constructor(
    private readonly typeName: string,
    private readonly get: () => T,
    private readonly put: (v: T) => void,
    private readonly parse: (s: string) => T,
    private readonly show: (v: T) => string = (v) => String(v),
  ) {}
  set(s: string): void {
    this.put(this.parse(s));
  }
  string(): string {
    return this.show(this.get());
  }
  type(): string {
    return this.typeName;
  }
}

/** pflag's stringSlice: comma-separated (CSV), the first Set replaces the default, later Sets append. */
export class StringSliceValue implements FlagValue {
  private touched = false;
  constructor(private readonly get: () => string[], private readonly put: (v: string[]) => void) {}
  set(s: string): void {
    const parts = s === "" ? [] : parseCsvLine(s);
    if (!this.touched) {
      this.put(parts);
      this.touched = true;
    } else {
      this.put([...this.get(), ...parts]);
    }
  }
  string(): string {
    return "[" + this.get().join(",") + "]";
  }
  type(): string {
    return "stringSlice";
  }
}

function parseCsvLine(s: string): string[] {
  const out: string[] = [];
  let i = 0;
  while (i <= s.length) {
    if (s[i] === '"') {
      let field = "";
      i++;
      while (i < s.length) {
        if (s[i] === '"' && s[i + 1] === '"') {
          field += '"';
          i += 2;
        } else if (s[i] === '"') {
          i++;
          break;
        } else field += s[i++];
      }
      if (i < s.length && s[i] !== ",") {
        throw new Error(`parse error on line 1, column ${i + 1}: extraneous or missing " in quoted-field`);
      }
      out.push(field);
      i++;
    } else {
      const j = s.indexOf(",", i);
      const end = j < 0 ? s.length : j;
      const field = s.slice(i, end);
      if (field.includes('"')) {
        throw new Error(
          `parse error on line 1, column ${i + field.indexOf('"') + 1}: bare " in non-quoted-field`,
        );
      }
      out.push(field);
      i = end + 1;
    }
  }
  return out;
}

/** pflag's stringArray: every Set appends one value as given (no comma splitting); the first replaces the default. */
export class StringArrayValue implements FlagValue {
  private touched = false;
  constructor(private readonly get: () => string[], private readonly put: (v: string[]) => void) {}
  set(s: string): void {
    this.put(this.touched ? [...this.get(), s] : [s]);
    this.touched = true;
  }
  string(): string {
    return "[" + this.get().join(",") + "]";
  }
  type(): string {
    return "stringArray";
  }
}

/** component-base's MapStringBool: `A=true,B=false`; the first Set clears the map, later Sets merge. */
export class MapStringBoolValue implements FlagValue {
  private touched = false;
  constructor(
    private readonly get: () => Record<string, boolean>,
    private readonly put: (v: Record<string, boolean>) => void,
  ) {}
  set(s: string): void {
    const m: Record<string, boolean> = this.touched ? { ...this.get() } : {};
    this.touched = true;
    for (const item of s.split(",")) {
      if (item.length === 0) continue;
      const eq = item.indexOf("=");
      if (eq < 0) throw new Error("malformed pair, expect string=bool");
      const k = item.slice(0, eq).trim();
      const v = item.slice(eq + 1).trim();
      let b: boolean;
      try {
        b = parseGoBool(v);
      } catch (e) {
        throw new Error(`invalid value of ${k}: ${v}, err: ${(e as Error).message}`);
      }
      m[k] = b;
    }
    this.put(m);
  }
  string(): string {
    const m = this.get();
    return Object.keys(m).sort().map((k) => `${k}=${m[k]}`).join(",");
  }
  type(): string {
    return "mapStringBool";
  }
}

// ---- IP helpers (shared with validation) --------------------------------------------------------------------

/** utilflag.IPVar: a single IP address. */
export function parseIPFlag(s: string): string {
  if (!isIP(s)) throw new Error(`${goQuote(s)} is not a valid IP address`);
  return s;
}

/** utilflag.IPPortVar: "ip" or "ip:port" (or empty). */
export function parseIPPortFlag(s: string): string {
  if (s.trim().length === 0) return "";
  if (isIP(s)) return s;
  let host: string, port: string;
  try {
    [host, port] = splitHostPort(s);
  } catch (e) {
    throw new Error(`${goQuote(s)} is not in a valid format (ip or ip:port): ${(e as Error).message}`);
  }
  if (!isIP(host)) throw new Error(`${goQuote(host)} is not a valid IP address`);
  if (!/^[0-9]+$/.test(port) || Number(port) > 65535) {
    throw new Error(`${goQuote(port)} is not a valid number`);
  }
  return s;
}

// ---- the flag set -------------------------------------------------------------------------------------------

const TYPE_NAMES: Record<string, string> = {
  float64: "float",
  int64: "int",
  uint64: "uint",
  stringSlice: "strings",
  intSlice: "ints",
  uintSlice: "uints",
  boolSlice: "bools",
  bool: "",
};

/** pflag's FlagSet. */
export class FlagSet {
  private readonly flags = new Map<string, Flag>();
  private readonly shorthands = new Map<string, Flag>();
  /** Positional arguments left after parsing. */
  args: string[] = [];
  /** Where deprecation notices go (pflag writes them to the flag set's output, stderr). */
  output: (s: string) => void = (s) => console.error(s.replace(/\n$/, ""));

  constructor(readonly name: string) {}

  /** Kubernetes' WordSepNormalizeFunc: `_` becomes `-`. */
  static normalize(name: string): string {
    return name.replaceAll("_", "-");
  }

  /** Registers a flag with an arbitrary value. */
  add(name: string, value: FlagValue, usage: string, opts: FlagOptions = {}): Flag {
    const n = FlagSet.normalize(name);
    if (this.flags.has(n)) throw new Error(`${this.name} flag redefined: ${n}`);
    const flag: Flag = {
      name: n,
      shorthand: opts.shorthand ?? "",
      usage,
      value,
      defValue: value.string(),
      noOptDefVal: opts.noOptDefVal ?? (value.type() === "bool" ? "true" : ""),
      changed: false,
      deprecated: opts.deprecated ?? "",
      hidden: opts.hidden ?? (opts.deprecated !== undefined && opts.deprecated !== ""),
    };
    this.flags.set(n, flag);
    if (flag.shorthand) this.shorthands.set(flag.shorthand, flag);
    return flag;
  }

  /** A bool flag writing through `put`. */
  bool(name: string, get: () => boolean, put: (v: boolean) => void, usage: string, opts?: FlagOptions): Flag {
    return this.add(name, new BoundValue("bool", get, put, parseGoBool), usage, opts);
  }

  /** A string flag (or a named string type such as `ProxyMode`). */
  string(
    name: string,
    get: () => string,
    put: (v: string) => void,
    usage: string,
    opts?: FlagOptions & { typeName?: string; parse?: (s: string) => string },
  ): Flag {
    return this.add(
      name,
      new BoundValue(opts?.typeName ?? "string", get, put, opts?.parse ?? ((s) => s)),
      usage,
      opts,
    );
  }

  /** An int32 flag (strconv.ParseInt(s, 0, 32)). */
  int32(name: string, get: () => number, put: (v: number) => void, usage: string, opts?: FlagOptions): Flag {
    return this.add(name, new BoundValue("int32", get, put, (s) => parseGoInt(s, 32)), usage, opts);
  }

  /** A float32 flag. */
  float32(
    name: string,
    get: () => number,
    put: (v: number) => void,
    usage: string,
    opts?: FlagOptions,
  ): Flag {
    return this.add(name, new BoundValue("float32", get, put, parseGoFloat, formatGoFloat), usage, opts);
  }

  /** A duration flag; the bound value is in milliseconds. */
  duration(
    name: string,
    get: () => number,
    put: (v: number) => void,
    usage: string,
    opts?: FlagOptions,
  ): Flag {
    return this.add(name, new BoundValue("duration", get, put, parseDuration, formatDuration), usage, opts);
  }

  /** A stringSlice flag. */
  stringSlice(
    name: string,
    get: () => string[],
    put: (v: string[]) => void,
    usage: string,
    opts?: FlagOptions,
  ): Flag {
    return this.add(name, new StringSliceValue(get, put), usage, opts);
  }

  /** A stringArray flag (repeatable; values are not split on commas). */
  stringArray(
    name: string,
    get: () => string[],
    put: (v: string[]) => void,
    usage: string,
    opts?: FlagOptions,
  ): Flag {
    return this.add(name, new StringArrayValue(get, put), usage, opts);
  }

  /** A mapStringBool flag (`--feature-gates=A=true,B=false`). */
  mapStringBool(
    name: string,
    get: () => Record<string, boolean>,
    put: (v: Record<string, boolean>) => void,
    usage: string,
    opts?: FlagOptions,
  ): Flag {
    return this.add(name, new MapStringBoolValue(get, put), usage, opts);
  }

  /** Looks a flag up by (normalised) name. */
  lookup(name: string): Flag | undefined {
    return this.flags.get(FlagSet.normalize(name));
  }

  /** True when the flag was set on the command line (pflag's `Changed`). */
  changed(name: string): boolean {
    return this.lookup(name)?.changed ?? false;
  }

  /** All flags sorted by name, as pflag's VisitAll. */
  all(): Flag[] {
    return [...this.flags.values()].sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  }

  private setFlag(flag: Flag, value: string): void {
    try {
      flag.value.set(value);
    } catch (e) {
      const flagName = flag.shorthand ? `-${flag.shorthand}, --${flag.name}` : `--${flag.name}`;
      throw new FlagError(
        `invalid argument ${goQuote(value)} for ${goQuote(flagName)} flag: ${(e as Error).message}`,
      );
    }
    flag.changed = true;
    if (flag.deprecated) this.output(`Flag --${flag.name} has been deprecated, ${flag.deprecated}\n`);
  }

  /** Parses argv (without the program name). Throws FlagError or HelpRequested. */
  parse(argv: string[]): void {
    const args = [...argv];
    while (args.length > 0) {
      const s = args.shift()!;
      if (s.length === 0 || s[0] !== "-" || s.length === 1) {
        this.args.push(s);
        continue;
      }
      if (s[1] === "-") {
        if (s.length === 2) {
          this.args.push(...args);
          return;
        }
        this.parseLong(s, args);
      } else {
        this.parseShort(s, args);
      }
    }
  }

  private parseLong(s: string, args: string[]): void {
    const name = s.slice(2);
    if (name.length === 0 || name[0] === "-" || name[0] === "=") throw new FlagError(`bad flag syntax: ${s}`);
    const eq = name.indexOf("=");
    const rawName = eq < 0 ? name : name.slice(0, eq);
    const flag = this.flags.get(FlagSet.normalize(rawName));
    if (!flag) {
      if (rawName === "help") throw new HelpRequested();
      throw new FlagError(`unknown flag: --${rawName}`);
    }
    if (eq >= 0) this.setFlag(flag, name.slice(eq + 1));
    else if (flag.noOptDefVal !== "") this.setFlag(flag, flag.noOptDefVal);
    else if (args.length > 0) this.setFlag(flag, args.shift()!);
    else throw new FlagError(`flag needs an argument: ${s}`);
  }

  private parseShort(s: string, args: string[]): void {
    let shorthands = s.slice(1);
    while (shorthands.length > 0) {
      const c = shorthands[0];
      const flag = this.shorthands.get(c);
      if (!flag) {
        if (c === "h") throw new HelpRequested();
        throw new FlagError(`unknown shorthand flag: '${c}' in -${shorthands}`);
      }
      let value: string;
      let rest = shorthands.slice(1);
      if (shorthands.length > 2 && shorthands[1] === "=") {
        value = shorthands.slice(2);
        rest = "";
      } else if (flag.noOptDefVal !== "") {
        value = flag.noOptDefVal;
      } else if (shorthands.length > 1) {
        value = shorthands.slice(1);
        rest = "";
      } else if (args.length > 0) {
        value = args.shift()!;
      } else {
        throw new FlagError(`flag needs an argument: '${c}' in -${shorthands}`);
      }
      this.setFlag(flag, value);
      shorthands = rest;
    }
  }

  /** pflag's FlagUsages(): one line per visible flag, usage aligned, multi-line usage indented. */
  usages(): string {
    const lines: string[] = [];
    let maxlen = 0;
    for (const flag of this.all()) {
      if (flag.hidden) continue;
      let line = flag.shorthand ? `  -${flag.shorthand}, --${flag.name}` : `      --${flag.name}`;
      const [varname, usage] = unquoteUsage(flag);
      if (varname !== "") line += " " + varname;
      if (flag.noOptDefVal !== "") {
        const t = flag.value.type();
        if (t === "string") line += `[="${flag.noOptDefVal}"]`;
        else if (t === "bool") {
          if (flag.noOptDefVal !== "true") line += `[=${flag.noOptDefVal}]`;
        } else line += `[=${flag.noOptDefVal}]`;
      }
      line += "\x00";
      if (line.length > maxlen) maxlen = line.length;
      line += usage;
      if (!defaultIsZero(flag)) {
        line += flag.value.type() === "string"
          ? ` (default ${goQuote(flag.defValue)})`
          : ` (default ${flag.defValue})`;
      }
      if (flag.deprecated) line += ` (DEPRECATED: ${flag.deprecated})`;
      lines.push(line);
    }
    let out = "";
    for (const line of lines) {
      const sidx = line.indexOf("\x00");
      const spacing = " ".repeat(maxlen - sidx);
      const usage = line.slice(sidx + 1).replaceAll("\n", "\n" + " ".repeat(maxlen + 2));
      out += `${line.slice(0, sidx)} ${spacing} ${usage}\n`;
    }
    return out;
  }
}

function unquoteUsage(flag: Flag): [string, string] {
  const usage = flag.usage;
  const start = usage.indexOf("`");
  if (start >= 0) {
    const end = usage.indexOf("`", start + 1);
    if (end >= 0) {
      return [
        usage.slice(start + 1, end),
        usage.slice(0, start) + usage.slice(start + 1, end) + usage.slice(end + 1),
      ];
    }
  }
  const t = flag.value.type();
  return [t in TYPE_NAMES ? TYPE_NAMES[t] : t, usage];
}

function defaultIsZero(flag: Flag): boolean {
  const d = flag.defValue;
  switch (flag.value.type()) {
    case "bool":
      return d === "false";
    case "duration":
      return d === "0" || d === "0s";
    case "int32":
    case "int":
    case "float32":
    case "float64":
      return d === "0";
    case "string":
      return d === "";
    case "stringSlice":
    case "stringArray":
      return d === "[]";
    default:
      return d === "false" || d === "<nil>" || d === "" || d === "0";
  }
}

/** strconv.FormatFloat(v, 'g', -1, 32)-like printing for float32 values (5 -> "5", 0.1 -> "0.1"). */
export function formatGoFloat(v: number): string {
  return String(Number(Math.fround(v).toPrecision(7)));
}
