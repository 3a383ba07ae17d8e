# amfs-server: CPU image, non-root, MCP over stdio by default.
#   docker build -t amfs-server .
#   docker run -i --rm -v amfs-data:/data amfs-server                      # stdio (Claude Desktop, Cursor)
#   docker run --rm -p 8000:8000 -e AMFS_API_KEYS=... amfs-server serve --transport http --host 0.0.0.0
# Memories (SQLite) live in /data, trained ML models in /models: keep both on volumes.
# No HEALTHCHECK here: the default stdio server has no port to probe. docker-compose.yml checks GET /health.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    AMFS_DATA_DIR=/data \
    AMFS_ML_MODEL_DIR=/models \
    OMP_WAIT_POLICY=PASSIVE

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# The default image has no torch (ONNX embedder). Extras: docker build --build-arg EXTRAS=ml,lm -t amfs-server:lm .
# With lm, CPU-only torch goes in first, so the package install does not pull CUDA wheels.
ARG EXTRAS=""
RUN case ",$EXTRAS," in *,lm,*) pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu;; esac

WORKDIR /app
COPY . /app/src
RUN pip install "/app/src${EXTRAS:+[$EXTRAS]}" && rm -rf /app/src

RUN useradd --create-home --uid 10001 amfs && mkdir -p /data /models && chown amfs:amfs /data /models
USER amfs
VOLUME ["/data", "/models"]
EXPOSE 8000

ENTRYPOINT ["amfs-server"]
