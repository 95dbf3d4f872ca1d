/**
 * The nft backend's scale warning: iptables-nft-restore cannot load a large rule set in useful time, so a
 * dataplane on that backend says so once, before its first full sync that large.
 * @module
 */

import type { Logger } from "../../log.ts";
import type { IptablesTools } from "../iptables_backend.ts";

/**
 * Service ports above which a full sync on the nft backend is slow enough to warn about (about 1,000 Services
 * took 10 s of wall time there, 2,000 over a minute; docs/benchmarks.md, "iptables on the nft backend").
 */
export const NFT_BACKEND_SERVICE_PORTS_WARNING = 1000;

/** Logs the nft backend's scale warning at most once (one per dataplane). */
export class NftBackendScaleWarning {
  /** The warning was logged. */
  #warned = false;

  constructor(private readonly tools: IptablesTools, private readonly log: Logger) {}

  /**
   * On the nft backend, says once (before the first full sync that large) that iptables-nft-restore cannot load
   * a large rule set in useful time: its own name lookups grow faster than the square of the payload (7 s of
   * CPU at 1,000 Services x 10 endpoints, 51 s at 2,000; docs/benchmarks.md), for upstream alike.
   */
  check(servicePorts: number): void {
    if (this.#warned || this.tools.backend !== "nft") return;
    if (servicePorts <= NFT_BACKEND_SERVICE_PORTS_WARNING) return;
    this.#warned = true;
    this.log.warn(
      "iptables on the nft backend does not scale to this many service ports: iptables-nft-restore may take " +
        "minutes to hours for a full sync; use --proxy-mode=nftables, or the legacy backend " +
        "(docs/operations.md, Resources)",
      { servicePorts, limit: NFT_BACKEND_SERVICE_PORTS_WARNING, restore: this.tools.restore },
    );
  }
}
