/**
 * Go `time.Duration` compatible parsing and formatting.
 *
 * Durations are carried as **milliseconds** (a JS number, fractional for sub-millisecond values) everywhere in
 * the configuration; this module converts to and from Go's text form (`"1h2m3.5s"`, `"300ms"`, `"0s"`).
 * @module
 */

const NS_PER_MS = 1e6;

const UNITS: Record<string, number> = {
  ns: 1,
  us: 1e3,
  "\u00b5s": 1e3, // U+00B5 micro sign
  "\u03bcs": 1e3, // U+03BC Greek small letter mu
  ms: 1e6,
  s: 1e9,
  m: 60e9,
  h: 3600e9,
};

/** Go-style quoting (`strconv.Quote`) for error messages; close enough for printable input. */
export function goQuote(s: string): string {
  return JSON.stringify(s);
}

/**
 * Parses a Go duration string (as `time.ParseDuration`) and returns milliseconds.
 * Throws an Error with Go's message (`time: invalid duration "x"`) on bad input.
 */
export function parseDuration(input: string): number {
  return parseDurationNs(input) / NS_PER_MS;
}

/** Parses a Go duration string and returns nanoseconds. */
export function parseDurationNs(input: string): number {
  const orig = input;
  let s = input;
  let neg = false;
  if (s !== "" && (s[0] === "-" || s[0] === "+")) {
    neg = s[0] === "-";
    s = s.slice(1);
  }
  if (s === "0") return 0;
  if (s === "") throw new Error(`time: invalid duration ${goQuote(orig)}`);
  let total = 0;
  while (s !== "") {
    // Leading number: digits, optional fraction.
    const m = /^([0-9]*)(\.([0-9]*))?/.exec(s)!;
    const intPart = m[1];
    const fracPart = m[3] ?? "";
    if (intPart === "" && fracPart === "") throw new Error(`time: invalid duration ${goQuote(orig)}`);
    s = s.slice(m[0].length);
    // Unit: everything up to the next digit or dot.
    let i = 0;
    while (i < s.length && s[i] !== "." && (s[i] < "0" || s[i] > "9")) i++;
    const unit = s.slice(0, i);
    s = s.slice(i);
    if (unit === "") throw new Error(`time: missing unit in duration ${goQuote(orig)}`);
    const mult = UNITS[unit];
    if (mult === undefined) {
      throw new Error(`time: unknown unit ${goQuote(unit)} in duration ${goQuote(orig)}`);
    }
    const value = Number(intPart === "" ? "0" : intPart) * mult +
      (fracPart === "" ? 0 : Number("0." + fracPart) * mult);
    total += value;
    if (total > 9223372036854775807) throw new Error(`time: invalid duration ${goQuote(orig)}`);
  }
  return Math.round(neg ? -total : total);
}

/** Formats milliseconds as Go's `time.Duration.String()` does ("30s", "15m0s", "1.5s", "300ms", "0s"). */
export function formatDuration(ms: number): string {
  return formatDurationNs(Math.round(ms * NS_PER_MS));
}

function fraction(v: number, digits: number): string {
  // v is an integer count of the smaller unit; print v / 10^digits without trailing zeros.
  const p = 10 ** digits;
  const whole = Math.floor(v / p);
  let frac = String(v % p).padStart(digits, "0").replace(/0+$/, "");
  if (frac !== "") frac = "." + frac;
  return String(whole) + frac;
}

/** Formats nanoseconds as Go's `time.Duration.String()`. */
export function formatDurationNs(ns: number): string {
  if (ns === 0) return "0s";
  const neg = ns < 0;
  let u = Math.abs(Math.round(ns));
  let out: string;
  if (u < 1e9) {
    if (u < 1e3) out = `${u}ns`;
    else if (u < 1e6) out = `${fraction(u, 3)}\u00b5s`;
    else out = `${fraction(u, 6)}ms`;
  } else {
    const h = Math.floor(u / 3600e9);
    u -= h * 3600e9;
    const m = Math.floor(u / 60e9);
    u -= m * 60e9;
    out = `${fraction(u, 9)}s`;
    if (h > 0 || m > 0) out = `${m}m` + out;
    if (h > 0) out = `${h}h` + out;
  }
  return neg ? "-" + out : out;
}
