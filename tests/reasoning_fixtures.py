"""Tokenizers and chat templates of reasoning-model families, for tests, without a reasoning model.

Each fixture is SmolLM2's tokenizer (the default model's) with the family's marker and control tokens added and a
chat template written here in the family's published format (not copied: the formats, variables and markers are
those docs/deploy.md cites for each family):

* ``qwen3``: ChatML; ``<think>``/``</think>`` plain added tokens (not special, as Qwen3's tokenizer_config.json has
  them); ``enable_thinking`` false renders an empty ``<think>\\n\\n</think>\\n\\n`` block in the generation prompt;
  an earlier assistant turn's thinking is read from ``reasoning_content`` (or split off its content at ``</think>``)
  and rendered only after the last user turn, so a plain conversation drops it.
* ``deepseek_v31``: DeepSeek's ``<｜User｜>``/``<｜Assistant｜>`` turns; ``thinking`` (or ``enable_thinking``) opens
  ``<think>`` in the generation prompt, else it renders ``</think>``; earlier turns keep what follows ``</think>``.
* ``deepseek_r1``: the generation prompt always ends ``<｜Assistant｜><think>\\n``: the opening marker is in the
  prompt; no switch.
* ``glm45``: ``[gMASK]<sop>``, ``<|user|>``/``<|assistant|>``; ``<think>``/``</think>`` special tokens;
  ``enable_thinking`` false appends ``/nothink`` to user turns and ``\\n<think></think>`` to the generation prompt;
  ``reasoning_content`` after the last user turn.
* ``gpt_oss``: harmony: ``<|start|>ROLE<|message|>TEXT<|end|>``, the system message carrying ``Reasoning:
  {reasoning_effort}`` (default medium), a system role rendered as the developer message, earlier assistant turns on
  the final channel (their ``thinking`` rendered only for a trailing assistant turn without a generation prompt),
  the generation prompt ``<|start|>assistant``; ``<|return|>`` is the end token.
* ``magistral``: Mistral's ``[SYSTEM_PROMPT]``/``[INST]`` format with a default system prompt that asks for thinking
  between ``[THINK]`` and ``[/THINK]`` (special tokens); no switch.

:func:`build` writes one into a folder that also holds the default model's ``config.json`` with the vocabulary
enlarged to the added tokens, and its weights linked, so that it can be served as a checkpoint (the scripted
stand-in engines do not run the model). :func:`tokenizer` loads one (built once under build/, cached per process).

:func:`build_model_markers` writes the one fixture the real model serves: SmolLM2's tokenizer with two of its own
special tokens renamed to the markers (so the vocabulary, and the model, are unchanged), for a real run of guided
decoding through the CPU reference model with the thinking let through.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"

QWEN3 = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user and reasoning %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content"
    " + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

DEEPSEEK_V31 = (
    "{%- if not thinking is defined %}{%- if enable_thinking is defined %}{%- set thinking = enable_thinking %}"
    "{%- else %}{%- set thinking = false %}{%- endif %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- message['content'] }}"
    "{%- elif message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>', 1)[1] %}{%- endif %}"
    "{{- '<｜Assistant｜></think>' + content + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜>' }}"
    "{%- if thinking %}{{- '<think>' }}{%- else %}{{- '</think>' }}{%- endif %}{%- endif %}"
)

DEEPSEEK_R1 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{- message['content'] }}"
    "{%- elif message['role'] == 'user' %}{{- '<｜User｜>' + message['content'] }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\\n' }}{%- endif %}"
)

GLM45 = (
    "[gMASK]<sop>"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{{- '<|user|>\\n' + m.content }}"
    "{{- '/nothink' if (enable_thinking is defined and not enable_thinking) else '' }}"
    "{%- elif m.role == 'assistant' %}{{- '<|assistant|>' }}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}"
    "{%- if loop.index0 > ns.last_user and reasoning %}{{- '\\n<think>' + reasoning.strip() + '</think>' }}"
    "{%- else %}{{- '\\n<think></think>' }}{%- endif %}"
    "{{- '\\n' + m.content.strip() }}"
    "{%- elif m.role == 'system' %}{{- '<|system|>\\n' + m.content }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}"
    "{{- '\\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' }}{%- endif %}"
)

GPT_OSS = (
    "{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}{%- endif %}"
    "{{- '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: ' + reasoning_effort }}"
    "{{- '\\n\\n# Valid channels: analysis, commentary, final.<|end|>' }}"
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + messages[0].content + '<|end|>' }}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- if loop.last and not add_generation_prompt and 'thinking' in message %}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}{%- endif %}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|end|>' }}"
    "{%- elif message.role == 'user' %}{{- '<|start|>user<|message|>' + message.content + '<|end|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

MAGISTRAL = (
    "{%- set default_system_message = 'First draft your thinking process (inner monologue) between [THINK] and "
    "[/THINK], then write the answer.' %}"
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{{- '[SYSTEM_PROMPT]' + messages[0].content + '[/SYSTEM_PROMPT]' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{{- '[SYSTEM_PROMPT]' + default_system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'assistant' %}{{- message.content + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

#: name -> (template, tokens added as plain added tokens, special tokens added, eos token or None).
FORMATS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], Any]] = {
    "qwen3": (QWEN3, ("<think>", "</think>"), (), None),
    "deepseek_v31": (DEEPSEEK_V31, ("<think>", "</think>"), ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
                     "<｜end▁of▁sentence｜>"),
    "deepseek_r1": (DEEPSEEK_R1, ("<think>", "</think>"), ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
                    "<｜end▁of▁sentence｜>"),
    "glm45": (GLM45, (), ("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>", "<think>", "</think>"), None),
    "gpt_oss": (GPT_OSS, (), ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
                             "<|constrain|>"), "<|return|>"),
    "magistral": (MAGISTRAL, (), ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[THINK]", "[/THINK]"),
                  None),
}


def build(name: str, folder: Path, *, weights: bool = True) -> Path:
    """Write fixture ``name`` (a key of :data:`FORMATS`) into ``folder``: the tokenizer files, ``config.json`` with
    ``vocab_size`` covering the added tokens, and (``weights``) the default model's weights linked; returns it."""
    from tokenizers import AddedToken  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    template, plain, special, eos = FORMATS[name]
    tok = AutoTokenizer.from_pretrained(str(CHECKPOINT), local_files_only=True)
    if plain:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    if special:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special], special_tokens=True)
    if eos is not None:
        tok.eos_token = eos
    tok.chat_template = template
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(folder))
    config = json.loads((CHECKPOINT / "config.json").read_text())
    config["vocab_size"] = max(int(config["vocab_size"]), len(tok))
    if eos is not None:
        config["eos_token_id"] = tok.convert_tokens_to_ids(eos)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(CHECKPOINT / "generation_config.json", folder / "generation_config.json")
    if weights and not (folder / "model.safetensors").exists():
        os.symlink(CHECKPOINT / "model.safetensors", folder / "model.safetensors")
    return folder


