/**
 * The manifests under deploy/ as objects, for the tests that check them against the agent (its flags, its config
 * loader) and run the agent the way the DaemonSet does.
 * @module
 */

import { parseAllDocuments } from "yaml";
import { PROJECT_ROOT } from "./agent_command.ts";

/** The deploy/ directory (ends with "/"). */
export const DEPLOY_DIR = `${PROJECT_ROOT}deploy/`;

/** A Kubernetes object as parsed from YAML. */
// deno-lint-ignore no-explicit-any
export type Manifest = Record<string, any> & {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
};

/** Every object of every `*.yaml` manifest in deploy/ (not the systemd sample config), with its file name. */
export function readDeployManifests(): { file: string; obj: Manifest }[] {
  const out: { file: string; obj: Manifest }[] = [];
  const files = [...Deno.readDirSync(DEPLOY_DIR)]
    .filter((e) => e.isFile && e.name.endsWith(".yaml") && e.name !== "kube-proxy-config.yaml")
    .map((e) => e.name)
    .sort();
  for (const file of files) {
    for (const doc of parseAllDocuments(Deno.readTextFileSync(DEPLOY_DIR + file))) {
      if ("errors" in doc && doc.errors.length > 0) throw new Error(`${file}: ${doc.errors[0].message}`);
      const obj = doc.toJS();
      if (obj !== null) out.push({ file, obj });
    }
  }
  return out;
}

/** The one object of `kind` named `name` in deploy/; throws when there is not exactly one. */
export function deployObject(kind: string, name: string): Manifest {
  const found = readDeployManifests().filter((m) => m.obj.kind === kind && m.obj.metadata?.name === name);
  if (found.length !== 1) throw new Error(`expected one ${kind} ${name} in deploy/, found ${found.length}`);
  return found[0].obj;
}

/** The kube-proxy DaemonSet's container. */
// deno-lint-ignore no-explicit-any
export function kubeProxyContainer(): Record<string, any> {
  const ds = deployObject("DaemonSet", "kube-proxy");
  const containers = ds.spec.template.spec.containers;
  if (containers.length !== 1) throw new Error("expected one container in the kube-proxy DaemonSet");
  return containers[0];
}

/**
 * The container's command with `$(VAR)` references expanded from `env` as the kubelet does (an unknown
 * reference is left as written).
 */
export function expandCommand(command: string[], env: Record<string, string>): string[] {
  return command.map((w) => w.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) => env[v] ?? m));
}
