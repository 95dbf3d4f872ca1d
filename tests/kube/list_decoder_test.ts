/** The streaming list decoder: items handed over as they complete, whatever the chunking; metadata after. */
import assert from "node:assert/strict";
import fc from "fast-check";
import { ListDecodeError, ListDecoder } from "../../lib/kube/list_decoder.ts";

const enc = new TextEncoder();

function decode(text: string, cut: (bytes: Uint8Array) => Uint8Array[]) {
  const items: unknown[] = [];
  const d = new ListDecoder<unknown>((it) => items.push(it));
  for (const c of cut(enc.encode(text))) d.push(c);
  return { items, rest: d.end<Record<string, unknown>>() };
}

const DOC = {
  kind: "ServiceList",
  apiVersion: "v1",
  metadata: { resourceVersion: "42", continue: "abc" },
  items: [
    { metadata: { name: "a", annotations: { x: 'quote " and { brace [ bracket ] } \\ backslash' } } },
    { metadata: { name: "b", labels: { "items": "[" } }, spec: { ports: [{ port: 80 }, { port: 443 }] } },
    { metadata: { name: "ünïcödé" }, nested: [[{}], []] },
  ],
};

Deno.test("list decoder: same items and metadata for every split of the body into two chunks", () => {
  const text = JSON.stringify(DOC);
  const bytes = enc.encode(text);
  for (let i = 0; i <= bytes.length; i++) {
    const { items, rest } = decode(text, (b) => [b.subarray(0, i), b.subarray(i)]);
    assert.deepEqual(items, DOC.items, `split at ${i}`);
    assert.deepEqual(rest, { ...DOC, items: [] }, `split at ${i}`);
  }
});

Deno.test("list decoder: byte-by-byte chunks, items after the metadata or before it, empty lists", () => {
  const oneByOne = (b: Uint8Array) => [...b].map((x) => Uint8Array.of(x));
  const itemsFirst = `{"items":${JSON.stringify(DOC.items)},"metadata":{"resourceVersion":"7"},"kind":"X"}`;
  const r = decode(itemsFirst, oneByOne);
  assert.deepEqual(r.items, DOC.items);
  assert.deepEqual(r.rest, { items: [], metadata: { resourceVersion: "7" }, kind: "X" });
  assert.deepEqual(decode(` {"items": [ ], "metadata":{}} `, oneByOne), {
    items: [],
    rest: { items: [], metadata: {} },
  });
  assert.deepEqual(decode(`{"items":null,"metadata":{}}`, (b) => [b]), {
    items: [],
    rest: { items: null, metadata: {} },
  });
});

Deno.test("list decoder: each item is handed over as soon as its last byte arrives", () => {
  const text = JSON.stringify(DOC);
  const seen: number[] = [];
  const d = new ListDecoder<unknown>(() => seen.push(pos));
  let pos = 0;
  for (const b of enc.encode(text)) {
    pos++;
    d.push(Uint8Array.of(b));
  }
  const ends = DOC.items.map((it) =>
    enc.encode(text.slice(0, text.indexOf(JSON.stringify(it)) + JSON.stringify(it).length)).length
  );
  assert.deepEqual(seen, ends);
});

Deno.test("list decoder: truncated or malformed bodies are errors, not partial lists", () => {
  const text = JSON.stringify(DOC);
  assert.throws(() => decode(text.slice(0, -3), (b) => [b]), ListDecodeError);
  assert.throws(() => decode(`{"items":[{"a":1,}]}`, (b) => [b]), ListDecodeError);
  assert.throws(() => decode(`{"items":[1,2]}`, (b) => [b]), /must be objects/);
  assert.throws(() => decode(`<html>nope</html>`, (b) => [b]), ListDecodeError);
});

Deno.test("list decoder: any JSON objects as items, cut anywhere, decode as JSON.parse of the whole (property)", () => {
  // Strings of every kind (escapes, quotes, brackets, non-ASCII) at every depth, items and metadata in both
  // orders, the body cut at random places: what comes out is what JSON.parse of the whole body gives.
  const obj = fc.dictionary(fc.string({ unit: "binary" }), fc.jsonValue({ maxDepth: 4 }), { maxKeys: 6 });
  fc.assert(
    fc.property(
      fc.array(obj, { maxLength: 8 }),
      obj,
      fc.boolean(),
      fc.array(fc.nat(), { maxLength: 12 }),
      (items, metadata, itemsFirst, cuts) => {
        const text = itemsFirst
          ? `{"items":${JSON.stringify(items)},"metadata":${JSON.stringify(metadata)}}`
          : JSON.stringify({ metadata, items });
        const whole = JSON.parse(text);
        const bytes = enc.encode(text);
        const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
        const { items: got, rest } = decode(text, (b) => {
          const parts: Uint8Array[] = [];
          let from = 0;
          for (const c of at) {
            parts.push(b.subarray(from, c));
            from = c;
          }
          parts.push(b.subarray(from));
          return parts;
        });
        assert.deepEqual(got, whole.items);
        assert.deepEqual(rest, { ...whole, items: [] });
      },
    ),
    { seed: 20261206, numRuns: 500 },
  );
});
