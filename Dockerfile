# The inferwatch sidecar: `inferwatch serve` (and the build subcommands) on Python 3.11.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY exporters ./exporters
COPY alert_rules ./alert_rules
COPY dashboards ./dashboards
COPY log_pipeline ./log_pipeline
COPY serving ./serving
# [report]: matplotlib, for the PNGs of `inferwatch showback` and serve.showback_schedule
RUN pip install '.[report]' && useradd --system --uid 10001 inferwatch && mkdir -p /var/lib/inferwatch/logs \
    && chown -R inferwatch /var/lib/inferwatch
USER inferwatch
EXPOSE 9100
ENTRYPOINT ["inferwatch"]
CMD ["serve", "--listen", "0.0.0.0:9100", "--upstream", "http://vllm:8000"]
