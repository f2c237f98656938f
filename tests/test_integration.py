"""End to end: the real Cog HTTP server (coglet) running predict.py, whose setup() downloads the
default model's archive from a local HTTP server and starts a real Triton Inference Server with
the CPU reference implementation of the tensorrt_llm model. Nothing is mocked.

The tests share the session's Cog server (``shared_stack``, tests/conftest.py, also used by
tests/test_structured_output.py; setup takes 10-30 s on 2 cores); the two that kill Triton or stop the
Cog server use ``fault_stack``, which tests/test_faults.py breaks and restarts too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cog_triton.streaming.prompt import PromptTokenizer
from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env
from tests.proc import pids_mentioning
from tests.stacks import STACK_SETTINGS, stack_processes

pytestmark = pytest.mark.integration

MAX_INPUT_LEN = int(STACK_SETTINGS["COG_TRITON_REFERENCE_MAX_INPUT_LEN"])  # 384
MAX_SEQ_LEN = int(STACK_SETTINGS["COG_TRITON_REFERENCE_MAX_SEQ_LEN"])  # 768


def _output(doc: dict[str, Any]) -> str:
    assert doc["status"] == "succeeded", doc.get("error") or doc
    out = doc["output"]
    return "".join(out) if isinstance(out, list) else out


def _reference_completion(hf_model, hf_tokenizer, prompt: str, max_new_tokens: int) -> tuple[str, int]:
    """What transformers' own generate() gives for the predictor's formatted prompt (greedy)."""
    import torch

    ids = PromptTokenizer(hf_tokenizer).encode(prompt).ids
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, attention_mask=torch.ones(1, len(ids))
        )
    new = out[0, len(ids):].tolist()
    eos = hf_tokenizer.eos_token_id
    if eos in new:
        new = new[: new.index(eos)]
    return hf_tokenizer.decode(new, skip_special_tokens=True), len(new)


def _triton_pids(model_repo: Path) -> list[int]:
    return pids_mentioning("tritonserver", str(model_repo))


@pytest.fixture
def stack(shared_stack):
    """The session's shared Cog server + Triton (tests/conftest.py: MAX_INPUT_LEN and MAX_SEQ_LEN here, a 5-s stop
    timeout, two stream processes, four slots); a dict of handles."""
    return shared_stack


def test_missing_weights_fail_setup_with_a_clear_error(tmp_path, default_archive):
    """A 404 for the weights URL ends setup (SETUP_FAILED) with the status, URL and the fix."""
    with WeightsHTTPServer(default_archive.parent) as weights:
        env = serving_env(f"{weights.url}/no-such-model.tar", work=tmp_path)
        with CogServer(env, log_file=tmp_path / "cog.log") as cog:
            with pytest.raises(RuntimeError) as info:
                cog.wait_ready(timeout_s=120)
    message = str(info.value)
    assert "SETUP_FAILED" in message
    assert "404" in message and "no-such-model.tar" in message and "check the URL" in message


def _wait_for_log(path: Path, text: str, timeout_s: float = 15.0) -> bool:
    """coglet may report setup done before its log capture delivers the last lines: poll the file."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


def test_setup_downloads_weights_and_runs_self_test(stack):
    log = stack["work"] / "cog.log"
    assert _wait_for_log(log, "Triton ready")
    assert _wait_for_log(log, "self-test generated")
    assert stack["weights"].counter[f"/{stack['archive'].name}"] == 1
    assert (stack["work"] / "weights" / "model.safetensors").is_file()
    assert (stack["work"] / "model_repository" / "tensorrt_llm" / "1" / "model.py").is_file()


def test_setup_logs_its_plan_in_one_line(stack):
    """Every decision setup made before launching (cog_triton.worker.planning) is on one line of the log."""
    lines = [line for line in (stack["work"] / "cog.log").read_text(errors="replace").splitlines() if "plan: " in line]
    assert len(lines) == 1, lines
    assert "Hugging Face checkpoint on the CPU reference model" in lines[0] and "stream process(es)" in lines[0]
    assert "one Triton" in lines[0] and "LoRA adapters on" in lines[0]


