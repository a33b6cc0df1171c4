# syntax=docker/dockerfile:1
# Sluice gateway image. Also carries `demo_upstream`, so docker-compose.yml runs the demo
# upstream from the same image. The release build is profile-guided (.cargo/config.toml,
# pgo/sluice.profdata).

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin sluice --example demo_upstream \
    && mkdir -p /out \
    && cp target/release/sluice target/release/examples/demo_upstream /out/

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin sluice
COPY --from=build /out/sluice /out/demo_upstream /usr/local/bin/
COPY config/ /etc/sluice/
ENV SLUICE_CONFIG=/etc/sluice/sluice.yaml
USER sluice
EXPOSE 8080 9090
ENTRYPOINT ["sluice"]
CMD ["run"]
