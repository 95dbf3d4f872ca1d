/**
 * The ipvs dataplane's kernel model: what the kernel has as far as the dataplane knows (virtual servers with
 * their real servers' weights, set members, kube-ipvs0 and its addresses, real servers being drained), and
 * its diffing against the wanted state into the `ipvsadm -R`, `ipset restore` and `ip -batch` lines that make
 * the kernel what is wanted. Every line produced updates the model as if it had been applied.
 * @module
 */
import { cidrContains, familyOf, type IPFamily } from "../../net/ip.ts";
import { DUMMY_INTERFACE } from "./addresses.ts";
import { createLine, SET_DEFS, type SetKey, setName } from "./ipsets.ts";
import {
  deleteRealServerLine,
  deleteServiceLine,
  keyAddress,
  keyProtocol,
  realServerLine,
  sameDef,
  serviceLine,
  type VirtualServerDef,
} from "./ipvsadm.ts";
import type { WantedState } from "./wanted_state.ts";

/** Timeout of the commands that may write or dump the whole kernel state (batches, saves, listings): 5 min. */
export const KERNEL_COMMAND_TIMEOUT_MS = 300_000;

/**
 * A virtual server of the kernel model. `reals` is the wanted rendering's own (sorted, never mutated) array when
 * the kernel has exactly those real servers, all with weight 1, the usual case, which then costs no Map per
 * virtual server; otherwise a Map of real server → weight.
 */
export interface ModelVirtualServer {
  def: VirtualServerDef;
  reals: readonly string[] | Map<string, number>;
}

/** The weights of a model virtual server's real servers as a Map (made from the shared array form). */
export function realsMap(k: ModelVirtualServer): Map<string, number> {
  if (k.reals instanceof Map) return k.reals;
  const m = new Map<string, number>();
  for (const rs of k.reals) m.set(rs, 1);
  k.reals = m;
  return m;
}

/** What the kernel has, and the batch lines that turn it into the wanted state. */
export class KernelModel {
  /** Virtual servers of the family by key. */
  virtualServers = new Map<string, ModelVirtualServer>();
  /** Members of each of the mode's sets. */
  sets = new Map<SetKey, Set<string>>();
  /** Addresses on kube-ipvs0. */
  addrs = new Set<string>();
  /** kube-ipvs0 exists. */
  dummyExists = false;
  /** The family's local addresses on other interfaces, as the last full sync read them. */
  nodeAddresses: string[] = [];
  /** Real servers with weight 0 waiting for their connections to end, by virtual server. */
  readonly draining = new Map<string, Set<string>>();

  private readonly family: IPFamily;
  private readonly wanted: WantedState;
  private readonly exclude: readonly string[];

  /** `excludeCIDRs`: virtual servers on these addresses are never deleted (other families' are ignored). */
  constructor(family: IPFamily, wanted: WantedState, excludeCIDRs: readonly string[]) {
    this.family = family;
    this.wanted = wanted;
    this.exclude = excludeCIDRs.filter((c) => familyOf(c) === family);
    for (const d of SET_DEFS) this.sets.set(d.key, new Set());
  }

  // ---- virtual servers ----

  private excluded(key: string): boolean {
    if (this.exclude.length === 0) return false;
    const ip = keyAddress(key);
    return this.exclude.some((c) => cidrContains(c, ip));
  }

  /** Lines that make one virtual server in the kernel what is wanted (the kernel model follows). */
  private diffVS(key: string): string {
    const want = this.wanted.currentVS(key);
    let k = this.virtualServers.get(key);
    let out = "";
    if (!want) {
      if (k && !this.excluded(key)) {
        out += deleteServiceLine(key);
        this.virtualServers.delete(key);
        this.draining.delete(key);
      }
      return out;
    }
    if (!k) {
      out += serviceLine("-A", key, want.def);
      k = { def: want.def, reals: new Map() };
      this.virtualServers.set(key, k);
    } else if (!sameDef(k.def, want.def)) {
      out += serviceLine("-E", key, want.def);
      k.def = want.def;
    }
    // The kernel has the wanted array's real servers, all with weight 1 (nothing of the key is draining).
    if (k.reals === want.reals) return out;
    const reals = realsMap(k);
    const drain = this.draining.get(key);
    for (const rs of want.reals) {
      const w = reals.get(rs);
      if (w === undefined) out += realServerLine("-a", key, rs, 1);
      else if (w !== 1) out += realServerLine("-e", key, rs, 1);
      else continue;
      reals.set(rs, 1);
      drain?.delete(rs);
    }
    if (reals.size > want.reals.length) {
      const keep = new Set(want.reals);
      const graceful = keyProtocol(key) === "TCP";
      for (const [rs, w] of reals) {
        if (keep.has(rs)) continue;
        if (!graceful) {
          // UDP and SCTP: no graceful termination, as upstream (expire_nodest_conn drops their flows).
          out += deleteRealServerLine(key, rs);
          reals.delete(rs);
          continue;
        }
        if (w !== 0) {
          out += realServerLine("-e", key, rs, 0);
          reals.set(rs, 0);
        }
        let d = this.draining.get(key);
        if (!d) this.draining.set(key, d = new Set());
        d.add(rs);
      }
    }
    if (drain?.size === 0) this.draining.delete(key);
    // Every wanted real server has weight 1 and nothing else is left (none draining): share the wanted array.
    if (reals.size === want.reals.length && !this.draining.has(key)) k.reals = want.reals;
    return out;
  }

