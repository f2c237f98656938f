"""The PyTorch-backend ``tensorrt_llm`` model's image requests (triton_model_repo/tensorrt_llm_pytorch/1/model.py and
translate.py), driven outside Triton as tests/test_pytorch_model.py drives it: a recording pb_utils
(tests/fake_pb_utils.py, because Triton cannot be driven thread by thread) over the LLM API stand-in (TensorRT-LLM
cannot be installed here), on the tiny Gemma 3 checkpoint (tests/vlm_checkpoint.py).

What is observed: the LLM gets the text prompt with the decoded images as 1.2.1 takes them, the images are decoded
off the event loop, the output is transformers' own for those pixels, every response of an image request carries the
prompt's and the images' token counts, a text request's responses do not, and each misuse is refused with a message.
"""

from __future__ import annotations

import importlib
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.fake_pb_utils import FakeRequest
from tests.llmapi_overlay import standin_imported
from tests.vlm_checkpoint import TOKENS_PER_IMAGE, VlmReference, build_vlm_checkpoint, solid_png

EOS = 2
RED, BLUE = (220, 30, 30), (30, 30, 220)


@pytest.fixture(scope="module")
def trtllm():
    with standin_imported() as module:
        yield module


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory, checkpoint_dir) -> Path:
    return build_vlm_checkpoint(tmp_path_factory.mktemp("vlm") / "gemma3-tiny", checkpoint_dir)


@pytest.fixture(scope="module")
def reference(vlm_dir) -> VlmReference:
    return VlmReference(vlm_dir)


@pytest.fixture(scope="module")
def model_module(pytorch_model_module, trtllm):
    """The PyTorch-backend model.py (conftest's ``pytorch_model_module``: one per process); each instance here is
    given the tiny vision-language checkpoint's LLM arguments (:func:`make`)."""
    return pytorch_model_module


def make(model_module, vlm_dir, images: bool = True):
    instance = model_module.TritonPythonModel()
    instance.load_llm_args = lambda params: {"model": str(vlm_dir), "max_batch_size": 4, "max_seq_len": 512}
    params = {"exclude_input_in_output": {"string_value": "true"}, "images": {"string_value": str(images).lower()}}
    instance.initialize({"model_config": json.dumps({"model_transaction_policy": {"decoupled": True},
                                                     "parameters": params})})
    return instance


@pytest.fixture(scope="module")
def model(model_module, vlm_dir):
    instance = make(model_module, vlm_dir)
    yield instance
    instance.finalize()


def image_request(text: str, images: list[bytes], n: int = 8, **extra) -> FakeRequest:
    tensors = {"text_input": text, "image_bytes": images, "input_lengths": [0], "request_output_len": [n],
               "runtime_top_k": [1], "end_id": [EOS], "streaming": [True]}
    tensors.update(extra)
    return FakeRequest(**tensors)


def run(model, request, timeout=60):
    model.execute([request])
    assert request.sender.final.wait(timeout), "no final response"
    return request.sender


def test_an_image_request_reaches_the_llm_as_a_text_prompt_with_decoded_images(model, reference, monkeypatch):
    calls = []
    original = model.llm.generate_async

    def record(inputs, **kwargs):
        calls.append((inputs, threading.current_thread().name))
        return original(inputs, **kwargs)

    monkeypatch.setattr(model.llm, "generate_async", record)
    prompt = reference.prompt("What color is it?", 1)
    sender = run(model, image_request(prompt, [solid_png(RED)]))
    assert sender.errors() == []
    ((inputs, thread),) = calls
    assert set(inputs) == {"prompt", "multi_modal_data"} and inputs["prompt"] == prompt
    (picture,) = inputs["multi_modal_data"]["image"]
    assert isinstance(picture, Image.Image) and picture.mode == "RGB" and picture.size == (48, 40)
    assert thread == "trtllm-pytorch-event-loop"
    picture_rgb = Image.new("RGB", (48, 40), RED)
    assert sender.tokens() == reference.generate(prompt, [picture_rgb], 8)[1]


def test_the_images_are_decoded_off_the_event_loop(model, model_module, reference, monkeypatch):
    threads = []
    original = model_module.decode_images

    def decode(blobs):
        threads.append(threading.current_thread().name)
        return original(blobs)

    monkeypatch.setattr(model_module, "decode_images", decode)
    run(model, image_request(reference.prompt("Hi", 1), [solid_png(BLUE)], n=1))
    assert threads and threads[0] != "trtllm-pytorch-event-loop"


def test_different_images_give_different_outputs(model, reference):
    prompt = reference.prompt("What color is it?", 1)
    red = run(model, image_request(prompt, [solid_png(RED)])).tokens()
    blue = run(model, image_request(prompt, [solid_png(BLUE)])).tokens()
    assert red != blue


