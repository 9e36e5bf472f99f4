# thinktrans: CPU image. Build: docker build -t thinktrans .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY models ./models
COPY .ci/constraints.txt ./constraints.txt
RUN pip install --no-cache-dir --prefix=/install \
      --extra-index-url https://download.pytorch.org/whl/cpu \
      ".[local,deepl]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 thinktrans
COPY --from=build /install /usr/local
ENV HF_HOME=/models THINKTRANS_HOST=0.0.0.0 THINKTRANS_PORT=8088 PYTHONUNBUFFERED=1
RUN mkdir -p /models && chown thinktrans /models
VOLUME /models
USER thinktrans
EXPOSE 8088
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s \
  CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8088/healthz', timeout=2)" || exit 1
CMD ["thinktrans", "serve"]
