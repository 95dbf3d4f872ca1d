/**
 * The API server simulator as a separate process, usually inside a network namespace (the agent runs in
 * the sandbox's node namespace and reaches the simulator on that namespace's loopback), controlled over
 * stdin/stdout JSON lines. Used by the dataplane tests, the demo and the scale harness.
 *
 * Run directly: `deno run -A testkit/apiserver_process.ts --kubeconfig /tmp/k.yaml [--load f.yaml ...]
 * [--port N] [--tls-cert F --tls-key F [--client-ca F]] [--token T]`.
 * @module
 */
import { parseAllDocuments } from "yaml";
import { ApiServerSimulator, type RequestKind, type ResourceName } from "./apiserver.ts";
import type { KubeObject } from "../lib/kube/types.ts";

/** A request on the control channel. */
type ControlRequest =
  | { id: number; op: "upsert"; resource: ResourceName; obj: KubeObject }
  | { id: number; op: "upsertMany"; resource: ResourceName; objs: KubeObject[] }
  | { id: number; op: "delete"; resource: ResourceName; namespace?: string; name: string }
  | { id: number; op: "list"; resource: ResourceName }
  | { id: number; op: "stats" }
  | { id: number; op: "dropWatches" }
  | { id: number; op: "failNext"; n: number; status: number; kind?: RequestKind; resource?: ResourceName };

/** The resource a manifest object belongs to, from its kind. */
export function resourceOfKind(kind: string | undefined): ResourceName {
  switch (kind) {
    case "Service":
      return "services";
    case "EndpointSlice":
      return "endpointslices";
    case "ServiceCIDR":
      return "servicecidrs";
    case "Node":
      return "nodes";
    default:
      throw new Error(`unsupported kind ${kind}`);
  }
}

/** Reads every object of a multi-document YAML (or JSON) manifest. */
export async function readManifest(path: string): Promise<KubeObject[]> {
  const text = await Deno.readTextFile(path);
  const out: KubeObject[] = [];
  for (const doc of parseAllDocuments(text)) {
    if ("errors" in doc && doc.errors.length > 0) throw new Error(`${path}: ${doc.errors[0].message}`);
    const obj = doc.toJSON() as KubeObject | KubeObject[] | null;
    if (obj === null) continue;
    if (Array.isArray(obj)) out.push(...obj);
    else if ((obj as { kind?: string }).kind === "List") {
      out.push(...((obj as { items: KubeObject[] }).items));
    } else out.push(obj);
  }
  return out;
}

async function serve(args: string[]): Promise<void> {
  let kubeconfig = "";
  const loads: string[] = [];
  let port = 0;
  let tlsCert = "", tlsKey = "", clientCA = "", token: string | undefined;
  let watchCache = false;
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--kubeconfig") kubeconfig = args[++i];
    else if (args[i] === "--watch-cache") watchCache = true;
    else if (args[i] === "--load") loads.push(args[++i]);
    else if (args[i] === "--port") port = Number(args[++i]);
    else if (args[i] === "--tls-cert") tlsCert = args[++i];
    else if (args[i] === "--tls-key") tlsKey = args[++i];
    else if (args[i] === "--client-ca") clientCA = args[++i];
    else if (args[i] === "--token") token = args[++i];
  }
  const read = (f: string) => Deno.readTextFile(f);
  const sim = await ApiServerSimulator.start({
    port,
    watchCache,
    bookmarkIntervalMs: 10_000,
    token,
    tls: tlsCert ? { cert: await read(tlsCert), key: await read(tlsKey) } : undefined,
    clientCA: clientCA ? await read(clientCA) : undefined,
  });
  for (const file of loads) {
    for (const obj of await readManifest(file)) sim.upsert(resourceOfKind(obj.kind), obj);
  }
  if (kubeconfig) await sim.writeKubeconfig({ path: kubeconfig });
  const out = Deno.stdout.writable.getWriter();
  const enc = new TextEncoder();
  const reply = (v: unknown) => out.write(enc.encode(JSON.stringify(v) + "\n"));
  await reply({ ready: true, url: sim.url });
  for await (const line of splitLines(Deno.stdin.readable)) {
    if (!line.trim()) continue;
    const req = JSON.parse(line) as ControlRequest;
    try {
      let result: unknown = null;
      switch (req.op) {
        case "upsert":
          result = sim.upsert(req.resource, req.obj).metadata?.resourceVersion;
          break;
        case "upsertMany":
          sim.upsertMany(req.resource, req.objs);
          break;
        case "delete":
          result = sim.delete(req.resource, req.namespace, req.name);
          break;
        case "list":
          result = sim.list(req.resource);
          break;
        case "stats":
          result = {
            lists: sim.stats.lists(),
            watches: sim.stats.watches(),
            openWatches: sim.openWatches(),
            rv: sim.rv,
          };
          break;
        case "dropWatches":
          sim.faults.dropWatches();
          break;
        case "failNext":
          sim.faults.failNext(req.n, req.status, { kind: req.kind, resource: req.resource });
          break;
      }
      await reply({ id: req.id, ok: true, result });
    } catch (err) {
      await reply({ id: req.id, ok: false, error: String(err) });
    }
  }
  await sim.close();
}