@pytest.mark.parametrize(
    "prompt",
    [
        "What is machine learning?",
        "Write the word 'robot' as an emoji, then say 'machine learning' in Chinese.",  # emoji output
        "Translate to Chinese: I love machine learning.",  # CJK output
    ],
)
def test_greedy_output_equals_transformers_generate(stack, hf_model, hf_tokenizer, prompt):
    max_tokens = 48
    doc = stack["cog"].predict({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    text = _output(doc)
    expected, n_tokens = _reference_completion(hf_model, hf_tokenizer, prompt, max_tokens)
    assert text == expected
    assert len(doc["output"]) > 1, "the output should arrive as a stream of chunks"
    assert not any("\ufffd" in chunk for chunk in doc["output"])
    assert doc["metrics"]["input_token_count"] == len(PromptTokenizer(hf_tokenizer).encode(prompt).ids)
    assert doc["metrics"]["output_token_count"] == n_tokens
    assert doc["metrics"]["time_to_first_token_s"] > 0
    assert doc["metrics"]["time_to_first_token"] == doc["metrics"]["time_to_first_token_s"]


def test_first_prompt_matches_known_answer(stack):
    text = _output(stack["cog"].predict({"prompt": "What is machine learning?", "max_tokens": 12, "temperature": 0}))
    assert text.startswith("Machine learning is a subset of artificial intelligence")


def test_stop_sequence_cuts_output_exactly(stack):
    base = {"prompt": "What is machine learning?", "max_tokens": 40, "temperature": 0}
    full = _output(stack["cog"].predict(base))
    stop = "intelligence"
    assert stop in full
    doc = stack["cog"].predict({**base, "stop_sequences": f"{stop},never-appears"})
    cut = _output(doc)
    assert cut == full[: full.index(stop)]
    assert stop not in cut
    assert doc["metrics"]["output_token_count"] < 40


def test_seeded_sampling_is_reproducible(stack):
    base = {"prompt": "Name a colour.", "max_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": 1234}
    doc = stack["cog"].predict(base)
    first = _output(doc)
    # The prediction's own logs name its Triton request id and its seed, in one line.
    assert len(re.findall(r"Triton request id cog-triton-[0-9a-f]{32}, seed 1234\n", doc["logs"])) == 1, doc["logs"]
    second = _output(stack["cog"].predict(base))
    assert first == second
    others = {_output(stack["cog"].predict({**base, "seed": seed})) for seed in (1, 2, 3)}
    assert len(others | {first}) > 1, "different seeds should not all give the same sample"


# Refused by coglet itself (HTTP 422, before predict() runs): the bounds of the bundled Cog schema.
SCHEMA_INVALID = [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -3}, "top_k"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "hi", "seed": -5}, "seed"),
    ({"prompt": "hi", "response_format": "yaml"}, "response_format"),
]

# Valid for the schema, refused by predict() with our message (what only the predictor or the model knows).
MODEL_INVALID = [
    ({"prompt": ""}, ["prompt", "empty"]),
    ({"max_tokens": 5}, ["give exactly one of prompt", "messages"]),  # neither prompt nor messages
    ({"prompt": "hi", "min_tokens": 9, "max_tokens": 4}, ["min_tokens=9", "max_tokens=4"]),
    ({"prompt": "hi", "prompt_template": "no placeholder"}, ["prompt_template", "{prompt}"]),
    ({"prompt": "hi", "stop_sequences": '["unterminated'}, ["stop_sequences"]),
    ({"prompt": "hi", "temperature": 1e-300}, ["temperature=1e-300", "float32"]),
    ({"prompt": "word " * 1000}, ["too long", "tokens", str(MAX_INPUT_LEN)]),
    # a checkpoint on the CPU reference model takes no images (the file Cog decoded from the data URI is not read)
    ({"prompt": "hi", "image_input": ["data:image/png;base64,iVBORw0KGgo="]},
     ["[invalid_image] 1 image(s) were given", "served by the CPU reference model, which takes text only"]),
]


#: What coglet logs as it hands a prediction to the worker's predict() (coglet 0.23.1, crates/coglet/src/orchestrator.rs:
#: a prediction registered with a worker slot).
STARTING = '"message":"Starting prediction"'


def _predict_calls(stack) -> int:
    """How many predictions coglet has handed to predict()."""
    return (stack["work"] / "cog.log").read_text(errors="replace").count(STARTING)


