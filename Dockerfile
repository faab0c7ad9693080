# hyperplace service image: slim, non-root, migrates then serves.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HYPERPLACE_HOST=0.0.0.0 \
    HYPERPLACE_PORT=8000 \
    HYPERPLACE_ALEMBIC_INI=/app/alembic.ini

WORKDIR /app
RUN groupadd --system --gid 10001 hyperplace \
    && useradd --system --uid 10001 --gid hyperplace --home-dir /app --no-create-home hyperplace

COPY pyproject.toml README.md alembic.ini ./
COPY partitioners ./partitioners
COPY service ./service
COPY migrations ./migrations
RUN pip install --no-cache-dir .

USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"]
# `migrate` holds a PostgreSQL advisory lock, so replicas starting together do not race.
CMD ["sh", "-c", "hyperplace migrate && exec hyperplace serve"]
