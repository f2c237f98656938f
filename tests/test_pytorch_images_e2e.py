"""Images through the real Cog server on TensorRT-LLM's PyTorch backend: a vision-language checkpoint given as
``hf://owner/repo`` (the tiny Gemma 3 of tests/vlm_checkpoint.py, built here with random weights), images given as
``image_input`` URLs (downloaded by coglet) and as ``image_url`` parts of ``messages``, each refusal of the issue,
and the metrics. Different images give different outputs at temperature 0, each equal to transformers' own output
for those pixels: the pixels reached the model.

What cannot run here is stood in for, and only that, as tests/test_pytorch_e2e.py does: the Hub
(tests/hub_server.py), the GPU (a fake ``nvidia-smi``, tests/gpu_fakes.py) and TensorRT-LLM's LLM API
(benchmarks/llmapi_standin, through the overlay virtualenv of tests/llmapi_overlay.py).
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from PIL import Image

from cog_triton.dev.local import CogServer, serving_env
from tests.gpu_fakes import fake_nvidia_smi, gpus
from tests.hub_server import FakeHub
from tests.llmapi_overlay import overlay_venv
from tests.vlm_checkpoint import TOKENS_PER_IMAGE, VlmReference, build_vlm_checkpoint, solid_png

pytestmark = pytest.mark.integration

RED, BLUE, GREEN = (220, 30, 30), (30, 30, 220), (30, 200, 30)
QUESTION = "What color is it?"
#: The stack's COG_TRITON_IMAGE_FETCH_DEADLINE_S (seconds).
DEADLINE_S = 8


def encoded(fmt: str, size=(40, 30), frames: int = 1) -> bytes:
    buffer = io.BytesIO()
    images = [Image.new("RGB", size, color) for color in (RED, BLUE)[:frames]]
    images[0].save(buffer, format=fmt, save_all=frames > 1, append_images=images[1:], duration=100, loop=0)
    return buffer.getvalue()


class Pictures:
    """The images the tests give as URLs, served from 127.0.0.1 (coglet downloads image_input URLs itself, outside
    the fetch rules); every request's path is recorded."""

    def __init__(self) -> None:
        self.files = {"/red.png": solid_png(RED), "/blue.png": solid_png(BLUE), "/green.png": solid_png(GREEN),
                      "/page.tiff": encoded("TIFF"), "/moving.gif": encoded("GIF", frames=2),
                      "/huge.png": encoded("PNG", size=(1200, 1000))}
        self.paths: list[str] = []
        pictures = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                pictures.paths.append(self.path)
                body = pictures.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, checkpoint_dir: Path) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("pytorch_images_e2e")
    vlm = build_vlm_checkpoint(work / "gemma3-tiny", checkpoint_dir)
    overlay = overlay_venv(work / "overlay")
    smi = fake_nvidia_smi(work / "gpu", gpus(1))
    tmp = work / "tmp"
    tmp.mkdir()
    pictures = Pictures()
    with FakeHub() as hub:
        hub.add_folder("me/gemma3-tiny", vlm)
        env = serving_env(
            "hf://me/gemma3-tiny", work=work, COG_TRITON_LLM_MAX_SEQ_LEN="512", COG_TRITON_STOP_TIMEOUT_S="5",
            COG_TRITON_IMAGE_MAX_COUNT="3", COG_TRITON_IMAGE_MAX_PIXELS="1000000", TMPDIR=str(tmp), **hub.env(),
            # 127.0.0.1 stands for a public image host (127.0.0.2, loopback too, stays refused); plain http here
            COG_TRITON_FETCH_ALLOW_NETWORKS="127.0.0.1/32", COG_TRITON_FETCH_ALLOW_HTTP="true",
            COG_TRITON_IMAGE_FETCH_DEADLINE_S=str(DEADLINE_S),
            PATH=os.pathsep.join([str(smi), str(overlay / "bin"), str(Path(sys.executable).parent),
                                  os.environ["PATH"]]),
        )
        cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
        cog.start()
        try:
            cog.wait_ready(timeout_s=400)
            yield {"cog": cog, "work": work, "tmp": tmp, "pictures": pictures, "reference": VlmReference(vlm)}
        finally:
            cog.stop()
            pictures.httpd.shutdown()


