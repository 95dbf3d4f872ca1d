/**
 * The node's addresses as the ipvs mode reads them: one `ip -j -4|-6 addr show` gives both the addresses bound
 * on kube-ipvs0 and every other local address (upstream's `GetLocalAddresses(kube-ipvs0)` and
 * `GetAllLocalAddressesExcept(kube-ipvs0)`), keeping only addresses of the family that are not loopback and,
 * for IPv6, not link-local (upstream's `isValidForSet`).
 * @module
 */
import { type IPFamily, ipValue, isLoopback } from "../../net/ip.ts";

/** The dummy interface holding every service IP in ipvs mode. */
export const DUMMY_INTERFACE = "kube-ipvs0";

/** What one `ip -j addr show` says. */
export interface LocalAddresses {
  /** The dummy interface exists. */
  readonly dummyExists: boolean;
  /** Addresses on kube-ipvs0. */
  readonly dummy: Set<string>;
  /** Addresses on every other interface, in interface order. */
  readonly others: string[];
}

function validForSet(ip: string, family: IPFamily): boolean {
  const v = ipValue(ip);
  if (!v || v.family !== family || isLoopback(ip)) return false;
  // fe80::/10
  if (family === "IPv6" && (v.value >> 118n) === 0x3fan) return false;
  return true;
}

/** Parses `ip -j addr show` output for one family. */
export function parseLocalAddresses(json: string, family: IPFamily): LocalAddresses {
  const want = family === "IPv6" ? "inet6" : "inet";
  let links: unknown;
  try {
    links = JSON.parse(json);
  } catch {
    links = [];
  }
  const out: LocalAddresses = { dummyExists: false, dummy: new Set(), others: [] };
  if (!Array.isArray(links)) return out;
  let dummyExists = false;
  for (const link of links as { ifname?: string; addr_info?: { family?: string; local?: string }[] }[]) {
    const isDummy = link.ifname === DUMMY_INTERFACE;
    if (isDummy) dummyExists = true;
    for (const a of link.addr_info ?? []) {
      if (a.family !== want || typeof a.local !== "string" || !validForSet(a.local, family)) continue;
      if (isDummy) out.dummy.add(a.local);
      else if (!out.others.includes(a.local)) out.others.push(a.local);
    }
  }
  return { ...out, dummyExists };
}
