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
