/**
 * Wires the running agent from resolved {@linkcode ProxyOptions}: API client, informers, node manager,
 * dataplanes, proxier, servers and events, in upstream kube-proxy's start-up order except that the Service and
 * EndpointSlice lists start with the client (held until the proxier exists) and the sysctls run beside the node
 * wait. main.ts only parses the command line and calls {@linkcode runAgent}.
 * @module
 */
import type { ProxyOptions } from "./config/command.ts";
import { applyOOMScoreAdj, setupConntrack } from "./conntrack/sysctls.ts";
import { cleanStaleUDPConntrack } from "./conntrack/cleanup.ts";
import type { ModeContext, ProxyModeName } from "./dataplane/mode.ts";
import { cleanupAllModes, cleanupOtherModes, newDataplaneMode } from "./modes.ts";
import { type CommandRunner, DenoCommandRunner } from "./exec.ts";
import { createKubeClient, type KubeClient } from "./kube/client.ts";
import { EventRecorder, nodeRef } from "./kube/events.ts";
import {
  type Informer,
  keepEndpointSliceIdentity,
  keepServiceIdentity,
  newEndpointSliceInformer,
  newNodeInformer,
  newServiceCIDRInformer,
  newServiceInformer,
} from "./kube/informer.ts";
import { HeldCalls } from "./kube/held_calls.ts";
import { KubeConfigError } from "./kube/kubeconfig.ts";
import { protobufWatchAccept } from "./kube/protobuf.ts";
import type { Node } from "./kube/types.ts";
import { log } from "./log.ts";
import { familyOf } from "./net/ip.ts";
import { healthCheckAddresses } from "./net/node_addresses.ts";
import { detectNodeIPs, NodeManager } from "./proxy/node_manager.ts";
import { Proxier } from "./proxy/proxier.ts";
import type { Dataplane, IPFamily } from "./proxy/types.ts";
import { ProxyHealthServer } from "./server/health.ts";
import { MetricsServer } from "./server/metrics_server.ts";
import { ZPages } from "./server/zpages.ts";
import { configzObject } from "./config/load.ts";
import { GIT_VERSION, minorVersion } from "./config/version.ts";
import { recordFeatureGates } from "./server/component_metrics.ts";
import { registerProcessMetrics } from "./server/process_metrics.ts";
import { startEventLoopMonitor } from "./server/runtime_metrics.ts";
import { ServiceHealthServer } from "./server/service_health.ts";

/** Hooks for tests; production uses the defaults. */
export interface AgentDeps {
  runner?: CommandRunner;
  exit?: (code: number) => never | void;
}

/** A started agent; `stop()` tears everything down. */
export interface RunningAgent {
  proxier: Proxier;
  stop(): Promise<void>;
  /** Resolves when the agent stops (signal or fatal error), with the exit code. */
  done: Promise<number>;
}

/**
 * `--cleanup`: removes the rules of every mode and returns the exit code (0, or 1 if anything failed).
 */
export async function runCleanup(runner: CommandRunner = new DenoCommandRunner()): Promise<number> {
  const failed = await cleanupAllModes(runner, log);
  return failed ? 1 : 0;
}

/** Upstream's privileged initialisation (`--init-only` stops after it): OOM score and conntrack sysctls. */
export async function platformInit(opts: ProxyOptions, runner: CommandRunner): Promise<void> {
  await applyOOMScoreAdj(runner, opts.config.oomScoreAdj);
  const ct = opts.config.conntrack;
  const seconds = (ms: number) => Math.floor(ms / 1000);
  await setupConntrack(runner, {
    maxPerCore: ct.maxPerCore,
    min: ct.min,
    tcpEstablishedTimeoutSeconds: seconds(ct.tcpEstablishedTimeout),
    tcpCloseWaitTimeoutSeconds: seconds(ct.tcpCloseWaitTimeout),
    tcpBeLiberal: ct.tcpBeLiberal,
    udpTimeoutSeconds: seconds(ct.udpTimeout),
    udpStreamTimeoutSeconds: seconds(ct.udpStreamTimeout),
  });
}

/** The paths of the metrics listener that statusz lists (as upstream's, listed before statusz is installed). */
const METRICS_LISTENER_PATHS = ["/configz", "/healthz", "/metrics", "/proxyMode"];

/** Upstream v1.37's message when no proxy mode was set (`createProxier`, #139957), word for word. */
export const DEFAULT_MODE_MESSAGE =
  "No kube-proxy mode specified: defaulting to 'iptables'. Note that in Kubernetes 1.40 the default mode will " +
  "switch to 'nftables'. If you wish to continue using 'iptables' mode, you must explicitly specify " +
  "'mode: iptables' in the kube-proxy config file, or '--proxy-mode iptables' on the kube-proxy command line.";

