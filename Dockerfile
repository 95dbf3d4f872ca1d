# deno-kube-proxy as one `deno compile` binary on a slim base with the netfilter tools it spawns.
# Build where the network allows downloading Deno's `denort` base binary (or pass DENORT_BIN):
#   docker build -t deno-kube-proxy .
# The permission flags are the `compile` task's in deno.json (the same set as the `start` task). A kubeconfig
# with an exec credential plugin needs it granted: --build-arg DKP_EXTRA_PERMISSIONS=--allow-run=/path/plugin
FROM debian:bookworm-slim AS build
ARG DKP_EXTRA_PERMISSIONS=""
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates nodejs npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN deno_bin=$(bash scripts/install.sh | tail -n 1) \
    && PATH="$(dirname "$deno_bin"):$PATH" deno task compile

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
      iptables nftables ipset conntrack ipvsadm iproute2 procps util-linux kmod \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/dist/kube-proxy /usr/local/bin/kube-proxy
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
