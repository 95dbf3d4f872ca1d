/**
 * Kernel rule listings made comparable: `nft list table` and `iptables-save` output reduced to what the rules
 * are, independent of the order objects were created in and of packet counters. Used wherever two rule sets
 * must be compared through the kernel (the nftables golden test, render against the agent).
 * @module
 */

/**
 * A listing made independent of creation order: one entry per table object (set, map, chain) sorted by kind
 * and name, and the elements of a set or map sorted. The order of a chain's rules stays: it matters.
 */
export function canonicalListing(listing: string): string[] {
  const objects: string[] = [];
  let cur: string[] | null = null;
  let elements: string[] | null = null;
  for (const raw of listing.split("\n")) {
    const line = raw.trim();
    if (/^(set|map|chain) \S+ \{$/.test(line)) {
      cur = [line];
      continue;
    }
    if (cur === null) continue;
    if (elements !== null) {
      elements.push(...line.replace(/\s*}$/, "").split(/,\s*/).filter((e) => e !== ""));
      if (line.endsWith("}")) {
        cur.push(`elements = { ${elements.sort().join(", ")} }`);
        elements = null;
      }
      continue;
    }
    if (line.startsWith("elements = {")) {
      elements = [];
      const rest = line.slice("elements = {".length);
      elements.push(...rest.replace(/\s*}$/, "").split(/,\s*/).map((e) => e.trim()).filter((e) => e !== ""));
      if (rest.trim().endsWith("}")) {
        cur.push(`elements = { ${elements.sort().join(", ")} }`);
        elements = null;
      }
      continue;
    }
    if (line === "}") {
      objects.push(cur.join("\n"));
      cur = null;
      continue;
    }
    cur.push(line);
  }
  return objects.sort();
}

/**
 * An `iptables-save` dump made comparable: one entry per table and chain (`*nat :KUBE-SERVICES`), with the
 * chain's policy (built-in chains) and its rules in order; counters (`[p:b]`, `-c p b`), comments and COMMIT
 * lines removed; entries sorted by table and chain. Chains without rules and without a policy still count (a
 * declared chain is part of the rules). The order of a chain's rules stays: it matters.
 */
export function canonicalIptablesSave(save: string): string[] {
  const chains = new Map<string, string[]>();
  let table = "";
  for (const raw of save.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#") || line === "COMMIT") continue;
    if (line.startsWith("*")) {
      table = line;
      continue;
    }
    if (line.startsWith(":")) {
      const [name, policy] = line.slice(1).split(/\s+/);
      chains.set(`${table} :${name}`, policy === "-" ? [] : [`policy ${policy}`]);
      continue;
    }
    const m = line.match(/^(?:-c \d+ \d+ )?-A (\S+)(.*)$/);
    if (!m) continue;
    const key = `${table} :${m[1]}`;
    if (!chains.has(key)) chains.set(key, []);
    chains.get(key)!.push(`-A ${m[1]}${m[2].replace(/ -c \d+ \d+/, "")}`);
  }
  return [...chains].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, rules]) =>
    [k, ...rules].join("\n")
  );
}
