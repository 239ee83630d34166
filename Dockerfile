# The layby app image: one image for the gateway, workers and the sweeper.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LAYBY_DATA_DIR=/var/lib/layby
WORKDIR /app
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
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/layby layby \
    && mkdir -p /var/lib/layby && chown layby /var/lib/layby
USER layby
EXPOSE 8000
CMD ["layby", "gateway", "--host", "0.0.0.0", "--port", "8000"]
