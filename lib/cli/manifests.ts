/**
 * Reading manifests for `kube-proxy render` and `explain`: files, directories (recursively, `*.yaml`, `*.yml`,
 * `*.json`, in name order), `-` for stdin; multi-document YAML or JSON; `kind: List` and typed lists
 * (`ServiceList`, a `kubectl get -o yaml` dump) flattened into their items. Every object keeps where it came
 * from, so that a problem found later (a field, a Service the agent skips) is reported with its file and line.
 * A document that does not parse is reported with its file, line and column and skipped; the others are used.
 * @module
 */
import { CORE_SCHEMA, loadAll } from "js-yaml";
import { isMap, isScalar, isSeq, LineCounter, type Node as YamlNode, parseAllDocuments } from "yaml";
import type { FieldPath } from "./schema.ts";

/** A place in an input file (1-based line and column). */
export interface Position {
  readonly file: string;
  readonly line: number;
  readonly col: number;
}

/** One object read from the input. */
export interface LoadedObject {
  /** The object as parsed (never modified). */
  readonly value: Record<string, unknown>;
  /** Where the object starts. */
  readonly at: Position;
  /** Where a field of the object is (its key when it has one); the object's start when it is missing. */
  position(path: FieldPath): Position;
}

/** Something wrong with the input, with where it is. */
export interface ManifestProblem {
  readonly at: Position;
  readonly message: string;
}

/** Everything read from the input. */
export interface ManifestSet {
  readonly objects: LoadedObject[];
  readonly problems: ManifestProblem[];
  /** The files read, in order (`<stdin>` for `-`). */
  readonly files: string[];
}

/** The name stdin is reported under. */
export const STDIN_NAME = "<stdin>";

const MANIFEST_EXTENSIONS = [".yaml", ".yml", ".json"];

/** Reads stdin to the end. */
async function readAllStdin(): Promise<string> {
  return await new Response(Deno.stdin.readable).text();
}

/** Options of {@linkcode readManifests}. */
export interface ReadOptions {
  /** Reads stdin (tests replace it). */
  readStdin?: () => Promise<string>;
}

/**
 * Reads every manifest named by `paths` (files, directories, `-`). A path that cannot be read is a problem,
 * not an exception; so is a directory without manifests.
 */
export async function readManifests(paths: readonly string[], opts: ReadOptions = {}): Promise<ManifestSet> {
  const set: ManifestSet = { objects: [], problems: [], files: [] };
  let stdinRead = false;
  for (const path of paths) {
    if (path === "-") {
      if (stdinRead) continue;
      stdinRead = true;
      addText(set, STDIN_NAME, await (opts.readStdin ?? readAllStdin)());
      continue;
    }
    let info: Deno.FileInfo;
    try {
      info = await Deno.stat(path);
    } catch (err) {
      set.problems.push({ at: { file: path, line: 0, col: 0 }, message: `cannot read: ${errorText(err)}` });
      continue;
    }
    const files = info.isDirectory ? await manifestFiles(path) : [path];
    if (info.isDirectory && files.length === 0) {
      set.problems.push({
        at: { file: path, line: 0, col: 0 },
        message: `no manifests (${MANIFEST_EXTENSIONS.map((e) => "*" + e).join(", ")}) in this directory`,
      });
    }
    for (const file of files) {
      let text: string;
      try {
        text = await Deno.readTextFile(file);
      } catch (err) {
        set.problems.push({ at: { file, line: 0, col: 0 }, message: `cannot read: ${errorText(err)}` });
        continue;
      }
      addText(set, file, text);
    }
  }
  return set;
}

function errorText(err: unknown): string {
  if (err instanceof Deno.errors.NotFound) return "no such file or directory";
  if (err instanceof Deno.errors.PermissionDenied) return "permission denied";
  return (err as Error).message;
}

/** The manifest files under `dir`, recursively, sorted by path. */
async function manifestFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  const entries: Deno.DirEntry[] = [];
  for await (const e of Deno.readDir(dir)) entries.push(e);
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const path = `${dir.replace(/\/+$/, "")}/${e.name}`;
    let isDir = e.isDirectory, isFile = e.isFile;
    if (e.isSymlink) {
      try {
        const st = await Deno.stat(path);
        isDir = st.isDirectory;
        isFile = st.isFile;
      } catch {
        continue; // a dangling link
      }
    }
    if (isDir) out.push(...await manifestFiles(path));
    else if (isFile && MANIFEST_EXTENSIONS.some((x) => e.name.endsWith(x))) out.push(path);
  }
  return out;
}

function addText(set: ManifestSet, file: string, text: string): void {
  set.files.push(file);
  const parsed = parseManifestText(text, file);
  set.objects.push(...parsed.objects);
  set.problems.push(...parsed.problems);
}

/** The first line of a yaml error message, without its " at line N, column M:" tail. */
function shortMessage(message: string): string {
  return message.split("\n")[0].replace(/ at line \d+, column \d+:?$/, "");
}

/**
 * Positions in one file's text. The YAML syntax tree that positions come from is built only when a position
 * is asked for (a problem is reported), and then kept for the file: a dump of 10k Services holds about a
 * gigabyte of syntax tree, which objects that are fine never need.
 */
class Locator {
  #docs: YamlNode[] | null = null;
  #lines: LineCounter | null = null;

  constructor(readonly file: string, private readonly text: string) {}

