/**
 * Generates lib/cli/api_schema.json, the field types `kube-proxy render` and `explain` check manifests against
 * (lib/cli/schema.ts), from @kubernetes/client-node's generated models (themselves generated from the
 * Kubernetes OpenAPI): for every model reachable from the input kinds' types, its fields as
 * `[jsonName, type, format]`, with client-node's type spelling (`string`, `number`, `Array<T>`,
 * `{ [key: string]: T; }`, a model name). Only this script and its test load client-node's model classes; the
 * CLI reads the checked-in JSON. Run it again when client-node's version in deno.json changes.
 *
 * Usage: deno run --allow-read --allow-write scripts/gen_api_schema.ts [--check], then deno fmt lib/cli/api_schema.json
 * (`--check` writes nothing and exits 1 when the checked-in file differs.)
 * @module
 */

import * as models from "@kubernetes/client-node/dist/gen/models/all.js";

/** The models the input kinds name (lib/cli/inputs.ts): the roots of the schema. */
export const ROOT_MODELS: readonly string[] = [
  "V1Service",
  "V1EndpointSlice",
  "V1Node",
  "V1ServiceCIDR",
  "V1beta1ServiceCIDR",
];

/** One field of a model: JSON name, client-node type, format (`int32`, `date-time`, or ""). */
export type FieldEntry = readonly [name: string, type: string, format: string];

/** The schema: fields per model name. */
export type ApiSchema = Record<string, readonly FieldEntry[]>;

interface Attribute {
  readonly baseName: string;
  readonly type: string;
  readonly format: string;
}

const registry = models as unknown as Record<string, { attributeTypeMap?: readonly Attribute[] } | undefined>;

/** The model names a client-node type spelling refers to (`Array<V1Foo>` → V1Foo). */
function referenced(type: string): string[] {
  const arr = type.match(/^Array<(.+)>$/);
  if (arr) return referenced(arr[1]);
  const map = type.match(/^\{ \[key: string\]: (.+); \}$/);
  if (map) return referenced(map[1]);
  return registry[type]?.attributeTypeMap ? [type] : [];
}

/** The schema of every model reachable from `roots`, models sorted by name, fields in client-node's order. */
export function generateApiSchema(roots: readonly string[] = ROOT_MODELS): ApiSchema {
  const found = new Map<string, FieldEntry[]>();
  const todo = [...roots];
  while (todo.length > 0) {
    const name = todo.pop()!;
    if (found.has(name)) continue;
    const attrs = registry[name]?.attributeTypeMap;
    if (!attrs) throw new Error(`client-node has no model ${name}`);
    found.set(name, attrs.map((a) => [a.baseName, a.type, a.format ?? ""] as const));
    for (const a of attrs) todo.push(...referenced(a.type));
  }
  return Object.fromEntries([...found].sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0));
}

/** The file's text: one model per line, so that a client-node upgrade shows as a readable diff. */
export function formatApiSchema(schema: ApiSchema): string {
  const lines = Object.entries(schema).map(([name, fields]) =>
    `  ${JSON.stringify(name)}: ${JSON.stringify(fields)}`
  );
  return `{\n${lines.join(",\n")}\n}\n`;
}

if (import.meta.main) {
  const out = new URL("../lib/cli/api_schema.json", import.meta.url);
  const text = formatApiSchema(generateApiSchema());
  if (Deno.args.includes("--check")) {
    const current = await Deno.readTextFile(out).catch(() => "");
    if (JSON.stringify(JSON.parse(current || "null")) !== JSON.stringify(JSON.parse(text))) {
      console.error(
        `${out.pathname} is out of date: run deno run --allow-read --allow-write scripts/gen_api_schema.ts`,
      );
      Deno.exit(1);
    }
  } else {
    await Deno.writeTextFile(out, text);
    console.log(`wrote ${out.pathname}: ${Object.keys(JSON.parse(text)).length} models`);
  }
}
