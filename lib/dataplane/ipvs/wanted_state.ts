/**
 * What the ipvs dataplane wants programmed: every service port's rendering and the reference counts of the
 * virtual servers, ipset members and kube-ipvs0 addresses the renderings share, so that a partial sync knows
 * which objects a changed port touched and whether anything else still wants them.
 * @module
 */
import { SET_DEFS, type SetKey } from "./ipsets.ts";
import type { PortRendering, WantedVirtualServer } from "./render.ts";

/** The objects one sync's changes touched: the kernel model diffs only these on a partial sync. */
export interface TouchedObjects {
  /** Virtual server keys (may repeat). */
  readonly virtualServers: string[];
  /** Set members as set key and member (may repeat). */
  readonly setEntries: [SetKey, string][];
  /** kube-ipvs0 addresses that became wanted or unwanted. */
  readonly addrs: string[];
}

/** The rendered service ports and the reference counts of what they want. */
export class WantedState {
  /** Renderings by service port name. */
  readonly ports = new Map<string, PortRendering>();
  /** Service port names by Service (a plain string for the usual single port). */
  readonly byService = new Map<string, string | string[]>();
  /**
   * Wanted virtual servers by key, each with the names of the service ports that want it (in the order they
   * claimed it; a plain string for the usual single claim): two Services may name the same address and port
   * (an externalIP listed twice); the last claim is programmed, and when it goes the previous one is, as long
   * as one remains. The claim's virtual server is read from the port's rendering.
   */
  readonly virtualServers = new Map<string, string | string[]>();
  /** Wanted members of each set with their reference counts. */
  readonly sets = new Map<SetKey, Map<string, number>>();
  /** Wanted kube-ipvs0 addresses with their reference counts. */
  readonly addrs = new Map<string, number>();
  /** KUBE-IPVS-OUT-FILTER rules by service port name. */
  readonly outFilters = new Map<string, string>();

  constructor() {
    for (const d of SET_DEFS) this.sets.set(d.key, new Map());
  }

  /**
   * Replaces the rendering of service port `name` with `next` (null: the port is gone), moving its references
   * and recording the objects it touched.
   */
  update(name: string, next: PortRendering | null, touched: TouchedObjects): void {
    const prev = this.ports.get(name);
    if (prev) this.unref(name, prev, touched);
    if (next) {
      this.ports.set(name, next);
      this.ref(name, next, touched);
      const key = next.state.info.serviceKey;
      if (prev?.state.info.serviceKey !== key) {
        if (prev) removeName(this.byService, prev.state.info.serviceKey, name);
        addName(this.byService, key, name);
      }
    } else {
      this.ports.delete(name);
      removeName(this.byService, prev!.state.info.serviceKey, name);
    }
  }

  /** The wanted virtual server of a key: its last claim (the claiming port's last virtual server of the key). */
  currentVS(key: string): WantedVirtualServer | undefined {
    const names = this.virtualServers.get(key);
    if (names === undefined) return undefined;
    const vs = this.ports.get(typeof names === "string" ? names : names[names.length - 1])?.vs ?? [];
    for (let i = vs.length - 1; i >= 0; i--) if (vs[i].key === key) return vs[i];
    return undefined;
  }

  private ref(name: string, p: PortRendering, touched: TouchedObjects): void {
    for (const w of p.vs) {
      removeName(this.virtualServers, w.key, name);
      addName(this.virtualServers, w.key, name);
      touched.virtualServers.push(w.key);
    }
    for (let i = 0; i < p.sets.length; i += 2) {
      const k = p.sets[i] as SetKey, e = p.sets[i + 1];
      const m = this.sets.get(k)!;
      m.set(e, (m.get(e) ?? 0) + 1);
      touched.setEntries.push([k, e]);
    }
    for (const ip of p.bind) {
      const n = this.addrs.get(ip) ?? 0;
      this.addrs.set(ip, n + 1);
      if (n === 0) {
        touched.addrs.push(ip);
        const m = this.sets.get("KUBE-IPVS-IPS")!;
        m.set(ip, 1);
        touched.setEntries.push(["KUBE-IPVS-IPS", ip]);
      }
    }
    if (p.outFilter !== "") this.outFilters.set(name, p.outFilter);
  }

  private unref(name: string, p: PortRendering, touched: TouchedObjects): void {
    for (const w of p.vs) {
      if (removeName(this.virtualServers, w.key, name)) touched.virtualServers.push(w.key);
    }
    for (let i = 0; i < p.sets.length; i += 2) {
      const k = p.sets[i] as SetKey, e = p.sets[i + 1];
      const m = this.sets.get(k)!;
      const n = (m.get(e) ?? 1) - 1;
      if (n <= 0) m.delete(e);
      else m.set(e, n);
      touched.setEntries.push([k, e]);
    }
    for (const ip of p.bind) {
      const n = (this.addrs.get(ip) ?? 1) - 1;
      if (n <= 0) {
        this.addrs.delete(ip);
        this.sets.get("KUBE-IPVS-IPS")!.delete(ip);
        touched.setEntries.push(["KUBE-IPVS-IPS", ip]);
        touched.addrs.push(ip);
      } else this.addrs.set(ip, n);
    }
    this.outFilters.delete(name);
  }
}

/** Appends `name` to the names under `key` (a plain string while there is one). */
function addName(m: Map<string, string | string[]>, key: string, name: string): void {
  const have = m.get(key);
  if (have === undefined) m.set(key, name);
  else if (typeof have === "string") m.set(key, [have, name]);
  else have.push(name);
}

/** Removes `name` from the names under `key`; true when it was there. */
function removeName(m: Map<string, string | string[]>, key: string, name: string): boolean {
  const have = m.get(key);
  if (have === undefined) return false;
  if (typeof have === "string") {
    if (have !== name) return false;
    m.delete(key);
    return true;
  }
  const i = have.indexOf(name);
  if (i < 0) return false;
  have.splice(i, 1);
  if (have.length === 1) m.set(key, have[0]);
  return true;
}
