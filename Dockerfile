# syntax=docker/dockerfile:1
# Kinference gateway image: `kinference` (and `kinfctl`) built in a Rust image, run on distroless
# as the nonroot user (uid 65532). Build from the repository root:
#   docker build -t ghcr.io/kinference/kinference:dev .
# No system protoc is needed (protos are compiled with the pure-Rust protox in build.rs).

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# Sources only; target/ and other build outputs are excluded by .dockerignore.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kinf-handler --bin kinference \
    && cargo build --release --locked -p kinfctl --bin kinfctl \
    && mkdir -p /out \
    && cp target/release/kinference target/release/kinfctl /out/

# glibc + libgcc + CA certificates (provider HTTPS uses webpki roots; the Kubernetes client
# uses the service-account CA), no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/kinference /usr/local/bin/kinference
COPY --from=builder /out/kinfctl /usr/local/bin/kinfctl
USER 65532:65532
EXPOSE 8080 9090 9091
ENTRYPOINT ["/usr/local/bin/kinference"]
CMD ["serve", "--kubernetes", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9090"]
