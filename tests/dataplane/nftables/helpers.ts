/**
 * Helpers for comparing the fake with the kernel: whether the kernel tests can run, and the normalization of
 * `nft list table` output (network namespaces come from testkit/netns.ts).
 * @module
 */
import { netnsUnavailableReason } from "../../../testkit/netns.ts";
export { NetnsRunner, withNetns } from "../../../testkit/netns.ts";

/** Why the kernel tests cannot run here: no network namespaces (root, `ip`), or no `nft`. */
export function nftKernelUnavailableReason(): string | undefined {
  const netns = netnsUnavailableReason();
  if (netns !== undefined) return netns;
  try {
    if (!new Deno.Command("nft", { args: ["--version"], stdout: "null" }).outputSync().success) {
      return "`nft --version` fails";
    }
  } catch {
    return "nft is not installed";
  }
  return undefined;
}

/** Splits the inside of `{ … }` into items and the delimiters between them, respecting quotes. */
function splitItems(body: string): { items: string[]; delims: string[] } {
  const items: string[] = [];
  const delims: string[] = [];
  let cur = "";
  let quoted = false;
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (c === '"') quoted = !quoted;
    if (!quoted && c === ",") {
      const m = /^,(?:\n\t\t\t {5}| )/.exec(body.slice(i));
      if (m) {
        items.push(cur);
        delims.push(m[0]);
        cur = "";
        i += m[0].length - 1;
        continue;
      }
    }
    cur += c;
  }
  items.push(cur);
  return { items, delims };
}

/**
 * Normalizes `nft list table` output (the kernel's or the fake's) for comparison, removing only what the
 * kernel adds at run time or orders at random:
 * - ` expires <time>` of elements with a timeout (the time left, which keeps falling);
 * - the order of elements of sets and maps without the interval flag (the kernel lists hash sets in hash
 *   order, seeded at random); the line wrapping (which depends only on the count) is kept and compared.
 */
export function normalizeListing(text: string): string {
  const lines = text.split("\n");
  const out: string[] = [];
  let interval = false;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (/^\t(?:set|map) \S+ \{$/.test(line)) interval = false;
    if (/^\t\tflags \S*interval/.test(line)) interval = true;
    if (!line.startsWith("\t\telements = { ")) {
      out.push(line);
      continue;
    }
    let block = line;
    while (!block.endsWith(" }") && i + 1 < lines.length) block += "\n" + lines[++i];
    const body = block.slice("\t\telements = { ".length, -2);
    const { items, delims } = splitItems(body);
    const cleaned = items.map((it) => it.replace(/ expires [0-9dhms]+/, ""));
    if (!interval) cleaned.sort();
    let joined = cleaned[0];
    for (let k = 1; k < cleaned.length; k++) joined += delims[k - 1] + cleaned[k];
    out.push(...`\t\telements = { ${joined} }`.split("\n"));
  }
  return out.join("\n");
}