@pytest.mark.parametrize("inputs,field", SCHEMA_INVALID, ids=[str(i) for i in range(len(SCHEMA_INVALID))])
def test_schema_invalid_input_gets_422_before_predict_runs(stack, inputs, field):
    calls = _predict_calls(stack)
    response = httpx.post(f"{stack['cog'].url}/predictions", json={"input": inputs}, timeout=60)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(item["loc"] == ["body", "input", field] for item in detail), detail
    good = stack["cog"].predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0})
    assert good["status"] == "succeeded", good
    # The good prediction's predict() call is logged after any the refused input could have caused: once its line
    # is in, the count says whether predict() ran for the refused one too.
    log = stack["work"] / "cog.log"
    assert _wait_count(log, STARTING, calls) == calls + 1, "predict() ran for an input coglet refused"


@pytest.mark.parametrize("inputs,expected", MODEL_INVALID, ids=[str(i) for i in range(len(MODEL_INVALID))])
def test_bad_input_fails_clearly_and_server_keeps_serving(stack, inputs, expected):
    doc = stack["cog"].predict(inputs)
    assert doc["status"] == "failed", doc
    assert doc.get("output") in (None, []), "an input error must come before any output"
    for fragment in expected:
        assert fragment in doc["error"], (fragment, doc["error"])
    good = stack["cog"].predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0})
    assert good["status"] == "succeeded", good


def test_sse_streams_tokens_as_they_come_and_equals_the_sync_answer(stack):
    """POST /predictions with Accept: text/event-stream (coglet's SSE, enabled by the bundled schema)."""
    inputs = {"prompt": "What is machine learning?", "max_tokens": 40, "temperature": 0}
    sync_text = _output(stack["cog"].predict(inputs))
    started = time.monotonic()
    events = [(time.monotonic() - started, name, data) for name, data in stack["cog"].stream(inputs)]
    chunks = [(t, data["chunk"]) for t, name, data in events if name == "output"]
    final = events[-1]
    assert final[1] == "completed" and final[2]["status"] == "succeeded", final
    assert "".join(chunk for _, chunk in chunks) == sync_text == "".join(final[2]["output"])
    assert len(chunks) >= 10, "the answer should arrive as many events, not one"
    # Tokens arrive as they are generated: the first output well before the end (about 18 tokens/s here).
    assert chunks[0][0] < final[0] * 0.5, (chunks[0][0], final[0])
    assert final[2]["metrics"]["output_token_count"] == 40


def test_max_tokens_is_capped_by_max_seq_len(stack, hf_tokenizer):
    doc = stack["cog"].predict({"prompt": "Count from one to one thousand in words.", "max_tokens": 100000, "temperature": 0, "min_tokens": 0})
    assert doc["status"] == "succeeded", doc
    prompt_tokens = doc["metrics"]["input_token_count"]
    assert doc["metrics"]["output_token_count"] <= MAX_SEQ_LEN - prompt_tokens


def test_concurrent_predictions_all_complete_correctly(stack, hf_model, hf_tokenizer):
    prompts = ["What is a cat?", "What is rain?", "What is a star?", "What is bread?"]
    expected = {p: _reference_completion(hf_model, hf_tokenizer, p, 24)[0] for p in prompts}
    results: dict[str, dict[str, Any]] = {}
    spans: dict[str, tuple[float, float]] = {}

    def run(prompt: str) -> None:
        start = time.monotonic()
        results[prompt] = stack["cog"].predict({"prompt": prompt, "max_tokens": 24, "temperature": 0})
        spans[prompt] = (start, time.monotonic())

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for prompt in prompts:
        assert _output(results[prompt]) == expected[prompt], prompt
    # All four were in flight together: each began before any finished.
    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values())


def _ensemble_events(stack, body: dict[str, Any]) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{stack['env']['COG_TRITON_HTTP_PORT']}/v2/models/ensemble_ids/generate_stream"
    events = []
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        for line in response.iter_lines():  # an error before the first response comes as HTTP 400 + one event
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