def tokenizer_dir(name: str) -> Path:
    """Fixture ``name``'s tokenizer folder under build/ (kept between runs, made again when this module or
    transformers changes; written to a temporary folder and renamed, so concurrent test processes agree)."""
    import hashlib  # noqa: PLC0415

    import transformers  # noqa: PLC0415

    digest = hashlib.sha256(Path(__file__).read_bytes() + transformers.__version__.encode()).hexdigest()[:12]
    folder = CHECKPOINT.parent.parent / "reasoning_fixtures" / digest / name
    if not (folder / "config.json").exists():
        staging = folder.with_name(f".{name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        build(name, staging, weights=False)
        try:
            os.rename(staging, folder)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return folder


@functools.lru_cache(maxsize=None)
def tokenizer(name: str) -> Any:
    """Fixture ``name``'s tokenizer (loaded once per process)."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    return AutoTokenizer.from_pretrained(str(tokenizer_dir(name)), local_files_only=True)


def ids(tok: Any, text: str) -> list[int]:
    """``text``'s token ids (its marker and control tokens as one token each, no BOS)."""
    return list(tok(text, add_special_tokens=False)["input_ids"])


#: The ids :func:`build_model_markers` renames, and their names in SmolLM2's tokenizer: ``<jupyter_text>`` becomes
#: ``<think>``, and ``<|im_start|>`` ``</think>``. SmolLM2-135M-Instruct, greedy, in a few-shot prompt of thoughts
#: between the markers (:data:`FEW_SHOT`), ends its own thought with ``<|im_start|>`` once the end token is masked
#: (its first choice there is ``<|im_end|>``, which a grammar inside the thinking refuses; id 13, the token after
#: ``<jupyter_text>``, is not among its ten first): so that token, renamed, is a closing marker the real model writes.
MODEL_MARKERS = {12: ("<jupyter_text>", "<think>"), 1: ("<|im_start|>", "</think>")}
#: A ``prompt_template`` whose examples think between the markers and answer in JSON; it ends by opening the thinking.
FEW_SHOT = ("Q: What is 1+1?\nA: <think>One plus one.</think>{\"answer\": 2}\n"
            "Q: What is 2+3?\nA: <think>Two plus three.</think>{\"answer\": 5}\n"
            "Q: {prompt}\nA: <think>")


def build_model_markers(folder: Path) -> Path:
    """Write SmolLM2's checkpoint (its weights linked) into ``folder`` with :data:`MODEL_MARKERS` renamed (plain added
    tokens, as Qwen3's markers are) and the Qwen3-format chat template; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in CHECKPOINT.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, folder / item.name)
    os.symlink(CHECKPOINT / "model.safetensors", folder / "model.safetensors")
    renamed = {old: new for old, new in MODEL_MARKERS.values()}
    document = json.loads((folder / "tokenizer.json").read_text())
    for token in document["added_tokens"]:
        if token["id"] in MODEL_MARKERS:
            old, new = MODEL_MARKERS[token["id"]]
            token.update(content=new, special=False)
            vocab = document["model"]["vocab"]
            vocab[new] = vocab.pop(old)
    (folder / "tokenizer.json").write_text(json.dumps(document))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key, token in config.get("added_tokens_decoder", {}).items():
        if int(key) in MODEL_MARKERS:
            token.update(content=MODEL_MARKERS[int(key)][1], special=False)
    for path, document in ((folder / "tokenizer_config.json", config),
                           (folder / "special_tokens_map.json", None)):
        if document is None:
            if not path.exists():
                continue
            document = json.loads(path.read_text())
        listed = document.get("additional_special_tokens")
        if isinstance(listed, list):
            document["additional_special_tokens"] = [t for t in listed if t not in renamed]
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            if document.get(key) in renamed:  # SmolLM2's BOS, <|im_start|>, which its tokenizer never adds
                document[key] = None
        path.write_text(json.dumps(document))
    (folder / "chat_template.jinja").write_text(QWEN3)
    return folder