  /** `ipvsadm -R` lines for the given virtual servers (a partial sync's touched keys; repeats are skipped). */
  virtualServerOps(keys: readonly string[]): string {
    let out = "";
    const seen = new Set<string>();
    for (const key of keys) {
      if (seen.has(key)) continue;
      seen.add(key);
      out += this.diffVS(key);
    }
    return out;
  }

  /**
   * `ipvsadm -R` lines for every virtual server (a full sync): the wanted ones in the order of `portNames`
   * (the snapshot's service ports), then the kernel's unwanted ones.
   */
  fullVirtualServerOps(portNames: Iterable<string>): string {
    return [...this.fullVirtualServerBlocks(portNames)].join("");
  }

  /**
   * {@linkcode fullVirtualServerOps} one virtual server's lines at a time, each computed (and the model updated
   * for it) only when the consumer asks for it, so that a full sync can stream the batch to `ipvsadm -R` instead
   * of holding it whole (6.5 MB at 10k Services × 10). Empty blocks are skipped.
   */
  *fullVirtualServerBlocks(portNames: Iterable<string>): Generator<string, void, undefined> {
    const seen = new Set<string>();
    for (const name of portNames) {
      const p = this.wanted.ports.get(name);
      if (!p) continue;
      for (const w of p.vs) {
        if (seen.has(w.key)) continue;
        seen.add(w.key);
        const ops = this.diffVS(w.key);
        if (ops !== "") yield ops;
      }
    }
    for (const key of [...this.virtualServers.keys()]) {
      if (seen.has(key)) continue;
      const ops = this.diffVS(key);
      if (ops !== "") yield ops;
    }
  }

  // ---- ipsets ----

  private setLine(k: SetKey, e: string): string {
    const want = this.wanted.sets.get(k)!.has(e);
    const have = this.sets.get(k)!;
    if (want === have.has(e)) return "";
    if (want) {
      have.add(e);
      return `add ${setName(k, this.family)} ${e} -exist\n`;
    }
    have.delete(e);
    return `del ${setName(k, this.family)} ${e} -exist\n`;
  }

  /** `ipset restore` lines for the given set members (a partial sync's touched entries). */
  setOps(entries: readonly [SetKey, string][]): string {
    let out = "";
    for (const [k, e] of entries) out += this.setLine(k, e);
    return out;
  }

  /** `ipset restore` lines for every set (a full sync): the create lines, then every member that differs. */
  fullSetOps(): string {
    const parts: string[] = [];
    for (const d of SET_DEFS) parts.push(createLine(d, this.family) + " -exist\n");
    for (const d of SET_DEFS) {
      const want = this.wanted.sets.get(d.key)!;
      const have = this.sets.get(d.key)!;
      for (const e of [...have]) if (!want.has(e)) parts.push(this.setLine(d.key, e));
      for (const e of want.keys()) if (!have.has(e)) parts.push(this.setLine(d.key, e));
    }
    return parts.join("");
  }

  // ---- kube-ipvs0 ----

  private addrLine(ip: string): string {
    const want = this.wanted.addrs.has(ip);
    if (want === this.addrs.has(ip)) return "";
    const len = this.family === "IPv6" ? 128 : 32;
    if (want) {
      this.addrs.add(ip);
      return `addr replace ${ip}/${len} dev ${DUMMY_INTERFACE}\n`;
    }
    this.addrs.delete(ip);
    return `addr del ${ip}/${len} dev ${DUMMY_INTERFACE}\n`;
  }

  private linkLine(): string {
    return this.dummyExists ? "" : `link add ${DUMMY_INTERFACE} type dummy\n`;
  }

  /** `ip -batch` lines for the given addresses (a partial sync's touched ones), creating kube-ipvs0 if needed. */
  addressOps(addrs: readonly string[]): string {
    let out = "";
    for (const ip of addrs) out += this.addrLine(ip);
    return out === "" ? "" : this.linkLine() + out;
  }

  /** `ip -batch` lines for every address (a full sync), creating kube-ipvs0 if needed. */
  fullAddressOps(): string {
    const parts: string[] = [this.linkLine()];
    for (const ip of [...this.addrs]) if (!this.wanted.addrs.has(ip)) parts.push(this.addrLine(ip));
    for (const ip of this.wanted.addrs.keys()) parts.push(this.addrLine(ip));
    return parts.join("");
  }
}
