# The layby image: one image for every layby service of docker-compose.yml (gateway,
# workers, sweeper, Flower, reply listener), which differ only in their command. It holds
# no secret: keys and passwords come from the environment when a container starts.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LAYBY_DATA_DIR=/var/lib/layby
# Built from /src, which is removed after: the services run in /app, where no `layby` source
# folder can shadow the installed package.
WORKDIR /src
# The one package, `layby`, from its four folders (pyproject.toml's package-dir; tests/
# test_compose.py checks they agree).
COPY pyproject.toml README.md ./
COPY layby layby
COPY tasks tasks
COPY broker_config broker_config
COPY notifier notifier
RUN pip install --no-cache-dir /src \
    && rm -rf /src \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/layby --create-home layby
WORKDIR /app
# Numeric, so a runtime that refuses to start root containers can tell.
USER 10001:10001
EXPOSE 8000
# No image-wide HEALTHCHECK: a worker or the sweeper has no port to ask. Each service of
# docker-compose.yml has a check of its own.
CMD ["layby", "gateway", "--host", "0.0.0.0"]
