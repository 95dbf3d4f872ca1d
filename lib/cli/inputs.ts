/**
 * From manifest objects to what the agent would receive from the API server: Services, EndpointSlices, the
 * Node and ServiceCIDRs, checked the way the API server and the agent's informers would see them. Every
 * object is checked against the Kubernetes API types (unknown fields, wrong types: see schema.ts) and its
 * kind's apiVersion; an object that fails is reported and left out (nothing is rendered for it). Objects the
 * agent's informers never see (the `service.kubernetes.io/headless` and `service-proxy-name` labels,
 * clusterIP None) and objects of other kinds are left out with a note.
 * @module
 */
import type { EndpointSlice, Node, Service, ServiceCIDR } from "../kube/types.ts";
import { LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME } from "../kube/types.ts";
import type { LoadedObject, Position } from "./manifests.ts";
import { checkType, type FieldPath, formatPath } from "./schema.ts";

/** How serious a problem is: an error makes the exit code 2, a note does not. */
export type Severity = "error" | "note";

/** A problem with one object (or file), for the user. */
export interface InputProblem {
  readonly severity: Severity;
  readonly at: Position;
  /** `Service demo/web`, when the problem belongs to an object. */
  readonly object?: string;
  /** `spec.clusterIPs[0]`, when the problem belongs to a field. */
  readonly field?: string;
  readonly message: string;
}

/** The objects the agent would receive, and where each came from. */
export interface ProxyInput {
  readonly services: Service[];
  readonly slices: EndpointSlice[];
  readonly nodes: Node[];
  readonly serviceCIDRs: ServiceCIDR[];
  /** The object each of the above was read from. */
  readonly origin: Map<object, LoadedObject>;
}

interface KindInfo {
  readonly apiVersions: readonly string[];
  /** client-node model per apiVersion. */
  readonly model: Readonly<Record<string, string>>;
  readonly namespaced: boolean;
}

const KINDS: Readonly<Record<string, KindInfo>> = {
  Service: { apiVersions: ["v1"], model: { v1: "V1Service" }, namespaced: true },
  EndpointSlice: {
    apiVersions: ["discovery.k8s.io/v1"],
    model: { "discovery.k8s.io/v1": "V1EndpointSlice" },
    namespaced: true,
  },
  Node: { apiVersions: ["v1"], model: { v1: "V1Node" }, namespaced: false },
  ServiceCIDR: {
    apiVersions: ["networking.k8s.io/v1", "networking.k8s.io/v1beta1"],
    model: { "networking.k8s.io/v1": "V1ServiceCIDR", "networking.k8s.io/v1beta1": "V1beta1ServiceCIDR" },
    namespaced: false,
  },
};

/** The kinds render and explain read. */
export const INPUT_KINDS: readonly string[] = Object.keys(KINDS);

/** The API types (model names of lib/cli/api_schema.json) the input kinds are checked against. */
export const INPUT_MODELS: readonly string[] = Object.values(KINDS).flatMap((k) => Object.values(k.model));

/** `Service demo/web`, `Node node1`. */
export function objectName(kind: string, obj: { metadata?: { namespace?: string; name?: string } }): string {
  const ns = obj.metadata?.namespace;
  const name = obj.metadata?.name ?? "<no name>";
  return ns ? `${kind} ${ns}/${name}` : `${kind} ${name}`;
}

/**
 * Checks the objects and sorts them by kind. Namespaced objects without a namespace get `default`, as
 * `kubectl apply` without `-n` would give them. A later object with the kind, namespace and name of an earlier
 * one replaces it (as a later `kubectl apply` would), with a note.
 */