def test_ensemble_serves_text_and_token_ids_directly(stack, hf_model, hf_tokenizer):
    """Triton's own generate_stream on the ensemble: text_input is tokenized by preprocessing,
    input_ids pass through; either way the streamed output_ids decode to transformers' answer."""
    prompt = "What is machine learning?"
    expected, _ = _reference_completion(hf_model, hf_tokenizer, prompt, 16)
    tokenized = PromptTokenizer(hf_tokenizer).encode(prompt)
    for source in ({"text_input": tokenized.text}, {"input_ids": tokenized.ids}):
        events = _ensemble_events(stack, {**source, "max_tokens": 16, "top_k": 1, "stream": True})
        assert not [e for e in events if "error" in e], events
        ids = [i for e in events for i in (e["output_ids"] if isinstance(e["output_ids"], list) else [e["output_ids"]])]
        assert hf_tokenizer.decode(ids, skip_special_tokens=True) == expected, source
    bad = _ensemble_events(stack, {"text_input": "x", "input_ids": [1, 2], "max_tokens": 4, "stream": True})
    assert "give exactly one of text_input" in bad[-1]["error"]


def _maps_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's C++ library mapped (torch imported)."""
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()


def test_the_preprocessing_stub_tokenizes_without_importing_torch(stack):
    """The preprocessing model only tokenizes, so its stub hides torch from transformers: torch's library is not
    mapped in it, while the reference model's stub, which runs the model, has it (the check can see it). Its
    tokenizing is checked by test_ensemble_serves_text_and_token_ids_directly; transformers' advice that models are
    unavailable without torch is not in Triton's log."""
    stubs = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in stack_processes(stack)["stubs"]}
    by_model = {Path(args[1].decode()).parent.parent.name: pid for pid, args in stubs.items() if len(args) > 1}
    assert {"preprocessing", "tensorrt_llm"} <= set(by_model), stubs
    assert _maps_torch(by_model["tensorrt_llm"])
    assert not _maps_torch(by_model["preprocessing"])
    assert "Models won't be available" not in (stack["work"] / "triton.log").read_text(errors="replace")


ONE_WORD = "Answer with one word: is water wet?"


def test_a_prediction_that_ends_on_the_end_token(stack, hf_model, hf_tokenizer):
    """The engine does not return the end token: the last streamed response has no new tokens
    (output_ids [1,1,0]). Through the ensemble that is an ordinary last event, not an error after
    the text; through Cog the prediction succeeds with transformers' answer, over SSE too."""
    expected, n_tokens = _reference_completion(hf_model, hf_tokenizer, ONE_WORD, 64)
    assert n_tokens < 64, "the model should end this answer on its own"
    ids = PromptTokenizer(hf_tokenizer).encode(ONE_WORD).ids
    events = _ensemble_events(stack, {"input_ids": ids, "max_tokens": 64, "top_k": 1, "stream": True})
    assert not [e for e in events if "error" in e], events
    assert events[-1]["output_ids"] == [] and events[-1]["sequence_length"] == 0
    assert sum(e["sequence_length"] for e in events) == n_tokens
    inputs = {"prompt": ONE_WORD, "max_tokens": 64, "temperature": 0}
    doc = stack["cog"].predict(inputs)
    assert _output(doc) == expected
    assert doc["metrics"]["output_token_count"] == n_tokens
    streamed = list(stack["cog"].stream(inputs))
    assert streamed[-1][0] == "completed" and streamed[-1][1]["status"] == "succeeded", streamed[-1]
    assert "".join(data["chunk"] for name, data in streamed if name == "output") == expected


def test_a_stop_sequence_straddling_prompt_and_output_never_reaches_the_user(stack):
    """The engine matches stop words over prompt and output tokens together (stopCriteriaKernels.cu
    stopWordsCriterion): with the prompt ending in "\n" and stop "\nMachine", it used to stop after
    "Machine", and the user received "Machine". The predictor's matcher, on the output text, decides."""
    template = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    base = {"prompt": "What is machine learning?", "prompt_template": template, "max_tokens": 24, "temperature": 0}
    full = _output(stack["cog"].predict(base))
    assert full.startswith("Machine learning")
    doc = stack["cog"].predict({**base, "stop_sequences": "\nMachine"})
    assert _output(doc) == full  # "\nMachine" does not occur in the output itself
    cut = stack["cog"].predict({**base, "stop_sequences": " learning"})
    assert _output(cut) == "Machine"


REQUEST_ID = re.compile(r"Triton request id (cog-triton-[0-9a-f]{32})")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_rate(pid: int, window_s: float = 1.5) -> float:
    """Cores the process kept busy over the next ``window_s`` seconds."""
    cpu, at = _cpu_s(pid), time.monotonic()
    time.sleep(window_s)
    return (_cpu_s(pid) - cpu) / (time.monotonic() - at)


