import { CORPUS_FLAGS, corpusYaml, runCli } from "./tests/cli/helpers.ts";
const extra = Deno.args;
const r = await runCli(
  ["render", "-f", "-", ...CORPUS_FLAGS, "--proxy-mode=nftables", ...extra],
  corpusYaml(),
);
console.log(r.stdout);
