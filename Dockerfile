# The layby image: one image for every layby service of docker-compose.yml (gateway,
# workers, sweeper, Flower, reply listener), which differ only in their command. It holds
# no secret: keys and passwords come from the environment when a container starts.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LAYBY_DATA_DIR=/var/lib/layby
WORKDIR /app
# Every package in pyproject.toml's packages.find (tests/test_compose.py checks they agree).
COPY pyproject.toml README.md ./
COPY generation generation
COPY parking parking
COPY broker_config broker_config
COPY tasks tasks
COPY control control
COPY gateway gateway
COPY notifier notifier
COPY demo demo
COPY bench bench
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/layby --create-home layby
# Numeric, so a runtime that refuses to start root containers can tell.
USER 10001:10001
EXPOSE 8000
# No image-wide HEALTHCHECK: a worker or the sweeper has no port to ask. Each service of
# docker-compose.yml has a check of its own.
CMD ["layby", "gateway", "--host", "0.0.0.0"]
