/**
 * Tests that need root, network namespaces or netfilter tools: explicitly ignored where they cannot run,
 * or failed with the reason when `DKP_REQUIRE_PRIVILEGED_TESTS=1` (set by scripts/test.sh, the README's
 * and CI's test command), so that a run that cannot exercise the dataplane never looks green.
 * @module
 */

/** The switch that turns "cannot run here, ignored" into a failure. */
export const REQUIRE_PRIVILEGED_ENV = "DKP_REQUIRE_PRIVILEGED_TESTS";

/** True when tests that cannot run must fail rather than be ignored. */
export function privilegedTestsRequired(): boolean {
  try {
    return Deno.env.get(REQUIRE_PRIVILEGED_ENV) === "1";
  } catch {
    return false;
  }
}

/**
 * Registers `def` as a test that can only run when `unavailable` is undefined. Otherwise the test is
 * ignored (Deno counts it as "ignored"), or, with {@link REQUIRE_PRIVILEGED_ENV}=1, fails at once with
 * `unavailable` as the reason.
 */
export function privilegedTest(unavailable: string | undefined, def: Deno.TestDefinition): void {
  if (unavailable === undefined) return Deno.test(def);
  if (privilegedTestsRequired()) {
    Deno.test({
      ...def,
      ignore: false,
      fn: () => {
        throw new Error(
          `cannot run here: ${unavailable} (${REQUIRE_PRIVILEGED_ENV}=1 makes this a failure, not a skip)`,
        );
      },
    });
    return;
  }
  Deno.test({ ...def, ignore: true });
}