def _engine_stub(stack) -> int:
    """The Python backend stub running the tensorrt_llm model (the CPU reference engine)."""
    model = stack["work"] / "model_repository" / "tensorrt_llm" / "1" / "model.py"
    [pid] = pids_mentioning("triton_python_backend_stub", str(model))
    return pid


class _Stream:
    """A prediction with a chosen id over SSE, read in a thread: its events with their arrival times,
    and the Triton request id it logged."""

    def __init__(self, cog: CogServer, inputs: dict[str, Any], prediction_id: str) -> None:
        self.cog, self.id = cog, prediction_id
        self.events: list[tuple[float, str, Any]] = []
        self.first_output = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._read, args=(inputs,), daemon=True)
        self.thread.start()

    def _read(self, inputs: dict[str, Any]) -> None:
        body = {"id": self.id, "input": inputs}
        with httpx.stream("POST", f"{self.cog.url}/predictions", json=body,
                          headers={"Accept": "text/event-stream"}, timeout=600) as response:
            event = "message"
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    self.events.append((time.monotonic(), event, json.loads(line[5:])))
                    if event == "output":
                        self.first_output.set()
        self.first_output.set()

    def final(self) -> tuple[float, dict[str, Any]]:
        self.thread.join(timeout=600)  # only "not hung"
        at, event, data = self.events[-1]
        assert event == "completed", self.events[-3:]
        return at, data

    def request_id(self) -> str:
        """The Triton request id the predictor logged for this prediction (in its logs, so its own)."""
        found = {m for _, _, data in self.events for m in REQUEST_ID.findall(json.dumps(data))}
        assert len(found) == 1, found
        return found.pop()


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text)


def _wait_count(path: Path, text: str, above: int, timeout_s: float = 60.0) -> int:
    """Wait for ``text`` to occur in ``path`` more than ``above`` times (the bound only means "not hung")."""
    deadline = time.monotonic() + timeout_s
    while _count(path, text) <= above and time.monotonic() < deadline:
        time.sleep(0.1)
    return _count(path, text)


def test_a_stop_sequence_ends_generation_in_triton_within_a_few_steps(stack):
    """The stop sequence cuts the output in the predictor; Triton is told to stop this request, and its
    engine finds it running (the stop line for this request id, new in Triton's log)."""
    triton_log, cog_log = stack["work"] / "triton.log", stack["work"] / "cog.log"
    stream = _Stream(stack["cog"], {"prompt": "What is machine learning?", "max_tokens": 200, "temperature": 0,
                                    "stop_sequences": "intelligence"}, f"stop-{time.monotonic_ns()}")
    _, doc = stream.final()
    rid = stream.request_id()
    stopped = f"stop request for id {rid!r}: 1 running request(s) stopped"
    sent = f"Triton request {rid}: stop request sent"
    text = _output(doc)
    assert "intelligence" not in text and text
    assert doc["metrics"]["output_token_count"] < 30  # not the 200 asked for
    assert _wait_count(triton_log, stopped, 0) == 1
    assert _wait_count(cog_log, sent, 0) == 1


def test_cancelling_a_prediction_cancels_generation_in_triton(stack):
    """Cog's cancel reaches the model: the predictor sends TensorRT-LLM's stop signal for its request id,
    the engine stops that request (its stop line, new in Triton's log), the prediction ends `canceled`,
    and the engine goes idle (its CPU use drops from what generating took in this same run)."""
    cog, triton_log, cog_log = stack["cog"], stack["work"] / "triton.log", stack["work"] / "cog.log"
    stub = _engine_stub(stack)
    inputs = {"prompt": "Write a very long story about a robot.", "max_tokens": 600, "min_tokens": 600,
              "temperature": 0}
    stream = _Stream(cog, inputs, f"cancel-{time.monotonic_ns()}")
    assert stream.first_output.wait(300), "no output"
    rid = stream.request_id()
    stopped = f"stop request for id {rid!r}: 1 running request(s) stopped"
    assert _count(triton_log, stopped) == 0
    generating = _cpu_rate(stub)  # the engine generating this request (600 tokens take ~30 s here)
    cancelled_at = time.monotonic()
    assert httpx.post(f"{cog.url}/predictions/{stream.id}/cancel", timeout=60).status_code == 200
    ended_at, doc = stream.final()
    assert doc["status"] == "canceled", doc
    # Canceled sooner than the part of the run before the cancel took (which generated only a small part
    # of the 600 tokens): the prediction did not run on to its end.
    assert ended_at - cancelled_at < cancelled_at - stream.started, (ended_at - cancelled_at, cancelled_at)
    assert _wait_count(triton_log, stopped, 0) == 1
    # logged once the stop request's answer is back, so after Triton's own line
    assert _wait_count(cog_log, f"Triton request {rid}: stop request sent", 0) == 1
    idle = _cpu_rate(stub)
    assert idle < generating / 4, (idle, generating)
    good = cog.predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0})
    assert good["status"] == "succeeded", good


