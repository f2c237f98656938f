"""The LLM API stand-in's multimodal requests against the TensorRT-LLM 1.2.1 facts it claims
(benchmarks/llmapi_standin/tensorrt_llm/inputs/registry.py, inputs/data.py and llmapi/llm.py cite the upstream files),
and its image generation against transformers on the tiny Gemma 3 checkpoint (tests/vlm_checkpoint.py).

The stand-in is the one mock here: TensorRT-LLM cannot run on this machine.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from PIL import Image

from tests.llmapi_overlay import standin_imported
from tests.vlm_checkpoint import TOKENS_PER_IMAGE, VlmReference, build_vlm_checkpoint

RED, BLUE = (220, 30, 30), (30, 30, 220)
QUESTION = "What color is it?"


@pytest.fixture(scope="module")
def trtllm():
    with standin_imported() as module:
        yield module


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> Path:
    return build_vlm_checkpoint(tmp_path_factory.mktemp("vlm") / "gemma3-tiny", checkpoint_dir)


@pytest.fixture(scope="module")
def reference(vlm_dir: Path) -> VlmReference:
    return VlmReference(vlm_dir)


@pytest.fixture(scope="module")
def vlm(trtllm, vlm_dir: Path):
    engine = trtllm.LLM(str(vlm_dir), max_batch_size=4, max_seq_len=512)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def text_llm(trtllm, checkpoint_dir: Path):
    engine = trtllm.LLM(str(checkpoint_dir), max_batch_size=4, max_seq_len=256)
    yield engine
    engine.shutdown()


def image(color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (48, 40), color)


def run(llm, inputs, max_tokens: int = 8, end_id: int = 2):
    """One greedy streaming request on a fresh event loop: (generated ids, its RequestOutput)."""
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(inputs, sampling_params=SamplingParams(max_tokens=max_tokens, top_k=1, end_id=end_id),
                                 streaming=True)
        ids = []
        async for result in out:
            ids += result.outputs[0].token_ids_diff
        return ids, out

    return asyncio.run(main())


def test_a_text_prompt_with_images_is_processed_by_the_models_processor(vlm, reference):
    """Gemma3InputProcessor: the Hugging Face processor tokenizes the text and expands each <start_of_image> into the
    image's tokens; prompt_token_ids are those ids and prompt the text; greedy output is transformers' own."""
    prompt = reference.prompt(QUESTION, 1)
    ids, out = run(vlm, {"prompt": prompt, "multi_modal_data": {"image": [image(RED)]}})
    _, expected_ids, prompt_len = reference.generate(prompt, [image(RED)], 8)
    assert ids == expected_ids
    assert len(out.prompt_token_ids) == prompt_len
    assert out.prompt_token_ids.count(reference.image_token) == TOKENS_PER_IMAGE
    assert out.prompt == prompt


def test_different_images_give_different_outputs(vlm, reference):
    prompt = reference.prompt(QUESTION, 1)
    red, _ = run(vlm, {"prompt": prompt, "multi_modal_data": {"image": [image(RED)]}})
    blue, _ = run(vlm, {"prompt": prompt, "multi_modal_data": {"image": [image(BLUE)]}})
    assert red != blue
    assert blue == reference.generate(prompt, [image(BLUE)], 8)[1]


def test_two_images_in_one_prompt(vlm, reference):
    prompt = reference.prompt(QUESTION, 2)
    ids, out = run(vlm, {"prompt": prompt, "multi_modal_data": {"image": [image(RED), image(BLUE)]}})
    assert ids == reference.generate(prompt, [image(RED), image(BLUE)], 8)[1]
    assert out.prompt_token_ids.count(reference.image_token) == 2 * TOKENS_PER_IMAGE


def test_the_first_image_request_tries_hashing_then_falls_back(trtllm, vlm_dir, reference, caplog):
    """create_input_processor_with_hash: Gemma3InputProcessor has no get_num_tokens_per_image, so the first image
    request logs the hashing failure and the fallback; the processor is marked and later requests go straight."""
    llm = trtllm.LLM(str(vlm_dir), max_batch_size=2, max_seq_len=512)
    try:
        prompt = reference.prompt(QUESTION, 1)
        with caplog.at_level(logging.WARNING, logger="tensorrt_llm"):
            run(llm, {"prompt": prompt, "multi_modal_data": {"image": [image(RED)]}}, max_tokens=1)
            first = caplog.text
            caplog.clear()
            run(llm, {"prompt": prompt, "multi_modal_data": {"image": [image(RED)]}}, max_tokens=1)
        assert "Multimodal hashing failed: Input processor Gemma3InputProcessor does not have " \
               "'get_num_tokens_per_image' method." in first
        assert "Falling back to basic input processor." in first
        assert "Multimodal hashing failed" not in caplog.text
        assert llm.input_processor.multimodal_hashing_supported is False
    finally:
        llm.shutdown()


def test_token_ids_with_images_are_decoded_and_processed_again(vlm, reference):
    """generate_async: token ids + multi_modal_data on a model with its own input processor are decoded with the
    LLM's tokenizer into a text prompt ("VLMs need to process/tokenize the prompt in their own way")."""
    prompt = reference.prompt(QUESTION, 1)
    ids = reference.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    by_ids, out = run(vlm, {"prompt_token_ids": ids, "multi_modal_data": {"image": [image(BLUE)]}})
    by_text, _ = run(vlm, {"prompt": prompt, "multi_modal_data": {"image": [image(BLUE)]}})
    assert by_ids == by_text
    assert out.prompt_token_ids.count(reference.image_token) == TOKENS_PER_IMAGE


