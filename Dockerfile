# syntax=docker/dockerfile:1
# Headroom agent image: one static binary, nothing else.
#   docker build -t headroom-agent:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/headroom-agent:0.1.0 .
# Without Docker, scripts/build-image.sh assembles the same final stage with
# umoci, for both architectures, as one OCI image index; tests/tests/image.rs
# checks the two agree (user, ports, entrypoint, labels, one file).
# The builder runs scripts/static-build.sh, the same script CI runs outside
# Docker, on the build machine's own platform: arm64 is cross-compiled (Debian's
# aarch64 toolchain), not emulated.

FROM --platform=$BUILDPLATFORM rust:1.95-bookworm AS build
ARG TARGETARCH
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools file binutils \
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    scripts/static-build.sh --arch "${TARGETARCH:-amd64}" --out /out/headroom-agent

# No shell, no libc, no CA bundle: in-cluster the agent trusts the ServiceAccount CA.
FROM scratch
LABEL org.opencontainers.image.title="headroom-agent" \
      org.opencontainers.image.description="Headroom: node-level CPU limit right-sizer for Kubernetes" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/headroom-agent /headroom-agent
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/headroom-agent"]
CMD ["run"]
