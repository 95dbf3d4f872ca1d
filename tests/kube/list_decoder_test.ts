/** The streaming list decoder: items handed over as they complete, whatever the chunking; metadata after. */
import assert from "node:assert/strict";
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