def answer(stack: dict[str, Any], inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    events = list(stack["cog"].stream({"max_tokens": 8, "temperature": 0, **inputs}))
    final = next(data for name, data in events if name == "completed")
    assert final["status"] == "succeeded", final
    return "".join(data["chunk"] for name, data in events if name == "output"), final


def streamed(text: str) -> str:
    """The text of a complete decode as the predictor streams it: a character the last token left incomplete is
    held back (the detokenizer's exactness), not sent as U+FFFD."""
    return text.rstrip("\ufffd")


def refused(stack: dict[str, Any], inputs: dict[str, Any]) -> str:
    doc = stack["cog"].predict({"max_tokens": 4, "temperature": 0, **inputs})
    assert doc["status"] == "failed", doc
    return doc["error"]


def test_setup_serves_images_for_the_gemma3_checkpoint(stack: dict[str, Any]) -> None:
    log = (stack["work"] / "cog.log").read_text(errors="replace")
    assert "Gemma3ForConditionalGeneration" in log and "; images on" in log, log[-3000:]
    config = (stack["work"] / "model_repository" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'key: "images"' in config and 'string_value: "true"' in config


def test_different_images_give_different_outputs_each_transformers_own(stack: dict[str, Any]) -> None:
    reference, url = stack["reference"], stack["pictures"].url
    prompt = reference.prompt(QUESTION, 1)
    texts = {}
    for name, color in (("red", RED), ("blue", BLUE)):
        text, final = answer(stack, {"prompt": QUESTION, "image_input": [f"{url}/{name}.png"]})
        expected, _, prompt_len = reference.generate(prompt, [Image.new("RGB", (48, 40), color)], 8)
        assert text == streamed(expected)
        texts[name] = text
        assert final["metrics"]["image_count"] == 1
        assert final["metrics"]["image_token_count"] == TOKENS_PER_IMAGE
        assert final["metrics"]["input_token_count"] == prompt_len
    assert texts["red"] != texts["blue"]


def test_image_parts_of_messages_in_their_places(stack: dict[str, Any]) -> None:
    """A data URI part and image_input together: image_input's image opens the last user message, the part stays
    where it is; the output is transformers' own for that conversation."""
    reference = stack["reference"]
    green = "data:image/png;base64," + base64.b64encode(solid_png(GREEN)).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "Compare"},
                                             {"type": "image_url", "image_url": {"url": green}}]}]
    text, final = answer(stack, {"messages": json.dumps(messages),
                                 "image_input": [f"{stack['pictures'].url}/red.png"]})
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Compare"},
                                                 {"type": "image"}]}]
    prompt = reference.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    images = [Image.new("RGB", (48, 40), RED), Image.new("RGB", (48, 40), GREEN)]
    assert text == streamed(reference.generate(prompt, images, 8)[0])
    assert final["metrics"]["image_count"] == 2 and final["metrics"]["image_token_count"] == 2 * TOKENS_PER_IMAGE


def test_an_image_url_part_is_fetched_by_the_server_under_its_rules(stack: dict[str, Any]) -> None:
    reference, pictures = stack["reference"], stack["pictures"]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{pictures.url}/blue.png"}},
                                             {"type": "text", "text": QUESTION}]}]
    before = len(pictures.paths)
    text, final = answer(stack, {"messages": json.dumps(messages)})
    assert text == streamed(reference.generate(reference.prompt(QUESTION, 1), [Image.new("RGB", (48, 40), BLUE)],
                                               8)[0])
    assert pictures.paths[before:] == ["/blue.png"] and final["metrics"]["image_count"] == 1