/** Options of {@linkcode SimulatorProcess.start}. */
export interface SimulatorProcessOptions {
  /** Network namespace to run in (via `ip netns exec`); the current one when omitted. */
  netns?: string;
  /** Manifests (YAML/JSON) loaded before the first request. */
  load?: string[];
  /**
   * Port to listen on (the simulator's `--port`); any free port when omitted. A fixed port lets a new
   * simulator take over the address (and so the kubeconfig URL) of one that was closed.
   */
  port?: number;
  /** Serve HTTPS with this certificate and key (PEM files). */
  tls?: { certFile: string; keyFile: string };
  /** With `tls`: require client certificates signed by this CA (PEM file). */
  clientCAFile?: string;
  /** Require this bearer token (unless a client certificate was verified). */
  token?: string;
  /** Serve resourceVersion=0 lists whole, as kube-apiserver's watch cache (the simulator's `--watch-cache`). */
  watchCache?: boolean;
}

/** A simulator running as a child process, driven over its stdin/stdout. */
export class SimulatorProcess {
  private nextId = 1;
  private readonly pending = new Map<
    number,
    (v: { ok: boolean; result?: unknown; error?: string }) => void
  >();
  private readonly writer: WritableStreamDefaultWriter<Uint8Array>;
  private readonly enc = new TextEncoder();
  private readLoop: Promise<void> = Promise.resolve();

  private constructor(
    private readonly child: Deno.ChildProcess,
    /** URL of the API server, valid inside the namespace. */
    readonly url: string,
    /** kubeconfig file pointing at it. */
    readonly kubeconfig: string,
    lines: AsyncIterator<string>,
  ) {
    this.writer = child.stdin.getWriter();
    this.readLoop = (async () => {
      while (true) {
        const { value, done } = await lines.next();
        if (done) break;
        const msg = JSON.parse(value);
        this.pending.get(msg.id)?.(msg);
        this.pending.delete(msg.id);
      }
    })();
  }

  /** Starts the simulator process and waits until it listens. */
  static async start(opts: SimulatorProcessOptions = {}): Promise<SimulatorProcess> {
    const kubeconfig = await Deno.makeTempFile({ prefix: "dkp-sim-kubeconfig-", suffix: ".yaml" });
    const self = new URL(import.meta.url).pathname;
    const args = ["run", "-A", self, "--kubeconfig", kubeconfig];
    for (const f of opts.load ?? []) args.push("--load", f);
    if (opts.port !== undefined) args.push("--port", String(opts.port));
    if (opts.tls) args.push("--tls-cert", opts.tls.certFile, "--tls-key", opts.tls.keyFile);
    if (opts.clientCAFile) args.push("--client-ca", opts.clientCAFile);
    if (opts.token !== undefined) args.push("--token", opts.token);
    if (opts.watchCache) args.push("--watch-cache");
    const cmd = opts.netns ? "ip" : Deno.execPath();
    const fullArgs = opts.netns ? ["netns", "exec", opts.netns, Deno.execPath(), ...args] : args;
    const child = new Deno.Command(cmd, {
      args: fullArgs,
      stdin: "piped",
      stdout: "piped",
      env: { DENO_NO_UPDATE_CHECK: "1" },
      stderr: "inherit",
    })
      .spawn();
    const lines = splitLines(child.stdout);
    const first = await lines.next();
    if (first.done) throw new Error("simulator process exited before it was ready");
    const ready = JSON.parse(first.value);
    return new SimulatorProcess(child, ready.url, kubeconfig, lines);
  }

  private async call(req: Record<string, unknown>): Promise<unknown> {
    const id = this.nextId++;
    const answer = new Promise<{ ok: boolean; result?: unknown; error?: string }>((r) =>
      this.pending.set(id, r)
    );
    await this.writer.write(this.enc.encode(JSON.stringify({ ...req, id }) + "\n"));
    const a = await answer;
    if (!a.ok) throw new Error(a.error);
    return a.result;
  }

  /** Creates or replaces an object. */
  upsert(obj: KubeObject): Promise<unknown> {
    return this.call({ op: "upsert", resource: resourceOfKind(obj.kind), obj });
  }

  /** Creates or replaces many objects of one resource at once. */
  upsertMany(resource: ResourceName, objs: KubeObject[]): Promise<unknown> {
    return this.call({ op: "upsertMany", resource, objs });
  }

  /** Deletes an object. */
  delete(resource: ResourceName, namespace: string | undefined, name: string): Promise<unknown> {
    return this.call({ op: "delete", resource, namespace, name });
  }

  /** Every object of a resource (e.g. the Events the agent posted). */
  list(resource: ResourceName): Promise<KubeObject[]> {
    return this.call({ op: "list", resource }) as Promise<KubeObject[]>;
  }

  /** Request counters. */
  stats(): Promise<{ lists: number; watches: number; openWatches: number; rv: number }> {
    return this.call({ op: "stats" }) as Promise<
      { lists: number; watches: number; openWatches: number; rv: number }
    >;
  }

  /** Ends every open watch stream without a clean end. */
  dropWatches(): Promise<unknown> {
    return this.call({ op: "dropWatches" });
  }

  /** Fails the next `n` requests of `kind` (and resource) with `status` (see SimulatorFaults.failNext). */
  failNext(
    n: number,
    status: number,
    opts: { kind?: RequestKind; resource?: ResourceName } = {},
  ): Promise<unknown> {
    return this.call({ op: "failNext", n, status, ...opts });
  }

  /** Stops the process and removes its kubeconfig. */
  async close(): Promise<void> {
    try {
      await this.writer.close();
    } catch { /* gone */ }
    try {
      this.child.kill("SIGTERM");
    } catch { /* gone */ }
    await this.child.status;
    await this.readLoop.catch(() => {});
    await Deno.remove(this.kubeconfig).catch(() => {});
  }
}

async function* splitLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let buf = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      yield buf.slice(0, nl);
      buf = buf.slice(nl + 1);
    }
  }
}

if (import.meta.main) await serve(Deno.args);
