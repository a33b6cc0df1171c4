# syntax=docker/dockerfile:1
# Sluice gateway image. Also carries `demo_upstream`, so docker-compose.yml runs the demo
# upstream from the same image. The release build is profile-guided (.cargo/config.toml,
# pgo/sluice.profdata). The toolchain is the one the profile was made with (pgo/sluice.meta):
# the toolchain is in every symbol's name, and LLVM matches the profile to functions by name,
# so another would build sluice without it. scripts/build_release.sh --strict fails the build
# when the profile does not apply.

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    scripts/build_release.sh --strict --locked \
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
