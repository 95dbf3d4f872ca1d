/**
 * The iptables rendering of local-traffic detection, shared with the ipvs mode: see
 * `lib/dataplane/iptables_local_detector.ts`.
 * @module
 */
export * from "../iptables_local_detector.ts";