def test_each_response_of_an_image_request_carries_the_token_counts(model, reference):
    prompt = reference.prompt("What color is it?", 2)
    sender = run(model, image_request(prompt, [solid_png(RED), solid_png(BLUE)], n=4))
    expected = reference.generate(prompt, [Image.new("RGB", (48, 40), RED), Image.new("RGB", (48, 40), BLUE)], 4)[2]
    responses = [r for r, _, _ in sender.sent if r is not None and r.error is None]
    assert responses
    for response in responses:
        assert int(response.tensor("prompt_tokens").reshape(-1)[0]) == expected
        assert int(response.tensor("image_tokens").reshape(-1)[0]) == 2 * TOKENS_PER_IMAGE


def test_a_text_request_carries_no_counts(model, reference):
    ids = reference.tokenizer(reference.prompt("Hi", 0), add_special_tokens=False)["input_ids"]
    sender = run(model, FakeRequest(input_ids=ids, input_lengths=[len(ids)], request_output_len=[3],
                                    runtime_top_k=[1], end_id=[EOS], streaming=[True]))
    assert sender.errors() == [] and sender.tokens()
    for response, _, _ in sender.sent:
        assert response.tensor("prompt_tokens") is None and response.tensor("image_tokens") is None


def test_a_non_streaming_image_request_returns_the_llms_prompt_ids(model, reference):
    """exclude_input_in_output false: the prompt is the ids the LLM's input processor made (the images' expanded)."""
    prompt = reference.prompt("What color is it?", 1)
    sender = run(model, image_request(prompt, [solid_png(RED)], n=3, streaming=[False],
                                      exclude_input_in_output=[False]))
    batch = reference.processor(text=prompt, images=[Image.new("RGB", (48, 40), RED)], return_tensors="pt")
    expanded = batch["input_ids"][0].tolist()
    tokens = sender.tokens()
    assert tokens[: len(expanded)] == expanded and len(tokens) == len(expanded) + 3


@pytest.mark.parametrize("tensors, phrase", [
    ({"image_bytes": [b"x"]}, "image_bytes was given without text_input"),
    ({"text_input": "hi"}, "text_input is taken with image_bytes only"),
    ({"text_input": "hi", "image_bytes": [b"x"], "input_ids": [1, 2]}, "not input_ids: send one of them"),
])
def test_misused_image_inputs_are_refused(model, tensors, phrase):
    body = {"input_lengths": [0], "request_output_len": [2], "end_id": [EOS], **tensors}
    sender = run(model, FakeRequest(**body))
    (error,) = sender.errors()
    assert phrase in error


def test_an_image_that_does_not_decode_fails_its_request(model, reference):
    png = solid_png(RED)
    sender = run(model, image_request(reference.prompt("Hi", 1), [png[: len(png) // 2]]))
    (error,) = sender.errors()
    assert error.startswith("image_bytes[0] could not be decoded")


def test_a_model_without_images_refuses_them(model_module, vlm_dir, reference, monkeypatch):
    off = make(model_module, vlm_dir, images=False)
    try:
        calls = []
        monkeypatch.setattr(off.llm, "generate_async", lambda *a, **k: calls.append(a))
        sender = run(off, image_request(reference.prompt("Hi", 1), [solid_png(RED)]))
        (error,) = sender.errors()
        assert "1 image(s) were given, but this model serves none: its parameter images is false" in error
        assert calls == []
    finally:
        off.finalize()


def test_images_need_the_checkpoints_image_token(model_module, checkpoint_dir):
    instance = model_module.TritonPythonModel()
    instance.load_llm_args = lambda params: {"model": str(checkpoint_dir), "max_batch_size": 2}
    params = {"images": {"string_value": "true"}}
    with pytest.raises(ValueError, match="names no image token"):
        instance.initialize({"model_config": json.dumps({"model_transaction_policy": {"decoupled": True},
                                                         "parameters": params})})


# ------------------------------------------------------------------------------------------------ decode_images
def _translate(model_module):
    return importlib.import_module(f"{model_module.__name__}.translate")  # the module beside model.py


def test_decoding_gives_rgb_with_alpha_over_white(model_module):
    buffer = io.BytesIO()
    rgba = Image.new("RGBA", (4, 2), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    rgba.save(buffer, format="PNG")
    (picture,) = _translate(model_module).decode_images([buffer.getvalue()])
    assert picture.mode == "RGB"
    assert picture.getpixel((0, 0)) == (0, 0, 255) and picture.getpixel((1, 0)) == (255, 255, 255)


def test_decoding_applies_the_exif_orientation(model_module):
    """A photo stored sideways with EXIF Orientation 6 (rotate 90 degrees clockwise to view) is given upright."""
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20), (0, 200, 0)).save(buffer, format="JPEG", exif=exif.tobytes())
    (picture,) = _translate(model_module).decode_images([buffer.getvalue()])
    assert picture.size == (20, 40)


def test_decoding_takes_only_the_allowed_formats(model_module):
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="TIFF")
    with pytest.raises(model_module.RequestError, match=r"image_bytes\[0\] could not be decoded"):
        _translate(model_module).decode_images([buffer.getvalue()])
    assert np.asarray(_translate(model_module).IMAGE_FORMATS).tolist() == ["JPEG", "PNG", "WEBP", "GIF"]