  #parse(): YamlNode[] {
    if (this.#docs === null) {
      this.#lines = new LineCounter();
      const docs = parseAllDocuments(this.text, { lineCounter: this.#lines });
      this.#docs = Array.isArray(docs) ? docs.map((d) => d.contents as YamlNode) : [];
    }
    return this.#docs;
  }

  /** The position of a character offset. */
  pos(offset: number): Position {
    this.#parse();
    const p = this.#lines!.linePos(offset);
    return { file: this.file, line: p.line, col: p.col };
  }

  /** The position of `path` in document `doc` (the deepest node found when the path leaves the document). */
  at(doc: number, path: FieldPath): Position {
    const root = this.#parse()[doc];
    if (!root) return { file: this.file, line: 0, col: 0 };
    return this.pos(nodeAt(root, path).node.range?.[0] ?? 0);
  }
}

function loaded(
  value: Record<string, unknown>,
  locator: Locator,
  doc: number,
  prefix: FieldPath,
): LoadedObject {
  let at: Position | null = null;
  return {
    value,
    get at() {
      return at ??= locator.at(doc, prefix);
    },
    position: (path) => locator.at(doc, [...prefix, ...path]),
  };
}

/**
 * Parses one file's text: YAML, possibly multi-document, or JSON (read with JSON.parse, about a hundred times
 * faster than a YAML parser on a large `kubectl get -o json` dump).
 */
export function parseManifestText(
  text: string,
  file: string,
): { objects: LoadedObject[]; problems: ManifestProblem[] } {
  const locator = new Locator(file, text);
  if (/^\s*[[{]/.test(text)) {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      value = undefined; // not JSON after all (YAML flow style, or a syntax error): the YAML parser says where
    }
    if (value !== undefined) return fromValues([value], locator);
  }
  // js-yaml reads a large dump about ten times faster than the yaml library, with a fraction of its memory; the
  // yaml library's syntax tree is built only to say where something is wrong. Both read YAML 1.2's core schema.
  const fast: unknown[] = [];
  try {
    loadAll(text, (d) => fast.push(d), { schema: CORE_SCHEMA, filename: file });
    return fromValues(fast, locator);
  } catch {
    // Reported below, document by document: the documents that parse are still used.
  }
  const problems: ManifestProblem[] = [];
  const docs = parseAllDocuments(text);
  if (!Array.isArray(docs)) return { objects: [], problems }; // an empty stream
  const values: unknown[] = [];
  for (const doc of docs) {
    if (doc.errors.length > 0) {
      const e = doc.errors[0];
      problems.push({
        at: locator.pos(e.pos[0]),
        message: `not valid YAML or JSON: ${shortMessage(e.message)}; nothing in this document is used`,
      });
      values.push(undefined);
      continue;
    }
    values.push(doc.contents === null ? null : doc.toJS({ maxAliasCount: 1000 }));
  }
  const r = fromValues(values, locator);
  return { objects: r.objects, problems: [...problems, ...r.problems] };
}

/** The objects of a file's documents (`undefined` for a document that did not parse, skipped). */
function fromValues(
  values: unknown[],
  locator: Locator,
): { objects: LoadedObject[]; problems: ManifestProblem[] } {
  const objects: LoadedObject[] = [];
  const problems: ManifestProblem[] = [];
  values.forEach((value, doc) => {
    if (value === null || value === undefined) return;
    const items = (list: unknown[], prefix: FieldPath) => {
      list.forEach((item, i) => {
        if (isObject(item)) objects.push(loaded(item, locator, doc, [...prefix, i]));
        else {
          problems.push({
            at: locator.at(doc, [...prefix, i]),
            message: `not a Kubernetes object (a ${typeName(item)})`,
          });
        }
      });
    };
    if (Array.isArray(value)) items(value, []);
    else if (!isObject(value)) {
      problems.push({ at: locator.at(doc, []), message: `not a Kubernetes object (a ${typeName(value)})` });
    } else if (isList(value)) items(value.items as unknown[], ["items"]);
    else objects.push(loaded(value, locator, doc, []));
  });
  return { objects, problems };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function typeName(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "list" : typeof v;
}

/** `kind: List` (kubectl) or a typed list (`ServiceList`, as the API returns) with an `items` list. */
function isList(v: Record<string, unknown>): boolean {
  return typeof v.kind === "string" && v.kind.endsWith("List") && Array.isArray(v.items);
}

/**
 * The node at `path` under `root`; for a map key, the key's node (so that the position names the field). When
 * the path leaves the document (a field that is missing), the deepest node found.
 */
function nodeAt(root: YamlNode, path: FieldPath): { node: YamlNode; complete: boolean } {
  let node: YamlNode = root;
  for (let i = 0; i < path.length; i++) {
    const seg = path[i];
    const last = i === path.length - 1;
    if (isMap(node)) {
      const pair = node.items.find((p) => isScalar(p.key) && String(p.key.value) === String(seg));
      if (!pair) return { node, complete: false };
      if (last && pair.key && isScalar(pair.key)) return { node: pair.key, complete: true };
      if (!pair.value) return { node: (pair.key as YamlNode) ?? node, complete: false };
      node = pair.value as YamlNode;
    } else if (isSeq(node) && typeof seg === "number" && node.items[seg]) {
      node = node.items[seg] as YamlNode;
    } else return { node, complete: false };
  }
  return { node, complete: true };
}
