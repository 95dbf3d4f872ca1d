/** Reading and checking manifests for render and explain: formats, positions, schema, the agent's filters. */
import assert from "node:assert/strict";
import { checkObjects, formatProblem, INPUT_MODELS } from "../../lib/cli/inputs.ts";
import { parseManifestText, readManifests } from "../../lib/cli/manifests.ts";
import { checkType, formatPath, hasModel, parseFieldPath } from "../../lib/cli/schema.ts";
import checkedInSchema from "../../lib/cli/api_schema.json" with { type: "json" };
import { generateApiSchema, ROOT_MODELS } from "../../scripts/gen_api_schema.ts";
import { parseAllDocuments } from "yaml";
import { corpusYaml } from "./helpers.ts";

Deno.test("manifests: multi-document YAML, JSON, kind List and typed lists all become objects", () => {
  const yaml = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\n# a comment only\n---\n" +
    "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Service\n    metadata: {name: b}\n" +
    "  - apiVersion: v1\n    kind: Node\n    metadata: {name: n}\n";
  const a = parseManifestText(yaml, "a.yaml");
  assert.deepEqual(a.problems, []);
  assert.deepEqual(a.objects.map((o) => (o.value.metadata as { name: string }).name), ["a", "b", "n"]);
  assert.deepEqual(a.objects.map((o) => o.at.line), [1, 10, 13]);
  const json = JSON.stringify(
    {
      apiVersion: "v1",
      kind: "ServiceList",
      items: [{ apiVersion: "v1", kind: "Service", metadata: { name: "c" } }],
    },
    null,
    2,
  );
  const j = parseManifestText(json, "j.json");
  assert.deepEqual(j.problems, []);
  assert.equal(j.objects.length, 1);
  assert.equal(j.objects[0].at.line, 5);
});

Deno.test("manifests: a syntax error names file, line and column, and the file's other documents are kept", () => {
  const text = "apiVersion: v1\nkind: Service\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Service\n" +
    "metadata:\n  name: bad\n   namespace: x\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n}\n";
  const r = parseManifestText(text, "x.yaml");
  assert.equal(r.problems.length, 1);
  assert.equal(r.problems[0].at.file, "x.yaml");
  // The over-indented line continues the plain scalar "bad", which then holds ": ": reported where it starts.
  assert.deepEqual([r.problems[0].at.line, r.problems[0].at.col], [8, 9]);
  assert.match(r.problems[0].message, /^not valid YAML or JSON: .+; nothing in this document is used$/);
  assert.deepEqual(r.objects.map((o) => (o.value.metadata as { name: string }).name), ["ok", "n"]);
  const dup = parseManifestText("a: 1\na: 2\n", "d.yaml");
  assert.match(dup.problems[0].message, /unique/);
  assert.equal(dup.problems[0].at.line, 2);
  const scalar = parseManifestText("just text\n", "s.yaml");
  assert.deepEqual(scalar.problems.map((p) => p.message), ["not a Kubernetes object (a string)"]);
});