/**
 * Runs the agent until a signal or a fatal condition. Resolves with the process exit code.
 */
export async function runAgent(opts: ProxyOptions, deps: AgentDeps = {}): Promise<RunningAgent> {
  const runner = deps.runner ?? new DenoCommandRunner();
  const exit = deps.exit ?? ((code: number) => Deno.exit(code));
  const cfg = opts.config;
  const modeName: ProxyModeName = opts.mode;
  const mode = newDataplaneMode(modeName);

  // The client first, as upstream: a kubeconfig that cannot work fails before the kernel is touched.
  let client: KubeClient;
  try {
    client = await createKubeClient(
      { kubeconfig: opts.apiSource.kind === "kubeconfig" ? opts.apiSource.path : "", master: opts.master },
      { qps: cfg.clientConnection.qps, burst: cfg.clientConnection.burst },
    );
  } catch (err) {
    if (err instanceof KubeConfigError) throw err;
    throw new KubeConfigError(`unable to create the API client: ${(err as Error).message}`);
  }

  const abort = new AbortController();
  let resolveDone!: (code: number) => void;
  const done = new Promise<number>((r) => (resolveDone = r));
  const stops: (() => Promise<void> | void)[] = [];
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    abort.abort();
    for (const s of stops.reverse()) {
      try {
        await s();
      } catch (err) {
        log.error("Error while stopping", err);
      }
    }
    client.close();
  };
  const fatal = (code: number) => {
    void stop().then(() => {
      resolveDone(code);
      exit(code);
    });
  };

  const resyncMs = cfg.configSyncPeriod;
  // client-go's WatchListClient: the informers' initial state by watch-list streams instead of LISTs.
  const useWatchList = opts.featureGates["WatchListClient"] === true;
  const nodeName = opts.hostname;
  const events = new EventRecorder(client, { hostname: nodeName });

  // The own Node: wait for it and its IPs before anything else (upstream NodeManager).
  const nodeManager = new NodeManager({
    nodeName,
    watchPodCIDRs: opts.detectLocalMode === "NodeCIDR",
    exit: (code) => fatal(code),
  });
  const nodeInformer: Informer<Node> = newNodeInformer(client, nodeName, { resyncMs, useWatchList });
  nodeInformer.addEventHandler({
    onAdd: (n) => nodeManager.onNodeAdd(n),
    onUpdate: (o, n) => nodeManager.onNodeUpdate(o, n),
    onDelete: (n) => nodeManager.onNodeDelete(n),
  });
  nodeInformer.start(abort.signal);
  stops.push(() => nodeInformer.stop());

  // The Service, EndpointSlice and ServiceCIDR lists run while the node and the kernel are set up (at scale
  // the lists are most of the time to a first sync); what they deliver is held until the proxier exists.
  // The proxier keeps its own model of Services and EndpointSlices; the informer caches keep only identities.
  const held = new HeldCalls<Proxier>();
  const services = newServiceInformer(client, {
    resyncMs,
    useWatchList,
    cacheTransform: keepServiceIdentity,
  });
  services.addEventHandler({
    onAdd: (s) => held.run((p) => p.onServiceAdd(s)),
    onUpdate: (o, s) => held.run((p) => p.onServiceUpdate(o, s)),
    onDelete: (s) => held.run((p) => p.onServiceDelete(s)),
  });
  services.onSynced(() => held.run((p) => p.onServicesSynced()));
  const slices = newEndpointSliceInformer(client, {
    resyncMs,
    useWatchList,
    cacheTransform: keepEndpointSliceIdentity,
    // EndpointSlice events are most of the steady state's watch traffic: protobuf is ~1/3.5 of their JSON.
    watchAccept: protobufWatchAccept(cfg.clientConnection),
  });
  slices.addEventHandler({
    onAdd: (s) => held.run((p) => p.onEndpointSliceAdd(s)),
    onUpdate: (o, s) => held.run((p) => p.onEndpointSliceUpdate(o, s)),
    onDelete: (s) => held.run((p) => p.onEndpointSliceDelete(s)),
  });
  slices.onSynced(() => held.run((p) => p.onEndpointSlicesSynced()));
  // Upstream watches ServiceCIDRs since MultiCIDRServiceAllocator went GA; every CIDR of every object counts.
  const serviceCIDRs = newServiceCIDRInformer(client, { resyncMs, useWatchList });
  const pushCIDRs = () =>
    held.run((p) => p.onServiceCIDRsChanged(serviceCIDRs.list().flatMap((c) => c.spec?.cidrs ?? [])));
  serviceCIDRs.addEventHandler({ onAdd: pushCIDRs, onUpdate: pushCIDRs, onDelete: pushCIDRs });
  services.start(abort.signal);
  slices.start(abort.signal);
  serviceCIDRs.start(abort.signal);
  stops.push(() => services.stop(), () => slices.stop(), () => serviceCIDRs.stop());

  // Until the dataplanes exist, a failure (no Node, a mode that cannot run here) stops what was started.
  let nodeIPs: ReturnType<typeof detectNodeIPs>;
  let families: IPFamily[];
  let dataplanes: Map<IPFamily, Dataplane>;
  let init: Promise<void> = Promise.resolve();
  try {
    // Upstream's platformCleanup: another mode's rules would fight this one's. Best effort; already logged.
    await cleanupOtherModes(runner, modeName, log);
    if (opts.nodePortAddresses.length === 0) {
      log.error(
        "Kube-proxy configuration may be incomplete or incorrect",
        "nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. " +
          "Consider using `--nodeport-addresses primary`",
      );
    }
    // OOM score and conntrack sysctls (never throws) run beside the node wait and the mode's set-up; the first
    // sync waits for them.
    init = platformInit(opts, runner);
    const node = await nodeManager.waitForNode();
    nodeIPs = detectNodeIPs(node, cfg.bindAddress);
    log.info("Successfully retrieved node IP(s)", { IPs: nodeIPs });
    const modeContext: ModeContext = {
      runner,
      options: opts,
      nodeIPs: nodeManager.nodeIPs,
      podCIDRs: nodeManager.podCIDRs,
      primaryFamily: nodeIPs.primaryFamily,
      logger: log,
      warningEvent: (reason, note) =>
        events.event(nodeRef(nodeName), "Warning", reason, "StartKubeProxy", note),
    };
    await mode.checkHost(modeContext);
    if (cfg.mode === "" && modeName === "iptables") {
      // v1.37 (#139957): the defaulted mode is announced, logged as an error and recorded as an Event.
      log.error(DEFAULT_MODE_MESSAGE);
      modeContext.warningEvent("KubeProxyDefaultMode", DEFAULT_MODE_MESSAGE);
    }
    families = await mode.probeFamilies(modeContext);
    dataplanes = await mode.createDataplanes(modeContext, families);
  } catch (err) {
    await init;
    await events.flush();
    await stop();
    throw err;
  }
  stops.push(() => {
    for (const dp of dataplanes.values()) dp.stop?.();
  });
  for (const family of families) {
    log.info("Created proxier", {
      ipFamily: family,
      nodeIPs: nodeManager.nodeIPs.filter((ip) => familyOf(ip) === family),
    });
  }

  // Servers.
  const health = new ProxyHealthServer({
    bindAddress: cfg.healthzBindAddress,
    healthTimeoutMs: 2 * opts.syncPeriod,
    getNode: () => nodeManager.node,
    bindAddressHardFail: cfg.bindAddressHardFail,
    onFatal: (err) => {
      events.event(
        nodeRef(nodeName),
        "Warning",
        "FailedToStartProxierHealthcheck",
        "StartKubeProxy",
        err.message,
      );
      log.error("Failed to start the proxier health server", err);
      fatal(1);
    },
  });
  if (cfg.healthzBindAddress !== "") {
    health.start();
    stops.push(() => health.stop());
  }
  // v1.37: /configz always, /flagz and /statusz behind their gates (BETA, on), on the metrics listener.
  const gates = opts.featureGates;
  const zpages = new ZPages({
    configz: configzObject(cfg),
    flagz: gates["ComponentFlagz"] ? opts.flagz : undefined,
    statusz: gates["ComponentStatusz"]
      ? {
        startTime: new Date(performance.timeOrigin),
        runtimeVersion: `deno ${Deno.version.deno}`,
        binaryVersion: GIT_VERSION.replace(/^v/, ""),
        emulationVersion: minorVersion(),
        paths: [...METRICS_LISTENER_PATHS, ...(gates["ComponentFlagz"] && opts.flagz ? ["/flagz"] : [])],
      }
      : undefined,
  });
  recordFeatureGates(opts.featureGates);
  const metrics = new MetricsServer({
    bindAddress: cfg.metricsBindAddress,
    mode: opts.mode,
    zpages,
    bindAddressHardFail: cfg.bindAddressHardFail,
    onFatal: (err) => {
      events.event(nodeRef(nodeName), "Warning", "FailedToStartMetricServer", "StartKubeProxy", err.message);
      log.error("Failed to start the metrics server", err);
      fatal(1);
    },
  });
  if (cfg.metricsBindAddress !== "") {
    await registerProcessMetrics();
    stops.push(startEventLoopMonitor());
    metrics.start();
    stops.push(() => metrics.stop());
  }
  const hcAddresses = await healthCheckAddresses(
    runner,
    families,
    opts.nodePortAddresses,
    nodeManager.nodeIPs,
  );
  const serviceHealth = new ServiceHealthServer({
    addresses: hcAddresses,
    proxyHealthy: () => health.isHealthy(),
    onListenError: (key, port, err) => {
      const [namespace, name] = key.split("/");
      events.event(
        { kind: "Service", apiVersion: "v1", namespace, name },
        "Warning",
        "FailedToStartServiceHealthcheck",
        "Listen",
        `node ${nodeName} failed to start healthcheck "${key}" on port ${port}: ${err.message}`,
      );
    },
  });
  stops.push(() => serviceHealth.stop());

  const proxier = new Proxier({
    families: dataplanes,
    nodeName,
    minSyncPeriodMs: opts.minSyncPeriod,
    syncPeriodMs: opts.syncPeriod,
    healthServer: health,
    serviceHealthServer: serviceHealth,
    conntrackCleaner: async (snapshot, removed) => {
      await cleanStaleUDPConntrack(runner, snapshot, snapshot.family, removed);
    },
    onInvalidService: (svc, reason, field) => {
      events.event(
        {
          kind: "Service",
          apiVersion: "v1",
          namespace: svc.metadata?.namespace ?? "",
          name: svc.metadata?.name ?? "",
          uid: svc.metadata?.uid,
        },
        "Warning",
        "InvalidService",
        "Sync",
        field ? `${reason} (${field})` : reason,
      );
    },
    onQuarantine: (port, family, error) => {
      events.event(
        { kind: "Service", apiVersion: "v1", namespace: port.name.namespace, name: port.name.name },
        "Warning",
        "ServicePortQuarantined",
        "Sync",
        `The ${opts.mode} proxy rules of service port ${port.nameString} (${family}) were refused and are left ` +
          `out until the Service changes or the next full sync; the other Services are programmed: ${error}`,
      );
    },
    onInvalidEndpointSlice: (slice, reason) => {
      events.event(
        {
          kind: "EndpointSlice",
          apiVersion: "discovery.k8s.io/v1",
          namespace: slice.metadata?.namespace ?? "",
          name: slice.metadata?.name ?? "",
          uid: slice.metadata?.uid,
        },
        "Warning",
        "InvalidEndpointSlice",
        "Sync",
        reason,
      );
    },
    preferSameTrafficDistribution: opts.featureGates["PreferSameTrafficDistribution"] ?? true,
  });
  stops.push(() => proxier.stop());
  nodeInformer.addEventHandler({
    onAdd: (n) => proxier.onNodeAdd(n),
    onUpdate: (o, n) => proxier.onNodeUpdate(o, n),
    onDelete: (n) => proxier.onNodeDelete(n),
  });
  // What the lists delivered so far goes to the proxier now (the rest as it arrives); it syncs once started.
  held.release(proxier);

  if (opts.configFile !== "") {
    // Upstream exits when its config file changes so that the DaemonSet restarts it with the new one.
    const watcher = Deno.watchFs(opts.configFile);
    stops.push(() => watcher.close());
    void (async () => {
      try {
        for await (const ev of watcher) {
          if (ev.kind === "modify" || ev.kind === "remove" || ev.kind === "create") {
            log.error("Content of the proxy server's configuration file was updated", undefined, {
              path: opts.configFile,
              event: ev.kind,
            });
            fatal(1);
            return;
          }
        }
      } catch { /* closed */ }
    })();
  }

  events.event(nodeRef(nodeName), "Normal", "Starting", "StartKubeProxy", "");
  stops.push(() => events.flush());
  await init;
  proxier.start();

  const onSignal = (sig: Deno.Signal) => {
    log.info("Received signal, shutting down", { signal: sig });
    void stop().then(() => resolveDone(0));
  };
  for (const sig of ["SIGTERM", "SIGINT"] as const) {
    const handler = () => onSignal(sig);
    Deno.addSignalListener(sig, handler);
    stops.push(() => Deno.removeSignalListener(sig, handler));
  }

  return { proxier, stop, done };
}
