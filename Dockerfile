# syntax=docker/dockerfile:1
# GPU image: Triton Inference Server with the TensorRT-LLM backend, plus the Cog HTTP server.
# The tag and TensorRT-LLM version are pinned in tensorrtllm_backend/pins.py, the one place that
# this Dockerfile (checked below at build time and by tests/test_packaging.py), scripts/build_engine
# and setup()'s manifest verification read: 26.02-trtllm-python-py3 ships TensorRT-LLM 1.1.0, and
# engines must be built with that version (build them in this image: scripts/build_engine).
FROM nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    COG_PREDICT_TYPE_STUB=predict.py:Predictor \
    COG_TRAIN_TYPE_STUB=train.py:train \
    COG_MAX_CONCURRENCY=8 \
    COG_TRITON_MAX_CONCURRENCY=8 \
    PORT=5000

WORKDIR /src

COPY requirements.txt /src/requirements.txt
RUN python3 -m pip install --no-cache-dir -r /src/requirements.txt

COPY tensorrtllm_backend/pins.py /src/tensorrtllm_backend/pins.py
# Fail the build if the base image's TensorRT-LLM is not the pinned one.
RUN python3 -m tensorrtllm_backend.pins

COPY predict.py train.py cog.yaml /src/
COPY common /src/common
COPY cog_triton /src/cog_triton
COPY tensorrtllm_backend /src/tensorrtllm_backend
COPY configs /src/configs
COPY triton_model_repo /src/triton_model_repo
COPY scripts /src/scripts

EXPOSE 5000
CMD ["python3", "-m", "cog.server.http"]
