/**
 * The agent's first full sync, run without a cluster and without touching the kernel: the chosen mode from the
 * registry (checkHost, probeFamilies, createDataplanes, as the agent calls them), the real
 * {@linkcode Proxier} fed through its informer handlers on a fake clock, and a {@linkcode SimulatedHost}
 * that answers the mode's reads as a fresh node and records every command. What the mode ran from the start of
 * the sync on is the output of `kube-proxy render`; the snapshots the proxier built are the model `kube-proxy
 * explain` reasons about.
 * @module
 */
import type { ProxyOptions } from "../config/command.ts";
import type { ModeContext } from "../dataplane/mode.ts";
import { ModeUnavailableError } from "../dataplane/mode.ts";
import type { EndpointSlice, Node, Service, ServiceCIDR } from "../kube/types.ts";
import { log } from "../log.ts";
import { newDataplaneMode } from "../modes.ts";
import { FakeClock } from "../proxy/clock.ts";
import { detectNodeIPs, nodeHostIPs } from "../proxy/node_manager.ts";
import { Proxier } from "../proxy/proxier.ts";
import type { Dataplane, IPFamily, ProxySnapshot } from "../proxy/types.ts";
import { changesKernel, SimulatedHost } from "./simulated_host.ts";

/** One command the agent would run, with its input. */
export interface RenderedCommand {
  readonly cmd: string;
  readonly args: readonly string[];
  /** What it reads on stdin ("" for none). */
  readonly stdin: string;
  /** The family whose sync ran it. */
  readonly family: IPFamily;
}

/** A Service the agent reports as (partly) unusable, with the field when known. */
export interface InvalidService {
  readonly service: Service;
  readonly reason: string;
  readonly field?: string;
}

/** What the first sync did. */
export interface FirstSync {
  /** The families the agent serves, primary first. */
  readonly families: readonly IPFamily[];
  /** The kernel-changing commands of the sync, in order. */
  readonly commands: readonly RenderedCommand[];
  /** The snapshot each family's dataplane rendered. */
  readonly snapshots: ReadonlyMap<IPFamily, ProxySnapshot>;
  /** Services the model reported, once per (Service, reason, field). */
  readonly invalid: readonly InvalidService[];
  /** Why this host could not run the mode (render goes on: the host is not the node being rendered). */
  readonly hostNote: string | null;
  /** The node's IPs, primary first. */
  readonly nodeIPs: readonly string[];
  /** The node's `spec.podCIDRs`. */
  readonly podCIDRs: readonly string[];
}

/** What the agent would receive from the API server. */
export interface ClusterState {
  readonly node: Node;
  readonly services: readonly Service[];
  readonly slices: readonly EndpointSlice[];
  readonly serviceCIDRs: readonly ServiceCIDR[];
}

/** Raised when the first sync fails (a bug, or a mode that rejects the input); the message says why. */
export class RenderError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RenderError";
  }
}

/**
 * Runs the agent's start-up (from its mode's host check on) and first full sync for `opts` and `state`.
 * @throws {RenderError} When the mode cannot be set up or the sync fails.
 */
export async function firstSync(opts: ProxyOptions, state: ClusterState): Promise<FirstSync> {
  const node = state.node;
  const ips = nodeHostIPs(node);
  const host = new SimulatedHost({ addresses: ips });
  const runner = host.runner;
  const detected = detectNodeIPs(node, opts.config.bindAddress);
  const mode = newDataplaneMode(opts.mode);
  const ctx: ModeContext = {
    runner,
    options: opts,
    nodeIPs: ips,
    podCIDRs: [...(node.spec?.podCIDRs ?? [])],
    primaryFamily: detected.primaryFamily,
    logger: log,
    warningEvent: () => {},
  };
  let hostNote: string | null = null;
  let dataplanes: Map<IPFamily, Dataplane>;
  let families: IPFamily[];
  try {
    try {
      await mode.checkHost(ctx);
    } catch (err) {
      if (!(err instanceof ModeUnavailableError)) throw err;
      hostNote = err.message;
    }
    families = await mode.probeFamilies(ctx);
    dataplanes = await mode.createDataplanes(ctx, families);
  } catch (err) {
    throw new RenderError(`the ${opts.mode} mode could not be set up: ${(err as Error).message}`, {
      cause: err,
    });
  }

  // Which family's sync ran each call: the proxier syncs the families one after the other.
  const spans: { family: IPFamily; from: number; to: number }[] = [];
  const tagged = new Map<IPFamily, Dataplane>();
  for (const [family, dp] of dataplanes) {
    tagged.set(family, {
      family,
      sync: async (snapshot) => {
        const from = runner.calls.length;
        try {
          return await dp.sync(snapshot);
        } finally {
          spans.push({ family, from, to: runner.calls.length });
        }
      },
    });
  }

  const invalid: InvalidService[] = [];
  const clock = new FakeClock();
  const proxier = new Proxier({
    families: tagged,
    nodeName: opts.hostname,
    minSyncPeriodMs: opts.minSyncPeriod,
    syncPeriodMs: opts.syncPeriod,
    clock,
    onInvalidService: (service, reason, field) => invalid.push({ service, reason, field }),
    preferSameTrafficDistribution: opts.featureGates["PreferSameTrafficDistribution"] ?? true,
  });
  // The informers' order in the agent: the Node first, then the initial lists (the API server lists objects by
  // namespace and name, which is the order rules of different Services end up in), then "synced".
  proxier.onNodeAdd(node);
  for (const s of byKey(state.services)) proxier.onServiceAdd(s);
  for (const s of byKey(state.slices)) proxier.onEndpointSliceAdd(s);
  if (state.serviceCIDRs.length > 0) {
    proxier.onServiceCIDRsChanged(state.serviceCIDRs.flatMap((c) => c.spec?.cidrs ?? []));
  }
  proxier.onServicesSynced();
  proxier.onEndpointSlicesSynced();
  proxier.start();
  await clock.settle();
  await proxier.stop();
  if (proxier.syncCount !== 1 || proxier.failureCount !== 0) {
    throw new RenderError(
      `the first sync did not complete (syncs: ${proxier.syncCount}, failed families: ${proxier.failureCount})`,
    );
  }

  const commands: RenderedCommand[] = [];
  for (const span of spans) {
    for (const c of runner.calls.slice(span.from, span.to)) {
      if (changesKernel(c)) commands.push({ cmd: c.cmd, args: c.args, stdin: c.stdin, family: span.family });
    }
  }
  const snapshots = new Map<IPFamily, ProxySnapshot>();
  for (const f of families) {
    const s = proxier.lastSnapshot(f);
    if (s) snapshots.set(f, s);
  }
  return { families, commands, snapshots, invalid, hostNote, nodeIPs: ips, podCIDRs: ctx.podCIDRs };
}

/** Objects in the API server's list order: by namespace, then name. */
function byKey<T extends { metadata?: { namespace?: string; name?: string } }>(objs: readonly T[]): T[] {
  const key = (o: T) => `${o.metadata?.namespace ?? ""}/${o.metadata?.name ?? ""}`;
  return [...objs].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}
