"""Image requests to the PyTorch-backend ``tensorrt_llm`` model in a real Triton: the repository rendered by the
product's renderer for the tiny Gemma 3 checkpoint (tests/vlm_checkpoint.py) with images on, and the predictor's
gRPC client (cog_triton/streaming/client.py) sending an image request straight to ``tensorrt_llm`` while text
requests still go through the ensemble. TensorRT-LLM runs as its LLM API stand-in (the one mock,
benchmarks/llmapi_standin), found by Triton's stub through the overlay virtualenv (tests/llmapi_overlay.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from PIL import Image

from cog_triton.streaming.client import CountedChunk, GenerateChunk, GenerateRequest, TritonClient
from tests.llmapi_overlay import render_pytorch_repository
from tests.proc import stop_at_once
from tests.test_pytorch_integration import _triton
from tests.vlm_checkpoint import TOKENS_PER_IMAGE, VlmReference, build_vlm_checkpoint, solid_png

pytestmark = pytest.mark.integration

EOS = 2
MAX_SEQ_LEN = 2048
RED, BLUE = (220, 30, 30), (30, 30, 220)


@pytest.fixture(scope="module")
def served(tmp_path_factory, checkpoint_dir):
    tmp = tmp_path_factory.mktemp("pytorch_images")
    vlm = build_vlm_checkpoint(tmp / "gemma3-tiny", checkpoint_dir)
    # max_seq_len: the checkpoint's max_position_embeddings, so that a stopped request has room to run long
    render_pytorch_repository(tmp / "repo", vlm, llm_args={"model": str(vlm), "max_batch_size": 4,
                                                             "max_seq_len": MAX_SEQ_LEN}, images=True)
    server = _triton(tmp, tmp / "repo")
    server.start()
    try:
        server.wait_ready(240)
        yield {"server": server, "reference": VlmReference(vlm), "tmp": tmp}
    finally:
        stop_at_once(server)


def collect(server, request: GenerateRequest) -> list[GenerateChunk]:
    async def main() -> list[GenerateChunk]:
        client = TritonClient(server.grpc_address)
        try:
            return [chunk async for chunk in client.generate_stream(request)]
        finally:
            await client.aclose()

    return asyncio.run(main())


def image_request(prompt: str, images: list[bytes], max_tokens: int = 8, request_id: str = "") -> GenerateRequest:
    return GenerateRequest(input_ids=[], max_tokens=max_tokens, top_k=1, text_input=prompt, image_bytes=tuple(images),
                           end_id=EOS, request_id=request_id)


def test_an_image_request_streams_transformers_output_for_those_pixels(served) -> None:
    reference = served["reference"]
    prompt = reference.prompt("What color is it?", 1)
    outputs = {}
    for name, color in (("red", RED), ("blue", BLUE)):
        chunks = collect(served["server"], image_request(prompt, [solid_png(color)]))
        outputs[name] = [t for c in chunks for t in c.output_ids]
        _, expected, prompt_len = reference.generate(prompt, [Image.new("RGB", (48, 40), color)], 8)
        assert outputs[name] == expected
        counted = [c for c in chunks if isinstance(c, CountedChunk)]
        assert counted and all((c.prompt_tokens, c.image_tokens) == (prompt_len, TOKENS_PER_IMAGE) for c in counted)
    assert outputs["red"] != outputs["blue"]


def test_text_requests_still_go_through_the_ensemble_beside_image_requests(served) -> None:
    reference = served["reference"]
    ids = reference.tokenizer(reference.prompt("Hi there", 0), add_special_tokens=False)["input_ids"]
    chunks = collect(served["server"], GenerateRequest(input_ids=ids, max_tokens=5, top_k=1))
    assert all(type(c) is GenerateChunk for c in chunks)
    expected = reference.generate(reference.prompt("Hi there", 0), [], 5)[1]
    assert [t for c in chunks for t in c.output_ids] == expected


def test_an_image_request_is_stopped_by_its_id(served) -> None:
    """The predictor stops a request by sending tensorrt_llm a stop request with its id; an image request, sent
    to tensorrt_llm directly, ends the same way, long before its token limit (all the tokens the model has room
    for: the stand-in runs the tiny model as fast as the CPU allows, and a loaded machine's client reads late, so
    the stop must arrive before the model made them all: 400 tokens were once not enough with the tests running
    two at a time beside other servers)."""
    reference = served["reference"]
    prompt = reference.prompt("Tell me a long story.", 1)
    limit = MAX_SEQ_LEN - 64  # the prompt is about 30 tokens

    async def main() -> tuple[int, float]:
        client = TritonClient(served["server"].grpc_address)
        started = time.monotonic()
        count = 0
        stopped = False
        try:
            async for chunk in client.generate_stream(image_request(prompt, [solid_png(RED)], limit, "img-stop")):
                count += len(chunk.output_ids)
                if count >= 3 and not stopped:
                    await client.send_stop_request("img-stop")
                    stopped = True
            return count, time.monotonic() - started
        finally:
            await client.aclose()

    count, _ = asyncio.run(main())
    assert 3 <= count < limit


def test_a_refused_image_request_gets_the_models_message(served) -> None:
    """Token ids and text together: the model refuses, and the client reports its text."""
    from common.errors import InferenceError

    request = GenerateRequest(input_ids=[], max_tokens=2, top_k=1, text_input="x", image_bytes=(b"not an image",),
                              end_id=EOS)
    with pytest.raises(InferenceError, match=r"image_bytes\[0\] could not be decoded"):
        collect(served["server"], request)
