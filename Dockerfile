# Builds the images deploy/kubernetes uses: csi-provisioner, csi-attacher and volstack.
#   docker build --target csi-provisioner -t volstack/csi-provisioner .
#   docker build --target csi-attacher -t volstack/csi-attacher .
#   docker build --target volstack -t volstack/volstack .
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin csi-provisioner --bin csi-attacher --bin volstack

FROM debian:bookworm-slim AS csi-provisioner
COPY --from=build /src/target/release/csi-provisioner /csi-provisioner
ENTRYPOINT ["/csi-provisioner"]

FROM debian:bookworm-slim AS csi-attacher
COPY --from=build /src/target/release/csi-attacher /csi-attacher
ENTRYPOINT ["/csi-attacher"]

FROM debian:bookworm-slim AS volstack
COPY --from=build /src/target/release/volstack /volstack
ENTRYPOINT ["/volstack"]
