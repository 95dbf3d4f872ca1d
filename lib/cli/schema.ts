/**
 * Field checks of Kubernetes objects against the API types, as the API server's strict decoding does (unknown
 * fields, wrong JSON types), for `kube-proxy render` and `explain`. The schema is the `attributeTypeMap` that
 * @kubernetes/client-node's generated models carry for every type (generated from the Kubernetes OpenAPI);
 * only these subcommands load it, never the agent.
 * @module
 */
import * as models from "@kubernetes/client-node/dist/gen/models/all.js";

/** One attribute of a generated model. */
interface Attribute {
  readonly name: string;
  readonly baseName: string;
  readonly type: string;
  readonly format: string;
}

/** A path into an object: keys and array indexes. */
export type FieldPath = readonly (string | number)[];

/** A field that does not fit the type. */
export interface SchemaIssue {
  readonly path: FieldPath;
  readonly message: string;
}

const registry = models as unknown as Record<string, { attributeTypeMap?: readonly Attribute[] } | undefined>;

/** The attributes of a generated model by its type name (`V1Service`), or null when there is none. */
function attributesOf(type: string): ReadonlyMap<string, Attribute> | null {
  const cls = registry[type];
  if (!cls?.attributeTypeMap) return null;
  return new Map(cls.attributeTypeMap.map((a) => [a.baseName, a]));
}

const cache = new Map<string, ReadonlyMap<string, Attribute> | null>();

function cachedAttributes(type: string): ReadonlyMap<string, Attribute> | null {
  if (!cache.has(type)) cache.set(type, attributesOf(type));
  return cache.get(type)!;
}

/** True when the client-node model `type` exists (e.g. `V1EndpointSlice`). */
export function hasModel(type: string): boolean {
  return cachedAttributes(type) !== null;
}

/** `spec.ports[0].port` from a path. */
export function formatPath(path: FieldPath): string {
  let out = "";
  for (const p of path) out += typeof p === "number" ? `[${p}]` : out === "" ? p : `.${p}`;
  return out;
}

/** The path of `spec.ports[0].port`: `["spec", "ports", 0, "port"]`. */
export function parseFieldPath(field: string): (string | number)[] {
  const out: (string | number)[] = [];
  for (const m of field.matchAll(/([^.[\]]+)|\[(\d+)\]/g)) out.push(m[2] !== undefined ? Number(m[2]) : m[1]);
  return out;
}

function jsonType(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return typeof v;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * Checks `value` against the client-node type `type` (a model name such as `V1Service`, or `string`,
 * `number`, `Array<T>`, `{ [key: string]: T; }`, ...). `null` is accepted everywhere, as Go's JSON decoding
 * leaves the field unset. Returns every issue found.
 */
export function checkType(type: string, value: unknown, path: FieldPath = []): SchemaIssue[] {
  const out: SchemaIssue[] = [];
  walk(type, "", value, path, out);
  return out;
}

function walk(type: string, format: string, value: unknown, path: FieldPath, out: SchemaIssue[]): void {
  if (value === null || value === undefined) return;
  const expect = (what: string): void => {
    out.push({ path, message: `expected ${what}, got ${jsonType(value)} ${JSON.stringify(value)}` });
  };
  switch (type) {
    case "any":
      return;
    case "string":
    case "Date":
      if (typeof value !== "string") expect("a string");
      return;
    case "boolean":
      if (typeof value !== "boolean") expect("a boolean");
      return;
    case "number":
      if (typeof value !== "number") expect(format.startsWith("int") ? "an integer" : "a number");
      else if (format.startsWith("int") && !Number.isInteger(value)) expect("an integer");
      return;
    case "IntOrString":
      if (typeof value === "string") return;
      if (typeof value !== "number" || !Number.isInteger(value)) expect("an integer or a string");
      return;
  }
  const arr = type.match(/^Array<(.+)>$/);
  if (arr) {
    if (!Array.isArray(value)) return expect("a list");
    value.forEach((v, i) => walk(arr[1], "", v, [...path, i], out));
    return;
  }
  const map = type.match(/^\{ \[key: string\]: (.+); \}$/);
  if (map) {
    if (!isPlainObject(value)) return expect("a map");
    for (const [k, v] of Object.entries(value)) walk(map[1], "", v, [...path, k], out);
    return;
  }
  const attrs = cachedAttributes(type);
  if (attrs === null) return; // a type this schema does not describe: accept it
  if (!isPlainObject(value)) return expect("an object");
  for (const [k, v] of Object.entries(value)) {
    const a = attrs.get(k);
    if (!a) {
      out.push({ path: [...path, k], message: `unknown field "${k}"` });
      continue;
    }
    walk(a.type, a.format, v, [...path, k], out);
  }
}