def test_triton_death_fails_prediction_fast_then_recovers(fault_stack):
    stack = fault_stack
    cog, repo = stack["cog"], stack["work"] / "model_repository"
    pids = _triton_pids(repo)
    assert len(pids) == 1, pids
    result: dict[str, Any] = {}
    first = threading.Event()

    def long_prediction() -> None:
        inputs = {"prompt": "Write a long story about a robot.", "max_tokens": 400, "min_tokens": 400, "temperature": 0}
        for event, data in cog.stream(inputs, timeout_s=600):
            if event == "output":
                first.set()
            elif event == "completed":
                result["doc"] = data
        result["done"] = time.monotonic()
        first.set()

    started = time.monotonic()
    thread = threading.Thread(target=long_prediction)
    thread.start()
    # Killed once it has a token: a prediction that has none when Triton dies is sent again after the restart
    # (tests/test_faults.py); one that has tokens fails fast, naming the death.
    assert first.wait(120) and "doc" not in result, result
    killed = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    thread.join(timeout=600)  # only "not hung"
    doc = result["doc"]
    assert doc["status"] == "failed", doc
    assert "Triton" in doc["error"] and "SIGKILL" in doc["error"], doc["error"]
    # Failed sooner than the part of the run before the kill took (the 400 tokens would take ~20 s more;
    # the no-token timeout is 120 s): a bound from this run, not a fixed one.
    assert result["done"] - killed < killed - started, (result["done"] - killed, killed - started)
    # The next prediction restarts Triton and succeeds.
    good = cog.predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0}, timeout_s=400)
    assert good["status"] == "succeeded", good
    assert len(_triton_pids(repo)) == 1


def test_stop_leaves_no_orphans_and_second_setup_skips_download(fault_stack):
    """The Cog server's stop takes Triton with it; a second setup with the same settings and folders reuses the
    downloaded weights. The second server stays as the fault stack's (tests/conftest.py), serving."""
    stack = fault_stack
    cog, repo, weights, log = stack["cog"], stack["work"] / "model_repository", stack["weights"], stack["work"] / "cog.log"
    assert _triton_pids(repo)
    downloads = weights.counter[f"/{stack['archive'].name}"]
    assert downloads == 1
    cog.stop()
    deadline = time.monotonic() + 15
    while _triton_pids(repo) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _triton_pids(repo) == [], "tritonserver outlived the Cog server"
    reused = _count(log, "(reused)")
    again = CogServer(stack["env"], log_file=log, max_concurrency=stack["slots"])
    stack["cog"] = again  # stopped by the fixture at the end, whatever happens here
    again.start()
    again.wait_ready(timeout_s=400)
    assert _wait_count(log, "(reused)", reused) == reused + 1
    assert weights.counter[f"/{stack['archive'].name}"] == downloads, "the archive was downloaded twice"
    assert _output(again.predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0}))


def test_the_running_cog_worker_has_no_grpc_loaded_and_its_stream_processes_do(stack):
    """The process boundary is a package boundary (issue 33): after predictions ran, the Cog worker has mapped no
    gRPC library (grpc's ``cygrpc`` extension), while each stream process, which talks to Triton, has."""
    from benchmarks.procs import server_processes

    assert _output(stack["cog"].predict({"prompt": "Name a colour.", "max_tokens": 4}))
    roles = server_processes(stack["cog"].proc.pid)

    def maps_grpc(pid: int) -> bool:
        return "cygrpc" in Path(f"/proc/{pid}/maps").read_text()

    (worker,) = roles["cog_worker"]
    assert roles.get("stream_proc") and all(maps_grpc(pid) for pid in roles["stream_proc"])
    assert not maps_grpc(worker)
