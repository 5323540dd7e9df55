# The live dashboard's bundle (dashboard/: urql and graphql-ws from npm, esbuild).
FROM node:20-bookworm-slim AS dashboard
WORKDIR /dashboard
COPY dashboard/package.json dashboard/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY dashboard/index.html ./
COPY dashboard/src src
RUN npm run build

# One image for the engine and the gateway (compose.yaml picks the command).
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schema schema
COPY engine engine
COPY gateway gateway
COPY viewgate viewgate
RUN pip install --no-cache-dir .
# Resolve the Spark connector jars at build time, so containers never fetch at run time.
ENV VIEWGATE_CACHE_DIR=/opt/viewgate
RUN python -c "from viewgate.stack import jars; from pathlib import Path; jars.resolve(Path('/opt/viewgate/jars'), 'spark')"
COPY --from=dashboard /dashboard/index.html /app/dashboard/index.html
COPY --from=dashboard /dashboard/dist /app/dashboard/dist
ENV VIEWGATE_GATEWAY_DASHBOARD_DIR=/app/dashboard