def test_token_ids_with_images_need_the_llms_tokenizer(trtllm, vlm_dir, reference):
    """Under skip_tokenizer_init the input processor has no tokenizer, and the decode fails."""
    llm = trtllm.LLM(str(vlm_dir), max_batch_size=2, max_seq_len=512, skip_tokenizer_init=True)
    try:
        assert llm.tokenizer is None
        ids = reference.tokenizer(reference.prompt(QUESTION, 1), add_special_tokens=False)["input_ids"]
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'decode'"):
            run(llm, {"prompt_token_ids": ids, "multi_modal_data": {"image": [image(RED)]}})
    finally:
        llm.shutdown()


def test_a_text_only_checkpoint_drops_the_images(text_llm, hf_tokenizer, caplog):
    """DefaultInputProcessor: a text prompt is tokenized (special tokens added by default) and the images dropped,
    after the hashing attempt fails; token ids with images are taken as they are."""
    text = "Describe the image."
    with caplog.at_level(logging.WARNING, logger="tensorrt_llm"):
        ids_with, out = run(text_llm, {"prompt": text, "multi_modal_data": {"image": [image(RED)]}}, max_tokens=4)
    assert out.prompt_token_ids == hf_tokenizer.encode(text, add_special_tokens=True)
    assert "Input processor DefaultInputProcessor does not have 'get_num_tokens_per_image' method" in caplog.text
    ids_without, _ = run(text_llm, text, max_tokens=4)
    assert ids_with == ids_without
    tokens = hf_tokenizer.encode(text)
    by_ids, out = run(text_llm, {"prompt_token_ids": tokens, "multi_modal_data": {"image": [image(RED)]}},
                      max_tokens=4)
    assert out.prompt_token_ids == tokens and by_ids == ids_without


def test_gemma3_wants_image_data(vlm, reference):
    with pytest.raises(KeyError, match="Expected image data in multimodal data for Gemma3."):
        run(vlm, {"prompt": reference.prompt(QUESTION, 0), "multi_modal_data": {"video": [[image(RED)]]}})


def test_the_processors_own_errors_pass_as_they_are(vlm, reference):
    """A prompt whose placeholders do not match the images: the Hugging Face processor refuses it."""
    with pytest.raises(ValueError, match=r"(?i)image"):
        run(vlm, {"prompt": reference.prompt(QUESTION, 2), "multi_modal_data": {"image": [image(RED)]}})


def test_prompt_inputs_as_upstream(vlm, text_llm, trtllm, checkpoint_dir):
    with pytest.raises(AssertionError):
        run(vlm, {"multi_modal_data": {"image": [image(RED)]}})
    with pytest.raises(TypeError, match="Invalid type of inputs for llm.generate"):
        run(text_llm, 42)
    bare = trtllm.LLM(str(checkpoint_dir), max_batch_size=1, max_seq_len=64, skip_tokenizer_init=True)
    try:
        with pytest.raises(ValueError, match="tokenizer is required to tokenize string prompt"):
            run(bare, "hello")
    finally:
        bare.shutdown()


def test_input_processors_the_stand_in_does_not_emulate_are_refused(trtllm, tmp_path, vlm_dir):
    """Honesty: a registered multimodal architecture other than Gemma 3 would need its own processor."""
    import json
    import shutil

    other = tmp_path / "qwen"
    shutil.copytree(vlm_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="Qwen2_5_VLForConditionalGeneration is not emulated"):
        trtllm.LLM(str(other), max_batch_size=1, max_seq_len=64)


def test_the_image_tokens_attend_to_one_another(vlm, reference):
    """Gemma3VLM marks the prompt positions holding image_token_index (image_token_mask) so that an image's tokens
    attend to one another both ways: the first token's log-probability is the one computed with that mark (it
    differs without it)."""
    import torch
    from tensorrt_llm import SamplingParams

    prompt = reference.prompt(QUESTION, 1)

    async def main():
        out = vlm.generate_async({"prompt": prompt, "multi_modal_data": {"image": [image(RED)]}},
                                 sampling_params=SamplingParams(max_tokens=1, top_k=1, end_id=2, logprobs=1))
        return await out

    result = asyncio.run(main())
    (entry,) = result.outputs[0].logprobs
    served = next(iter(entry.values())).logprob
    batch = reference.processor(text=prompt, images=[image(RED)], return_tensors="pt")
    ids, pixels = batch["input_ids"], batch["pixel_values"].to(torch.bfloat16).to(torch.float32)
    with torch.inference_mode():
        marked = reference.model(input_ids=ids, pixel_values=pixels,
                                 token_type_ids=(ids == reference.image_token).to(torch.long)).logits[0, -1]
        causal = reference.model(input_ids=ids, pixel_values=pixels).logits[0, -1]
    with_mark = float(torch.log_softmax(marked, -1).max())
    without = float(torch.log_softmax(causal, -1).max())
    assert abs(with_mark - without) > 1e-4  # the mark matters for this checkpoint
    assert served == pytest.approx(with_mark, abs=1e-5)