def test_a_slow_image_url_holds_only_its_own_prediction(stack: dict[str, Any]) -> None:
    """An image URL whose server drips its answer ends at COG_TRITON_IMAGE_FETCH_DEADLINE_S, the client hanging up;
    meanwhile a prediction prepared off the streams' loop (a guided one: its guide is compiled on the prepare thread)
    in the same stream process is served and done first: the images are fetched on a thread of their own."""
    from tests.slow_server import SlowServer

    with SlowServer("headers", interval_s=0.2, hold_s=60) as slow:
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{slow.url}/a.png"}},
                                                 {"type": "text", "text": QUESTION}]}]
        ended: dict[str, Any] = {}

        def slow_prediction() -> None:
            ended["image"] = refused(stack, {"prompt": "", "messages": json.dumps(messages)})
            ended["image_at"] = time.monotonic()

        thread = threading.Thread(target=slow_prediction)
        thread.start()
        assert slow.wait(accepted=1, timeout_s=60)  # its fetch is under way
        text, _ = answer(stack, {"prompt": "Say hi.", "regex": "hi", "max_tokens": 4})
        served_at = time.monotonic()
        assert text == "hi"
        thread.join(120)
        assert "image" in ended and served_at < ended["image_at"]
        assert f"did not finish within the deadline of {DEADLINE_S} s (COG_TRITON_IMAGE_FETCH_DEADLINE_S)" in \
            ended["image"], ended["image"]
        assert slow.wait(ended=1, timeout_s=30) and slow.ended == ["client"]


def test_a_prediction_without_images_still_goes_through_the_ensemble(stack: dict[str, Any]) -> None:
    reference = stack["reference"]
    text, final = answer(stack, {"prompt": "Say hi."})
    assert text == streamed(reference.generate(reference.prompt("Say hi.", 0), [], 8)[0])
    assert "image_count" not in final["metrics"]


@pytest.mark.parametrize("inputs, phrase", [
    ({"image_input": ["red.png", "blue.png", "green.png", "red.png"]},
     "[invalid_image] 4 images were given; a prediction may carry at most 3 (COG_TRITON_IMAGE_MAX_COUNT)"),
    ({"image_input": ["page.tiff"]}, "image_input[0] is not an image in a format taken here (JPEG, PNG, WebP, GIF"),
    ({"image_input": ["moving.gif"]}, "image_input[0] is animated (2 frames); this model takes still images"),
    ({"image_input": ["huge.png"]}, "image_input[0] is 1200 x 1000 = 1200000 pixels; an image may have at most "
                                    "1000000 pixels (COG_TRITON_IMAGE_MAX_PIXELS)"),
    ({"image_input": ["/etc/hostname"]}, "image_input[0]='/etc/hostname' is not an image Cog received"),
    ({"prompt_template": "Q: {prompt}", "image_input": ["red.png"]}, "prompt_template cannot be used with it"),
    # the budget's answer request continues the first in token ids; an image request's prompt goes as text (refused in
    # the stream process, before any reasoning check: cog_triton/streaming/generation.py Generator.prepare)
    ({"thinking_budget_tokens": 16, "image_input": ["red.png"]},
     "thinking_budget_tokens=16 is not applied to a prediction with images (1 given): give 0 (max_tokens bounds the "
     "thinking and the answer together), or leave image_input and image parts out"),
    # 1.2.1's image models do not apply an adapter to their language model (cog_triton/worker/inputs.py): refused in
    # the Cog worker, before the adapter's URL is fetched
    ({"lora_weights": "{url}/adapter.tar.gz", "image_input": ["red.png"]},
     "lora_weights cannot be applied to a prediction with images (1 given): "),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                  "image_url": {"url": "http://127.0.0.2:9/red.png"}}]}]},
     "messages[0].content[0] http://127.0.0.2:9/red.png is refused: "),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                  "image_url": {"url": "http://169.254.169.254/latest"}}]}]},
     "messages[0].content[0] http://169.254.169.254/latest is refused: "),
])
def test_refusals_name_what_is_allowed_and_the_server_keeps_serving(stack: dict[str, Any], inputs: dict[str, Any],
                                                                      phrase: str) -> None:
    url = stack["pictures"].url
    given = dict(inputs)
    if "image_input" in given:
        given["image_input"] = [f"{url}/{name}" if not name.startswith("/") else name for name in given["image_input"]]
    if "messages" in given:
        given["messages"] = json.dumps(given["messages"]).replace("{url}", url)
    if "lora_weights" in given:
        given["lora_weights"] = given["lora_weights"].replace("{url}", url)
    given.setdefault("prompt", QUESTION if "messages" not in given else "")
    before = list(stack["pictures"].paths)
    error = refused(stack, given)
    assert phrase.replace("{url}", url) in error, error
    if "messages" in given:
        assert stack["pictures"].paths == before  # the fetch rules refused it before any request
    if "lora_weights" in given:  # refused in the Cog worker: coglet fetched image_input, nobody the adapter
        assert "/adapter.tar.gz" not in stack["pictures"].paths[len(before):]
    text, _ = answer(stack, {"prompt": QUESTION, "image_input": [f"{url}/blue.png"]})
    assert text


