# moshi-rs serve as a container: the release binary on Debian 12, run as a non-root user, with a
# HEALTHCHECK on /api/health. See docs/serve.md, "Running in production" (what was and was not
# built on the project's machines).
#
#   docker build -t moshi-rs .
#   docker run -p 8998:8998 -v moshi-hf:/var/lib/moshi/hf moshi-rs \
#       --model kyutai/moshiko-mlx-q4 --max-sessions 2
#
# Arguments after the image name replace CMD's model arguments; ENTRYPOINT keeps `serve` on
# every interface with the client address taken from a proxy's X-Forwarded-For.

FROM rust:1-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends pkg-config libopus-dev libasound2-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p moshi-cli --bin moshi-rs

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends libopus0 libasound2 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/moshi --create-home moshi
COPY --from=build /src/target/release/moshi-rs /usr/local/bin/moshi-rs
USER 10001:10001
WORKDIR /var/lib/moshi
# Model downloads (Hugging Face cache) go to a volume: a new container does not fetch them again.
ENV HF_HOME=/var/lib/moshi/hf
VOLUME ["/var/lib/moshi/hf"]
EXPOSE 8998
# Alive once the server listens; the first start downloads and loads the model (minutes).
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8998/api/health || exit 1
# SIGTERM drains (docker stop: give it --time longer than --drain-timeout-s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["moshi-rs", "--log", "info", "serve", "--host", "0.0.0.0", "--port", "8998", "--trust-forwarded"]
CMD ["--model", "kyutai/moshiko-mlx-q4"]