export function checkObjects(
  objects: readonly LoadedObject[],
): { input: ProxyInput; problems: InputProblem[] } {
  const problems: InputProblem[] = [];
  const byKey = new Map<string, { kind: string; obj: Record<string, unknown>; from: LoadedObject }>();
  const ignored = new Map<string, number>();
  for (const from of objects) {
    const v = from.value;
    const kind = typeof v.kind === "string" ? v.kind : "";
    const apiVersion = typeof v.apiVersion === "string" ? v.apiVersion : "";
    if (kind === "" || apiVersion === "") {
      problems.push({
        severity: "error",
        at: from.at,
        field: kind === "" ? "kind" : "apiVersion",
        message: `missing ${kind === "" ? "kind" : "apiVersion"}: not a Kubernetes object; not used`,
      });
      continue;
    }
    const info = KINDS[kind];
    if (!info) {
      ignored.set(kind, (ignored.get(kind) ?? 0) + 1);
      continue;
    }
    const name = objectName(kind, v as { metadata?: { namespace?: string; name?: string } });
    const err = (path: FieldPath, message: string) =>
      problems.push({
        severity: "error",
        at: from.position(path),
        object: name,
        field: path.length > 0 ? formatPath(path) : undefined,
        message,
      });
    if (!info.apiVersions.includes(apiVersion)) {
      err(
        ["apiVersion"],
        `${kind} is served as ${
          info.apiVersions.join(" or ")
        }, not ${apiVersion}; nothing is rendered for it`,
      );
      continue;
    }
    const issues = checkType(info.model[apiVersion], v);
    if (issues.length > 0) {
      for (const i of issues) {
        err(
          i.path,
          `${i.message} (Kubernetes API type ${info.model[apiVersion]}); nothing is rendered for it`,
        );
      }
      continue;
    }
    const meta = (v.metadata ?? {}) as { name?: string; namespace?: string; labels?: Record<string, string> };
    if (!meta.name) {
      err(["metadata", "name"], "missing metadata.name; nothing is rendered for it");
      continue;
    }
    // A copy: the input objects stay as read.
    const obj = structuredClone(v) as Record<string, unknown> & { metadata: typeof meta };
    obj.metadata = { ...meta };
    if (info.namespaced && !meta.namespace) obj.metadata.namespace = "default";
    if (!info.namespaced) delete obj.metadata.namespace;
    const labels = meta.labels ?? {};
    const display = objectName(kind, obj);
    const note = (message: string, path: FieldPath = []) =>
      problems.push({
        severity: "note",
        at: from.position(path),
        object: display,
        field: path.length > 0 ? formatPath(path) : undefined,
        message,
      });
    // v1.37's selectors: Services without service-proxy-name, EndpointSlices without headless.
    const filteredBy = kind === "Service"
      ? LABEL_SERVICE_PROXY_NAME
      : kind === "EndpointSlice"
      ? LABEL_HEADLESS
      : "";
    if (filteredBy !== "") {
      const label = filteredBy in labels ? filteredBy : undefined;
      if (label !== undefined) {
        note(`the default kube-proxy does not watch objects labelled ${label}; not used`, [
          "metadata",
          "labels",
          label,
        ]);
        continue;
      }
    }
    if (kind === "Service" && (obj.spec as Service["spec"])?.clusterIP === "None") {
      note("headless (clusterIP None): kube-proxy writes no rules for it", ["spec", "clusterIP"]);
      continue;
    }
    if (kind === "EndpointSlice") {
      if (!labels[LABEL_SERVICE_NAME]) {
        err(
          ["metadata", "labels"],
          `no ${LABEL_SERVICE_NAME} label: the agent cannot tell which Service it belongs to and ignores it`,
        );
        continue;
      }
    }
    const key = `${kind}\x00${obj.metadata.namespace ?? ""}\x00${obj.metadata.name}`;
    const prev = byKey.get(key);
    if (prev) {
      note(`also defined at ${prev.from.at.file}:${prev.from.at.line}; this later definition is used`);
    }
    byKey.set(key, { kind, obj, from });
  }
  if (ignored.size > 0) {
    const list = [...ignored].map(([k, n]) => `${n} ${k}`).join(", ");
    problems.push({
      severity: "note",
      at: { file: "", line: 0, col: 0 },
      message: `ignored objects of other kinds (${list}); only ${INPUT_KINDS.join(", ")} are read`,
    });
  }
  const input: ProxyInput = { services: [], slices: [], nodes: [], serviceCIDRs: [], origin: new Map() };
  for (const { kind, obj, from } of byKey.values()) {
    input.origin.set(obj, from);
    if (kind === "Service") input.services.push(obj as Service);
    else if (kind === "EndpointSlice") input.slices.push(obj as EndpointSlice);
    else if (kind === "Node") input.nodes.push(obj as Node);
    else input.serviceCIDRs.push(obj as ServiceCIDR);
  }
  // Slices of Services that are not in the input: the agent would keep them and write nothing.
  const services = new Set(input.services.map((s) => `${s.metadata?.namespace}/${s.metadata?.name}`));
  for (const s of input.slices) {
    const owner = `${s.metadata?.namespace}/${s.metadata?.labels?.[LABEL_SERVICE_NAME]}`;
    if (!services.has(owner)) {
      const from = input.origin.get(s)!;
      problems.push({
        severity: "note",
        at: from.position(["metadata", "labels", LABEL_SERVICE_NAME]),
        object: objectName("EndpointSlice", s),
        message: `its Service ${owner} is not among the manifests; its endpoints are not used`,
      });
    }
  }
  return { input, problems };
}

/** One line for the user: `file:line: Kind ns/name: field: message`. */
export function formatProblem(p: InputProblem): string {
  const where = p.at.file === ""
    ? ""
    : p.at.line > 0
    ? `${p.at.file}:${p.at.line}${p.at.col > 0 ? `:${p.at.col}` : ""}: `
    : `${p.at.file}: `;
  const what = p.object ? `${p.object}: ` : "";
  const field = p.field ? `${p.field}: ` : "";
  return `${p.severity === "note" ? "note: " : "error: "}${where}${what}${field}${p.message}`;
}
