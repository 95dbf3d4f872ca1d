/**
 * Pieces the fixed layout (`layout.ts`) and the per-port rules (`rules.ts`) are both written with: the family's
 * match keyword, the local-traffic matches, and rendered rules and elements as nftables objects.
 * @module
 */
import type { IPFamily } from "../../proxy/types.ts";
import type { LocalTraffic } from "../local_traffic.ts";
import { SET } from "./names.ts";
import type { Element, NftObject, Rule } from "./objects.ts";

/** `ip` / `ip6`: the table family and the address match keyword. */
export function nftFamily(family: IPFamily): "ip" | "ip6" {
  return family === "IPv6" ? "ip6" : "ip";
}

/** The nftables match for traffic from local pods (null when local traffic is not detected). */
export function ifLocal(lt: LocalTraffic, ipX: string): string | null {
  switch (lt.kind) {
    case "none":
      return null;
    case "cidr":
      return `${ipX} saddr ${lt.cidr}`;
    case "interface":
      return `iifname ${lt.name}`;
    case "interfacePrefix":
      return `iifname ${lt.prefix}*`;
  }
}

/** The nftables match for traffic that is not from local pods (null when local traffic is not detected). */
export function ifNotLocal(lt: LocalTraffic, ipX: string): string | null {
  switch (lt.kind) {
    case "none":
      return null;
    case "cidr":
      return `${ipX} saddr != ${lt.cidr}`;
    case "interface":
      return `iifname != ${lt.name}`;
    case "interfacePrefix":
      return `iifname != ${lt.prefix}*`;
  }
}

/** One operation of a transaction: a verb and the object it applies to. */
export type NftOp = ["add" | "flush" | "delete", NftObject];

/** The sets among the shared containers (the rest are verdict maps). */
const SETS: ReadonlySet<string> = new Set([SET.clusterIPs, SET.nodePortIPs, SET.hairpinConnections]);

/** A port's element as an nftables object. */
export function elementObject(
  container: string,
  key: string,
  value: string | null,
  comment: string | null,
): Element {
  return {
    kind: "element",
    ...(SETS.has(container) ? { set: container } : { map: container }),
    key: key.split(" . "),
    ...(value !== null ? { value: [value] } : {}),
    ...(comment !== null ? { comment } : {}),
  };
}

/** A rendered rule (`... comment "text"` at its end, as nft prints it) as an nftables object. */
export function ruleObject(chain: string, text: string): Rule {
  const m = text.match(/^(.*) comment "([^"]*)"$/);
  return m ? { kind: "rule", chain, rule: m[1], comment: m[2] } : { kind: "rule", chain, rule: text };
}