Deno.test("manifests: directories are read recursively in name order, stdin once, bad paths reported", async () => {
  const dir = await Deno.makeTempDir({ prefix: "kp-render-" });
  try {
    await Deno.mkdir(`${dir}/b/deeper`, { recursive: true });
    await Deno.writeTextFile(`${dir}/b/deeper/z.yml`, "apiVersion: v1\nkind: Service\nmetadata: {name: z}\n");
    await Deno.writeTextFile(`${dir}/a.json`, '{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"}}');
    await Deno.writeTextFile(`${dir}/c.yaml`, "apiVersion: v1\nkind: Service\nmetadata: {name: c}\n");
    await Deno.writeTextFile(`${dir}/notes.txt`, "not a manifest");
    await Deno.mkdir(`${dir}/empty`);
    const set = await readManifests([dir, "-", "-", `${dir}/missing.yaml`, `${dir}/empty`], {
      readStdin: () => Promise.resolve("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n"),
    });
    assert.deepEqual(set.files, [`${dir}/a.json`, `${dir}/b/deeper/z.yml`, `${dir}/c.yaml`, "<stdin>"]);
    assert.deepEqual(set.objects.map((o) => (o.value.metadata as { name: string }).name), [
      "a",
      "z",
      "c",
      "n",
    ]);
    assert.deepEqual(set.problems.map((p) => `${p.at.file}: ${p.message}`), [
      `${dir}/missing.yaml: cannot read: no such file or directory`,
      `${dir}/empty: no manifests (*.yaml, *.yml, *.json) in this directory`,
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("schema: the checked-in api_schema.json is what scripts/gen_api_schema.ts makes from client-node's models", () => {
  assert.deepEqual(checkedInSchema, generateApiSchema());
  // Every model an input kind names is a root of the schema, so none is checked against nothing.
  assert.equal(INPUT_MODELS.length, 5);
  for (const m of INPUT_MODELS) {
    assert.ok(ROOT_MODELS.includes(m) && hasModel(m), m);
  }
  assert.ok(hasModel("V1ObjectMeta") && hasModel("V1ServicePort") && !hasModel("V1Pod"));
});

Deno.test("schema: unknown fields and wrong types are found with their paths (client-node's API types)", () => {
  const svc = {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: "a", labels: { x: "y" }, annotations: { n: 1 } },
    spec: {
      clusterIp: "10.0.0.1",
      ports: [{ port: "80", targetPort: "http" }, {
        port: 81.5,
        nodePort: 30000,
        protocol: "TCP",
        bogus: true,
      }],
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 10 } },
      externalIPs: null,
    },
  };
  assert.deepEqual(
    checkType("V1Service", svc).map((i) => `${formatPath(i.path)}: ${i.message}`),
    [
      "metadata.annotations.n: expected a string, got number 1",
      'spec.clusterIp: unknown field "clusterIp"',
      'spec.ports[0].port: expected an integer, got string "80"',
      "spec.ports[1].port: expected an integer, got number 81.5",
      'spec.ports[1].bogus: unknown field "bogus"',
    ],
  );
  assert.deepEqual(
    checkType("V1EndpointSlice", { addressType: "IPv4", endpoints: "x" }).map((i) => i.message),
    [
      'expected a list, got string "x"',
    ],
  );
  assert.deepEqual(parseFieldPath("spec.ports[1].nodePort"), ["spec", "ports", 1, "nodePort"]);
  assert.equal(
    formatPath(["status", "loadBalancer", "ingress", 0, "ip"]),
    "status.loadBalancer.ingress[0].ip",
  );
});

Deno.test("inputs: each unusable object is reported with file, line, object and field, and left out", () => {
  const text = [
    "apiVersion: v1\nkind: Service\nmetadata: {name: typo, namespace: demo}\nspec:\n  clusterIp: 10.0.0.1\n",
    "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: old, namespace: demo}\n",
    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan, namespace: demo}\naddressType: IPv4\n",
    "apiVersion: v1\nkind: Service\nmetadata: {namespace: demo}\n",
    "apiVersion: v1\nkind: Service\nmetadata: {name: good}\nspec: {clusterIP: 10.0.0.2, ports: [{port: 80}]}\n",
    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
    "apiVersion: v1\nkind: Service\nmetadata:\n  name: opted-out\n  labels: {service.kubernetes.io/service-proxy-name: other}\n",
    "apiVersion: v1\nkind: Service\nmetadata: {name: headless}\nspec: {clusterIP: None}\n",
    "kind: Service\nmetadata: {name: noversion}\n",
  ].join("---\n");
  const { objects, problems } = parseManifestText(text, "in.yaml");
  assert.deepEqual(problems, []);
  const r = checkObjects(objects);
  assert.deepEqual(r.problems.map(formatProblem), [
    'error: in.yaml:5:3: Service demo/typo: spec.clusterIp: unknown field "clusterIp" (Kubernetes API type ' +
    "V1Service); nothing is rendered for it",
    "error: in.yaml:7:1: EndpointSlice demo/old: apiVersion: EndpointSlice is served as discovery.k8s.io/v1, not " +
    "discovery.k8s.io/v1beta1; nothing is rendered for it",
    "error: in.yaml:13:11: EndpointSlice demo/orphan: metadata.labels: no kubernetes.io/service-name label: the " +
    "agent cannot tell which Service it belongs to and ignores it",
    "error: in.yaml:18:11: Service demo/<no name>: metadata.name: missing metadata.name; nothing is rendered for it",
    "note: in.yaml:33:12: Service default/opted-out: metadata.labels.service.kubernetes.io/service-proxy-name: the " +
    "default kube-proxy does not watch objects labelled service.kubernetes.io/service-proxy-name; not used",
    "note: in.yaml:38:8: Service default/headless: spec.clusterIP: headless (clusterIP None): kube-proxy writes " +
    "no rules for it",
    "error: in.yaml:40:1: apiVersion: missing apiVersion: not a Kubernetes object; not used",
    "note: ignored objects of other kinds (1 Deployment); only Service, EndpointSlice, Node, ServiceCIDR are read",
  ]);
  assert.deepEqual(r.input.services.map((s) => `${s.metadata?.namespace}/${s.metadata?.name}`), [
    "default/good",
  ]);
  assert.equal(r.input.slices.length, 0);
  // The input objects are not modified (the namespace default goes into a copy).
  assert.equal((objects[4].value.metadata as { namespace?: string }).namespace, undefined);
});

Deno.test("inputs: a later definition replaces an earlier one; a slice without its Service is a note", () => {
  const svc = (ip: string) =>
    `apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: n}\nspec: {clusterIP: ${ip}}\n`;
  const slice =
    "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: x\n  namespace: n\n" +
    "  labels: {kubernetes.io/service-name: gone}\naddressType: IPv4\n";
  const { objects } = parseManifestText([svc("10.0.0.1"), svc("10.0.0.2"), slice].join("---\n"), "f.yaml");
  const r = checkObjects(objects);
  assert.deepEqual(r.problems.map(formatProblem), [
    "note: f.yaml:6:1: Service n/s: also defined at f.yaml:1; this later definition is used",
    "note: f.yaml:16:12: EndpointSlice n/x: its Service n/gone is not among the manifests; its endpoints are not used",
  ]);
  assert.equal(r.input.services.length, 1);
  assert.equal(r.input.services[0].spec?.clusterIP, "10.0.0.2");
});

Deno.test("manifests: the fast reader (js-yaml) reads exactly what the yaml library reads", async () => {
  const texts = [
    corpusYaml(),
    ...await Promise.all(
      ["web", "dns", "node", "broken"].map((f) => Deno.readTextFile(`examples/${f}.yaml`)),
    ),
    "a: yes\nb: 0x10\nc: 010\nd: 1e3\ne: ~\nf: 2024-01-01T00:00:00Z\ng: '1'\nh: .inf\n",
  ];
  for (const text of texts) {
    const slow = parseAllDocuments(text) as { toJS(): unknown }[];
    const want = slow.map((d) => d.toJS()).filter((v) => v !== null).flatMap((v) =>
      (v as { kind?: string }).kind?.endsWith("List") ? (v as { items: unknown[] }).items : [v]
    );
    const got = parseManifestText(text, "t.yaml");
    const values = got.objects.map((o) => o.value);
    if (got.problems.length === 0) assert.deepEqual(values, want.filter((v) => typeof v === "object"));
  }
  // Scalars as YAML 1.2's core schema reads them (timestamps stay strings, "yes" is not a boolean).
  const { objects } = parseManifestText(texts.at(-1)!, "t.yaml");
  assert.deepEqual(objects[0].value, {
    a: "yes",
    b: 16,
    c: 10,
    d: 1000,
    e: null,
    f: "2024-01-01T00:00:00Z",
    g: "1",
    h: Infinity,
  });
});
