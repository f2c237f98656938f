# syntax=docker/dockerfile:1
# GPU image: Triton Inference Server with the TensorRT-LLM backend, plus the Cog HTTP server.
# The tag and TensorRT-LLM version are pinned in tensorrtllm_backend/pins.py, the one place that
# this Dockerfile (checked below at build time and by tests/test_packaging.py), scripts/build_engine
# and setup()'s manifest verification read: 26.07-trtllm-python-py3 ships Triton 2.71.0 and TensorRT-LLM
# 1.2.1, and engines must be built with that version (build them in this image: scripts/build_engine).
FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    COG_PREDICT_TYPE_STUB=predict.py:Predictor \
    COG_TRAIN_TYPE_STUB=train.py:train \
    COG_MAX_CONCURRENCY=64 \
    COG_TRITON_MAX_CONCURRENCY=64 \
    PORT=5000

WORKDIR /src

# An init as PID 1, as in every image `cog build` generates (replicate/cog pkg/dockerfile/standard_generator.go,
# installTini; replicate/cog-triton's Dockerfile does the same): `cog build` labels every image, ours too,
# run.cog.has_init=true (pkg/image/build.go), so Replicate adds none. Without it coglet is PID 1 (NGC's
# /opt/nvidia/nvidia_entrypoint.sh ends in `exec "$@"`) and never reaps the processes a killed Triton
# leaves to it. tini comes from the distribution (Ubuntu universe, Debian main), checked where it is put.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-* \
    && rm -rf /var/lib/apt/lists/* \
    && /usr/bin/tini --version

# coglet starts its worker as `python` from PATH (replicate/cog crates/coglet/src/orchestrator.rs,
# SimpleSpawner) and `cog build` runs `python -m pip freeze` in the image. TensorRT-LLM 1.2's backend image
# puts its packages in a virtual environment first on PATH, whose bin has `python` (tensorrtllm_backend
# dockerfile/Dockerfile.triton.trt_llm_backend @ r26.07: /opt/venv-tritonserver); then no link is made, since
# a link to that python3 from outside the venv would not see the venv's packages (Python looks for
# pyvenv.cfg beside the link, not its target). An image with only python3 (26.02's layout) gets the link.
# Checked at once; `python -m tensorrtllm_backend.pins` below fails when that `python` lacks tensorrt_llm.
RUN command -v python >/dev/null || ln -sf "$(command -v python3)" /usr/local/bin/python; \
    python -c "import sys; print(sys.executable, sys.version)"

COPY requirements.txt /src/requirements.txt
RUN python -m pip install --no-cache-dir -r /src/requirements.txt && python -c "import coglet, cog"

COPY tensorrtllm_backend/pins.py /src/tensorrtllm_backend/pins.py
# Fail the build if the base image's TensorRT-LLM (or its TRITON_SERVER_VERSION) is not the pinned one.
RUN python -m tensorrtllm_backend.pins

COPY predict.py train.py cog.yaml /src/
# The Cog schema generated from predict.py and train.py (cog_triton/worker/schema.py): coglet reads it from
# .cog/ under the working directory to validate inputs and stream over SSE. `cog build` adds the
# same file again; a plain `docker build` gets it from here. (cog build keeps .cog/ out of the
# build context, so the committed copy lives in cog_triton/.)
COPY cog_triton/openapi_schema.json /src/.cog/openapi_schema.json
COPY common /src/common
COPY cog_triton /src/cog_triton
COPY tensorrtllm_backend /src/tensorrtllm_backend
COPY configs /src/configs
COPY triton_model_repo /src/triton_model_repo
COPY scripts /src/scripts

EXPOSE 5000
# tini in front of NGC's own entrypoint (its banner and driver checks run as before, then exec the CMD).
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/nvidia/nvidia_entrypoint.sh"]
CMD ["python", "-m", "cog.server.http"]
