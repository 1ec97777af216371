# syntax=docker/dockerfile:1
# The watermarkd image: `docker build -t watermarkd:latest .` (deploy/deployment.yaml runs
# watermarkd:latest). The binary is built in the first stage and copied alone into a
# distroless image with glibc and no shell, running as the unprivileged user 65532.

FROM rust:1-bookworm AS builder
WORKDIR /src
# Only what the build reads (.dockerignore keeps the rest out of the context). The whole
# crates/ directory, because Cargo loads every workspace member's manifest and targets, and
# benches/, because the root manifest declares the scale harness (it is not built here).
COPY Cargo.toml Cargo.lock ./
COPY crates/ crates/
COPY benches/ benches/
COPY src/ src/
# The caches speed up rebuilds; the binary is copied out of the cached target directory in the
# same step, since the cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin watermarkd \
    && install -D -m 0755 target/release/watermarkd /out/watermarkd

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/watermarkd /usr/bin/watermarkd
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/bin/watermarkd"]
CMD ["run", "--settings", "/etc/watermarkd/watermarkd.toml"]