def test_no_image_file_is_left_behind(stack: dict[str, Any]) -> None:
    """coglet removes the files it downloaded when a prediction ends; the stream processes write none."""
    answer(stack, {"prompt": QUESTION, "image_input": [f"{stack['pictures'].url}/red.png"]})
    assert list(stack["tmp"].iterdir()) == []


def test_a_guide_holds_the_answer_about_an_image_to_it(stack: dict[str, Any]) -> None:
    """json_schema with an image: the guide goes with the image request to the tensorrt_llm model, whose LLM masks
    the logits with it (the stand-in: xgrammar's bitmask, as 1.2.1's executor); the random model's unguided answer
    is no JSON document at all."""
    # one of three JSON strings: the grammar has no free whitespace, which a model of random weights would fill (an
    # object's grammar allows any whitespace between its tokens)
    schema = {"enum": ["red", "green", "blue"]}
    image = [f"{stack['pictures'].url}/red.png"]
    text, final = answer(stack, {"prompt": QUESTION, "image_input": image, "json_schema": json.dumps(schema),
                                 "max_tokens": 32})
    assert json.loads(text) in ("red", "green", "blue"), text
    assert final["metrics"]["image_count"] == 1
    unguided, _ = answer(stack, {"prompt": QUESTION, "image_input": image, "max_tokens": 32})
    with pytest.raises(ValueError):
        json.loads(unguided)


def test_a_stop_sequence_cuts_the_answer_about_an_image(stack: dict[str, Any]) -> None:
    """stop_sequences with an image: matched on the answer's text in the stream process as for text; the answer is
    transformers' own for those pixels, cut before the sequence's first occurrence."""
    reference = stack["reference"]
    expected = streamed(reference.generate(reference.prompt(QUESTION, 1), [Image.new("RGB", (48, 40), RED)], 16)[0])
    # a sequence of two visible characters from the answer's second half, not in its first characters
    stop = next(expected[k:k + 2] for k in range(len(expected) // 2, len(expected) - 1)
                if not expected[k:k + 2].isspace() and expected.index(expected[k:k + 2]) > 0)
    cut = expected[:expected.index(stop)]
    text, final = answer(stack, {"prompt": QUESTION, "image_input": [f"{stack['pictures'].url}/red.png"],
                                 "max_tokens": 16, "stop_sequences": json.dumps([stop])})
    assert text == cut and len(cut) < len(expected), (text, stop, expected)
    assert final["metrics"]["image_count"] == 1
