import assert from "node:assert/strict";
import { formatDuration, parseDuration } from "../../lib/config/duration.ts";

Deno.test("formatDuration prints Go's time.Duration.String()", () => {
  const cases: [number, string][] = [
    [0, "0s"],
    [30_000, "30s"],
    [900_000, "15m0s"],
    [86_400_000, "24h0m0s"],
    [3_600_000, "1h0m0s"],
    [1_500, "1.5s"],
    [300, "300ms"],
    [1.5, "1.5ms"],
    [0.001, "1\u00b5s"],
    [0.000001, "1ns"],
    [3_723_500, "1h2m3.5s"],
    [-1_000, "-1s"],
  ];
  for (const [ms, text] of cases) assert.equal(formatDuration(ms), text, `formatDuration(${ms})`);
});

Deno.test("parseDuration accepts Go syntax and round-trips with formatDuration", () => {
  const cases: [string, number][] = [
    ["0", 0],
    ["0s", 0],
    ["1h2m3.5s", 3_723_500],
    ["300ms", 300],
    ["1.5s", 1_500],
    ["-1s", -1_000],
    ["+2m", 120_000],
    ["1us", 0.001],
    ["1\u00b5s", 0.001],
    ["2h22m", 8_520_000],
    [".5s", 500],
  ];
  for (const [text, ms] of cases) {
    assert.equal(parseDuration(text), ms, `parseDuration(${text})`);
    assert.equal(parseDuration(formatDuration(ms)), ms);
  }
});

Deno.test("parseDuration rejects bad input with Go's messages", () => {
  assert.throws(() => parseDuration("x"), { message: 'time: invalid duration "x"' });
  assert.throws(() => parseDuration(""), { message: 'time: invalid duration ""' });
  assert.throws(() => parseDuration("5"), { message: 'time: missing unit in duration "5"' });
  assert.throws(() => parseDuration("5x"), { message: 'time: unknown unit "x" in duration "5x"' });
  assert.throws(() => parseDuration("-"), { message: 'time: invalid duration "-"' });
});
