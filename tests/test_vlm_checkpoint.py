"""The tiny vision-language checkpoint (tests/vlm_checkpoint.py) is what the image tests need: it loads completely and
the same under transformers 5.x (``.venv``) and 4.57.1 (the GPU image's, ``build/hub0``), its processor expands the
image placeholder, and its output depends on the pixels.

Under 4.57.1 the same code runs in a subprocess with ``build/hub0`` first on ``PYTHONPATH`` (as
tests/test_weights_hub_0x.py runs the Hub tests), and the two answers are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vlm_checkpoint import (IMAGE_PLACEHOLDER, IMAGE_TOKENS, TOKENS_PER_IMAGE, build_vlm_checkpoint,
                                  solid_png)

ROOT = Path(__file__).resolve().parents[1]
HUB0 = ROOT / "build" / "hub0"
COLORS = ((220, 30, 30), (30, 30, 220))


def describe(folder: str, image_dir: str) -> dict[str, Any]:
    """What a transformers major makes of the checkpoint: its version, the classes it loads, the weights it did not
    find or did not use, the processed prompt and greedy ids for each of the two images."""
    import torch
    import transformers
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer, Gemma3ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    model, info = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32, local_files_only=True,
                                                                 output_loading_info=True)
    model.eval()
    image_token = model.config.image_token_index
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color is it?"}]}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    runs = []
    for index in range(2):
        image = Image.open(Path(image_dir) / f"{index}.png").convert("RGB")
        batch = processor(text=prompt, images=[image], return_tensors="pt")
        ids = batch["input_ids"]
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), pixel_values=batch["pixel_values"],
                                 token_type_ids=(ids == image_token).to(torch.long), do_sample=False, max_new_tokens=6)
        runs.append({"prompt_ids": ids[0].tolist(), "new_ids": out[0, ids.shape[1]:].tolist()})
    return {
        "version": transformers.__version__,
        "tokenizer": type(tokenizer).__name__,
        "special": [tokenizer.convert_tokens_to_ids(t) for t in IMAGE_TOKENS],
        "boi": getattr(tokenizer, "boi_token", None), "image_token": getattr(tokenizer, "image_token", None),
        "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
        "mismatched": [str(m) for m in info.get("mismatched_keys", [])],
        "prompt": prompt, "runs": runs,
    }


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("vlm")
    folder = build_vlm_checkpoint(work / "gemma3-tiny", checkpoint_dir)
    images = work / "images"
    images.mkdir()
    for index, color in enumerate(COLORS):
        solid_png(color, path=images / f"{index}.png")
    return {"folder": folder, "images": images}


@pytest.fixture(scope="module")
def answers(checkpoint: dict[str, Path]) -> dict[str, dict[str, Any]]:
    if not (HUB0 / "transformers").is_dir():
        pytest.fail(f"{HUB0} is missing: run scripts/setup first", pytrace=False)
    five = describe(str(checkpoint["folder"]), str(checkpoint["images"]))
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from tests.test_vlm_checkpoint import describe; "
            "print(json.dumps(describe(sys.argv[2], sys.argv[3])))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HUB0), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), str(checkpoint["folder"]), str(checkpoint["images"])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    four = json.loads(done.stdout.strip().splitlines()[-1])
    return {"5": five, "4": four}


def test_it_loads_completely_under_both_transformers_majors(answers: dict[str, dict[str, Any]]) -> None:
    assert answers["5"]["version"].startswith("5.") and answers["4"]["version"] == "4.57.1"
    for answer in answers.values():
        assert answer["missing"] == [] and answer["unexpected"] == [] and answer["mismatched"] == [], answer
        assert answer["special"] == [49152, 49153, 49154]
        assert answer["boi"] == IMAGE_PLACEHOLDER and answer["image_token"] == IMAGE_TOKENS[2]
    assert answers["4"]["tokenizer"] == "GPT2TokenizerFast"


def test_both_majors_render_process_and_decode_it_alike(answers: dict[str, dict[str, Any]]) -> None:
    five, four = answers["5"], answers["4"]
    assert five["prompt"] == four["prompt"] and five["prompt"].count(IMAGE_PLACEHOLDER) == 1
    assert five["runs"] == four["runs"]


def test_the_processor_expands_the_placeholder_to_the_image_tokens(answers: dict[str, dict[str, Any]]) -> None:
    ids = answers["5"]["runs"][0]["prompt_ids"]
    boi, eoi, soft = 49152, 49153, 49154
    start = ids.index(boi)
    assert ids[start: start + TOKENS_PER_IMAGE + 2] == [boi] + [soft] * TOKENS_PER_IMAGE + [eoi]
    assert ids.count(soft) == TOKENS_PER_IMAGE


def test_the_output_depends_on_the_pixels(answers: dict[str, dict[str, Any]]) -> None:
    """transformers initialises mm_input_projection_weight to zeros; drawn again, two images give two answers."""
    red, blue = (run["new_ids"] for run in answers["5"]["runs"])
    assert red != blue
