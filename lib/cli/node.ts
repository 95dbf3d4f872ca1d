/**
 * The Node render and explain use: the manifests' Node named like the agent's node (`--hostname-override`, or
 * the machine's hostname, as the agent), or one built from `--node-ip` when there is none; `--node-ip`
 * replaces the addresses of a Node that has them too. The agent would wait for a Node without addresses (or,
 * in NodeCIDR mode, without pod CIDRs): render says so instead.
 * @module
 */
import type { Node } from "../kube/types.ts";
import { parseIP } from "../net/ip.ts";
import { nodeHostIPs } from "../proxy/node_manager.ts";

/** Raised when no usable Node can be found or built; the message says what to give. */
export class NodeInputError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "NodeInputError";
  }
}

/**
 * The Node for `nodeName` from `nodes`, with `nodeIPs` (may be empty) as its InternalIPs when given.
 * @throws {NodeInputError} When there is no usable Node.
 */
export function resolveNode(
  nodeName: string,
  nodes: readonly Node[],
  nodeIPs: readonly string[],
  needsPodCIDRs: boolean,
): Node {
  for (const ip of nodeIPs) {
    if (!parseIP(ip)) throw new NodeInputError(`--node-ip: "${ip}" is not an IP address`);
  }
  const found = nodes.find((n) => n.metadata?.name === nodeName);
  let node: Node;
  if (nodeIPs.length > 0) {
    const base: Node = found ?? {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: nodeName, labels: { "kubernetes.io/hostname": nodeName } },
    };
    node = {
      ...base,
      status: {
        ...base.status,
        addresses: [
          ...nodeIPs.map((address) => ({ type: "InternalIP", address: parseIP(address)!.ip })),
          { type: "Hostname", address: nodeName },
        ],
      },
    };
  } else if (found) {
    node = found;
  } else {
    const others = nodes.map((n) => n.metadata?.name).filter((n) => n);
    throw new NodeInputError(
      `no Node named "${nodeName}" among the manifests${
        others.length > 0 ? ` (there is ${others.map((n) => `"${n}"`).join(", ")})` : ""
      }: give its manifest, or --node-ip (and --hostname-override to name the node)`,
    );
  }
  if (nodeHostIPs(node).length === 0) {
    throw new NodeInputError(
      `Node "${nodeName}" has no InternalIP or ExternalIP address (the agent would wait for one): give --node-ip`,
    );
  }
  if (needsPodCIDRs && (node.spec?.podCIDRs?.length ?? 0) === 0) {
    throw new NodeInputError(
      `Node "${nodeName}" has no spec.podCIDRs, which --detect-local-mode=NodeCIDR needs (the agent would wait ` +
        `for them): give a Node manifest with spec.podCIDRs`,
    );
  }
  return node;
}
