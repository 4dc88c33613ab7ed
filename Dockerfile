# memproxy: OpenAI-compatible memory proxy, run as a sidecar.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install . && useradd --create-home --uid 10001 memproxy && mkdir /data && chown memproxy /data

USER memproxy
# Config from a mounted file (MEMPROXY_CONFIG) or from MEMPROXY_<SECTION>_<KEY> variables.
ENV MEMPROXY_SERVER_HOST=0.0.0.0 \
    MEMPROXY_SERVER_PORT=8080 \
    MEMPROXY_STORE_URL=sqlite:////data/memproxy.db
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2); sys.exit(0)"
ENTRYPOINT ["memproxy", "serve"]
