"""scripts/benchmark and its token-rate stand-in engine (benchmarks/).

Unit tests of the stand-in (its tensors, batched steps, tokens, ends, sender threads) run without
Triton; the stand-in's Triton model runs in a real tritonserver (streaming and stop); the smoke test runs ``scripts/benchmark
--smoke`` on the real stack and checks the report's structure, that every path delivered exactly
the requested tokens, and that every named process has CPU figures. No speed is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import threading
import types
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.loadgen import TTFT_PHASES, Result, ttft_phases
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.templates import fill_template, parse_model_config
from tests.test_packaging import dockerfile_instructions
from tests.modules import load_file
from tests.proc import stop_at_once

STANDIN = REPO_ROOT / "benchmarks" / "standin"
REFERENCE = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference"


standin = load_file("benchmark_standin_model", STANDIN / "1" / "model.py")


@pytest.fixture(scope="module")
def ref():
    """The reference model module, loaded the way the stand-in loads it in Triton."""
    return standin.load_reference(str(REFERENCE / "1" / "model.py"))


# ------------------------------------------------------------------------------------------------
# the stand-in's model configuration
# ------------------------------------------------------------------------------------------------

def _product_values() -> dict:
    """What the product's renderer fills into the reference template (so the two stay in step)."""
    from tensorrtllm_backend.engine import ModelLimits, WeightsInfo
    from tensorrtllm_backend.templates import RenderOptions, template_values

    info = WeightsInfo(kind="hf_checkpoint", weights_dir=Path("/weights"), tokenizer_dir=Path("/weights"),
                       limits=ModelLimits(max_batch_size=64, max_input_len=100, max_seq_len=200))
    options = RenderOptions(template_dir=REPO_ROOT / "triton_model_repo", model_repo_dir=Path("/x"))
    return template_values(options, info)["tensorrt_llm_reference"]


PRODUCT_VALUES = _product_values()


def test_standin_has_the_reference_models_tensors_and_placeholders(tmp_path: Path) -> None:
    templates = harness.write_standin_templates(tmp_path / "t", step_ms=5, sender_threads=3)
    rendered = {}
    for name, path in (("standin", templates / "tensorrt_llm_reference" / "config.pbtxt"),
                       ("reference", REFERENCE / "config.pbtxt")):
        rendered[name] = parse_model_config(fill_template(path.read_text(), PRODUCT_VALUES, source=str(path)),
                                            source=str(path))
    s, r = rendered["standin"], rendered["reference"]
    assert (s.name, s.backend, s.max_batch_size) == (r.name, r.backend, r.max_batch_size)
    assert (s.name, s.backend, s.max_batch_size) == ("tensorrt_llm", "python", 64)
    assert list(s.input) == list(r.input) and list(s.output) == list(r.output)
    assert s.model_transaction_policy.decoupled
    params = {k: v.string_value for k, v in s.parameters.items()}
    assert {k: v.string_value for k, v in r.parameters.items()}.items() <= params.items()
    assert params["step_ms"] == "5" and params["sender_threads"] == "3"
    assert Path(params["reference_model"]) == (REFERENCE / "1" / "model.py").resolve()
    assert Path(params["text_file"]).is_file()
    model_py = templates / "tensorrt_llm_reference" / "1" / "model.py"
    assert model_py.read_text() == (STANDIN / "1" / "model.py").read_text()
    for folder in ("ensemble", "ensemble_ids", "preprocessing", "tensorrt_llm"):
        product = REPO_ROOT / "triton_model_repo" / folder / "config.pbtxt"
        assert (templates / folder / "config.pbtxt").read_text() == product.read_text()


def test_standin_template_fields_are_all_filled() -> None:
    text = "a @x@ b"
    assert harness.fill_standin_template(text, {"x": "1"}) == "a 1 b"
    with pytest.raises(ValueError, match="no field @y@"):
        harness.fill_standin_template(text, {"x": 1, "y": 2})
    with pytest.raises(ValueError, match="left unfilled: x"):
        harness.fill_standin_template(text, {})


def test_the_standin_is_not_in_the_image() -> None:
    copies = [rest for keyword, rest in dockerfile_instructions() if keyword == "COPY"]
    assert copies and not [c for c in copies if "benchmarks" in c or c.split()[0] == "."]


# ------------------------------------------------------------------------------------------------
# batched steps, tokens and ends
# ------------------------------------------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(round(s, 6))
        self.t += s


def _params(ref, n, **kw):
    return ref.SamplingParams(max_new_tokens=n, **kw)


def test_one_sleep_per_batched_step_and_tokens_from_the_text(ref) -> None:
    clock_time = FakeTime()
    clock = standin.StepClock(0.01, sleep=clock_time.sleep, now=clock_time.now)
    cycle = list(range(1000, 1010))
    gens = [standin.StandinGeneration([1, 2], _params(ref, 4, seed=s), clock, cycle) for s in (0, 3, 8)]
    while not all(g.finished for g in gens):  # the reference Scheduler's turns: each active job once
        for g in gens:
            g.step()
    assert clock_time.sleeps == [0.01] * 4  # one step per turn, not per request
    for g, s in zip(gens, (0, 3, 8)):
        assert g.tokens == standin.expected_tokens(cycle, s, 4) and g.finish_reason == "length"
    assert standin.expected_tokens(cycle, 8, 4) == [1008, 1009, 1000, 1001]  # cycled
    assert clock.running == 0


def test_a_request_arriving_during_a_turn_joins_the_next_step(ref) -> None:
    clock_time = FakeTime()
    clock = standin.StepClock(0.01, sleep=clock_time.sleep, now=clock_time.now)
    a = standin.StandinGeneration([1], _params(ref, 10), clock, [5])
    a.step()
    b = standin.StandinGeneration([1], _params(ref, 10), clock, [5])  # arrives while a runs
    b.step()  # b is last in the turn after a's step began: it waits for the next step
    a.step()  # a is late for that step: no second sleep
    assert clock_time.sleeps == [0.01, 0.01] and clock.steps == 2
    clock_time.t += 0.05  # a slow turn (overload): the next step begins at once, late
    b.step()
    a.step()
    assert clock_time.sleeps == [0.01, 0.01] and clock.late_steps == 1
    assert len(a.tokens) == 3 and len(b.tokens) == 2


def test_end_token_after_min_tokens_and_stop_words(ref) -> None:
    clock = standin.StepClock(0.0)
    cycle = [10, 11, 12, 13, 14, 15]
    gen = standin.StandinGeneration([1], _params(ref, 50, end_id=2, min_tokens=4), clock, cycle, end_id_after=2)
    while not gen.finished:
        gen.step()
    assert gen.tokens == [10, 11, 12, 13] and gen.finish_reason == "end_id"  # min_tokens bans the end token
    no_end = standin.StandinGeneration([1], _params(ref, 3), clock, cycle, end_id_after=2)  # no end_id sent
    while not no_end.finished:
        no_end.step()
    assert no_end.tokens == [10, 11, 12] and no_end.finish_reason == "length"
    words = standin.StandinGeneration([9], _params(ref, 50, stop_words=[[9, 10, 11]]), clock, cycle,
                                      stop_word_end=ref.stop_word_end)
    while not words.finished:
        words.step()
    assert words.tokens == [10, 11] and words.finish_reason == "stop_words"  # matched over prompt + output
    assert clock.running == 0


def test_text_token_ids_leave_out_special_tokens(hf_tokenizer) -> None:
    ids = standin.text_token_ids(hf_tokenizer, f"Hello{hf_tokenizer.eos_token} world")
    assert hf_tokenizer.eos_token_id not in ids and hf_tokenizer.decode(ids) == "Hello world"
    text = (STANDIN / "text.txt").read_text(encoding="utf-8")
    assert hf_tokenizer.decode(standin.text_token_ids(hf_tokenizer, text)) == text


# ------------------------------------------------------------------------------------------------
# sender threads with the reference Scheduler
# ------------------------------------------------------------------------------------------------


class RecordingSink:
    def __init__(self) -> None:
        self.responses: list[tuple[list[int], bool]] = []
        self.threads: set[str] = set()
        self.done = threading.Event()
        self.cancel_checks = 0

    def send_tokens(self, tokens, log_probs, cum_log_prob, final) -> None:
        assert not (self.responses and self.responses[-1][1]), "a response after the FINAL one"
        self.threads.add(threading.current_thread().name)
        self.responses.append((list(tokens), final))
        if final:
            self.done.set()

    def send_error(self, message) -> None:
        raise AssertionError(message)

    def is_cancelled(self) -> bool:
        # The response sender is only touched by the request's sender thread, and never after its
        # final response (a concurrent is_cancelled() racing the final send crashes Triton).
        assert not self.done.is_set(), "is_cancelled() after the final response"
        self.threads.add(threading.current_thread().name)
        self.cancel_checks += 1
        return False


def test_scheduler_with_sender_threads_sends_each_request_in_order(ref) -> None:
    pool = standin.SenderPool(3, check_period_s=10.0)
    clock = standin.StepClock(0.001)
    sched = ref.Scheduler(max_active=4)
    cycle = list(range(100, 140))
    sinks = [RecordingSink() for _ in range(6)]
    for i, sink in enumerate(sinks):
        gen = standin.StandinGeneration([1], _params(ref, 12, seed=i), clock, cycle)
        sched.submit(ref.Job(generation=gen, sink=pool.sink(sink), streaming=True, request_id=f"r{i}"))
    sched.start()
    try:
        assert all(s.done.wait(30) for s in sinks)
    finally:
        sched.shutdown()
        pool.close()
    for i, sink in enumerate(sinks):
        assert [t for tokens, _ in sink.responses for t in tokens] == standin.expected_tokens(cycle, i, 12)
        assert [final for _, final in sink.responses] == [False] * 11 + [True]
        assert len(sink.threads) == 1 and next(iter(sink.threads)).startswith("standin-sender-")
        assert sink.cancel_checks == 1  # cached for the check period, not asked every step
    assert len({next(iter(s.threads)) for s in sinks}) == 3  # requests spread over the threads
    assert pool.sent == 6 * 12 and pool.failed == 0


def test_a_failed_send_marks_the_request_cancelled(ref) -> None:
    class Broken(RecordingSink):
        def send_tokens(self, *args) -> None:
            raise RuntimeError("sender closed")

    pool = standin.SenderPool(1, check_period_s=0.0)
    sink = pool.sink(Broken())
    sink.send_tokens([1], None, None, False)
    pool.close()
    assert pool.failed == 1 and sink.broken and sink.is_cancelled()


# ------------------------------------------------------------------------------------------------
# the Triton model in a real Triton: the reference's glue with the stand-in's hooks
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standin_triton(tmp_path_factory, checkpoint_dir: Path):
    """A real tritonserver serving the product's ensemble with the stand-in as ``tensorrt_llm`` (as
    scripts/benchmark renders it: the stand-in's templates through setup()'s renderer)."""
    from benchmarks.stack import write_standin_templates
    from tensorrtllm_backend.engine import inspect_weights
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
    from tensorrtllm_backend.templates import RenderOptions, render_model_repository
    from tests.test_reference_model import _free_ports

    tmp = tmp_path_factory.mktemp("standin_triton")
    templates = write_standin_templates(tmp / "templates", step_ms=2, sender_threads=2)
    info = inspect_weights(checkpoint_dir, reference_max_batch_size=4, reference_max_seq_len=2048)
    render_model_repository(RenderOptions(template_dir=templates, model_repo_dir=tmp / "repo", guided_decoding=False),
                            info)
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(locate_tritonserver(work_dir=tmp / "work"),
                          LaunchConfig(model_repo=tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics),
                          log_file=tmp / "triton.log", stop_timeout_s=5)
    server.start()
    try:
        server.wait_ready(180)
        yield {"grpc": f"127.0.0.1:{grpc}", "log": tmp / "triton.log"}
    finally:
        stop_at_once(server)


@pytest.mark.integration
def test_standin_in_triton_streams_the_text_and_answers_stop(standin_triton, hf_tokenizer) -> None:
    """Through Triton's own pb_utils (no fake): each request's tokens are the text cycled from its seed,
    one response per token, and a stop request for a running request's id ends it with an empty final
    response (checked failing with the reference glue's stop made a no-op)."""
    import asyncio

    from cog_triton.streaming.client import GenerateRequest, TritonClient

    cycle = standin.text_token_ids(hf_tokenizer, (STANDIN / "text.txt").read_text(encoding="utf-8"))

    async def scenario() -> tuple[list[list[int]], list[list[int]]]:
        client = TritonClient(standin_triton["grpc"])
        try:
            full = [c.output_ids async for c in client.generate_stream(
                GenerateRequest(input_ids=[1, 2, 3], max_tokens=8, seed=5, request_id="full"))]
            long: list[list[int]] = []

            async def read_long() -> None:
                async for chunk in client.generate_stream(
                        GenerateRequest(input_ids=[1, 2, 3], max_tokens=1500, seed=0, request_id="long")):
                    long.append(chunk.output_ids)

            reader = asyncio.create_task(read_long())
            while len(long) < 3:
                await asyncio.sleep(0.01)
            await client.send_stop_request("long")
            await asyncio.wait_for(reader, 120)  # only "not hung"
            return full, long
        finally:
            await client.aclose()

    full, long = asyncio.run(scenario())
    assert [t for chunk in full for t in chunk] == standin.expected_tokens(cycle, 5, 8)
    assert [len(chunk) for chunk in full if chunk] == [1] * 8  # one response per token
    tokens = [t for chunk in long for t in chunk]
    assert 3 <= len(tokens) < 1500 and tokens == standin.expected_tokens(cycle, 0, len(tokens))
    assert long[-1] == []  # the stopped request's final response has no tokens
    log = standin_triton["log"].read_text()
    assert log.count("stop request for id 'long': 1 running request(s) stopped") == 1


# ------------------------------------------------------------------------------------------------
# scripts/benchmark --smoke on the real stack
# ------------------------------------------------------------------------------------------------


def test_arguments_and_defaults() -> None:
    args = harness.parse_args([])
    assert args.concurrency == [1, 8, 32, 64, 128] and args.tokens == 256 and args.step_ms == 10.0
    assert args.paths == ["tensorrt_llm", "ensemble_ids", "cog", "floor"] and args.sender_threads == 4
    assert args.batch_limit == 128 and args.cog_concurrency == 160
    assert args.groups == [(10.0, [1, 8, 32, 64, 128])]
    assert args.engine_instances == max(1, min(4, len(os.sched_getaffinity(0)) // 4))
    ref_args = harness.parse_args(["--engine", "reference"])
    assert ref_args.concurrency == [1, 2, 4] and ref_args.tokens == 64
    assert ref_args.paths == ["tensorrt_llm", "ensemble_ids", "cog", "cog_json"]  # guidance measured next to cog
    with pytest.raises(SystemExit):
        harness.parse_args(["--paths", "cog,cog_json"])  # the stand-in does not enforce guides
    with pytest.raises(SystemExit):
        harness.parse_args(["--engine", "reference", "--paths", "floor"])  # the floor runs at the stand-in's step
    points = harness.parse_args(["--points", "64@5,128@10,256@20,256@10", "--engine-instances", "3"])
    assert points.groups == [(5.0, [64]), (10.0, [128, 256]), (20.0, [256])]  # one stack start per step
    assert points.concurrency == [64, 128, 256] and points.engine_instances == 3
    assert points.batch_limit == 256 and points.cog_concurrency == 320
    for bad in (["--points", "64"], ["--points", "0@5"], ["--points", "64@5", "--concurrency", "8"],
                ["--points", "64@5", "--soak"], ["--engine-instances", "0"]):
        with pytest.raises(SystemExit):
            harness.parse_args(bad)
    soak = harness.parse_args(["--soak"])
    assert soak.soak_minutes == 10 and soak.soak_streams == 16 and soak.soak_cancel_every == 5
    with pytest.raises(SystemExit):
        harness.parse_args(["--paths", "bogus"])


SMOKE_PATHS = ["tensorrt_llm", "ensemble_ids", "cog", "floor", "cog_lora"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, default_archive: Path) -> Path:
    """``scripts/benchmark --smoke`` with the default paths and the cog_lora path (two adapters made with peft, of
    rank 4), one run for the tests of both (one stack start); its output folder."""
    tmp = tmp_path_factory.mktemp("smoke")
    out = tmp / "bench"
    result = subprocess.run(
        [str(REPO_ROOT / "scripts" / "benchmark"), "--smoke", "--paths", ",".join(SMOKE_PATHS), "--lora-adapters", "2",
         "--lora-rank", "4", "--out", str(out)],
        cwd=tmp, capture_output=True, text=True, timeout=280, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_run_delivers_every_token_on_every_path(smoke_run: Path) -> None:
    out = smoke_run
    doc = json.loads((out / "results.json").read_text())
    meta = doc["meta"]
    assert meta["engine"] == "standin" and meta["paths"] == SMOKE_PATHS
    assert meta["concurrency"] == [1, 4] and meta["tokens"] == 32
    assert meta["stream_interval_ms"] == 50 and meta["stream_processes"] >= 1
    assert {(p["path"], p["streams"]) for p in doc["points"]} == {
        (path, streams) for path in meta["paths"] for streams in meta["concurrency"]}
    for p in doc["points"]:
        where = f"{p['path']} x {p['streams']}"
        assert p["requests"] == p["streams"] * meta["rounds"], where
        assert p["errors"] == 0 and p["error_messages"] == {}, (where, p["error_messages"])
        assert p["count_mismatches"] == 0 and p["content_mismatches"] == 0, (where, p["mismatch_samples"])
        assert p["tokens"] == p["expected_tokens"] == p["requests"] * meta["tokens"], where
        assert p["tokens_per_s"] > 0 and p["ttft_s"]["p50"] is not None and p["gap_s"]["p99"] is not None
        assert p["ratio_to_direct"] is not None and p["engine_send_failures"] == 0
        assert p["step_ms"] == 10.0 and p["ratio_to_ideal"] == round(p["tokens_per_s"] / (p["streams"] * 100.0), 3)
        roles = ("floor_cog_server", "floor_cog_worker", "loadgen") if p["path"] == "floor" else harness.CORE_ROLES
        for role in roles:
            assert isinstance(p["cpu_us_per_token"].get(role), float), (where, role, p["cpu_us_per_token"])
        assert p["cpu_us_per_token_servers"] is not None
        assert p["busiest_process"]["role"] in p["cpu_us_per_token"], where
        if p["path"] == "cog":  # the predictor's own TTFT metric, and the ratio to the bare predictor
            assert p["server_ttft_s"]["p50"] is not None and p["ratio_to_floor"] is not None, where
        if p["path"] in ("cog", "cog_lora"):
            # a prediction's start in steps (the timing metric): each step's median is there, none negative
            phases = p["ttft_phases_s"]
            assert list(phases) == [name for name, _ in TTFT_PHASES], where
            assert all(v["p50"] is not None and v["p50"] >= -0.002 for v in phases.values()), (where, phases)
        elif p["path"] == "floor":  # when its predict() began, only: coglet's own part of the burst
            first, *rest = p["ttft_phases_s"].values()
            assert first["p50"] is not None and all(v["p50"] is None for v in rest), (where, p["ttft_phases_s"])
        else:
            assert not p.get("ttft_phases_s"), where
    table = (out / "results.md").read_text()
    assert "| path | streams | step | tokens/s | vs ideal | vs direct | vs floor |" in table
    assert "| path | streams | step | TTFT p50 | coglet to predict() |" in table
    assert "stub:tensorrt_llm" in table and "stream_proc" in table and "floor_cog_worker" in table
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "results.png").stat().st_size > 0


def test_the_lora_path_is_opt_in_and_stand_in_only() -> None:
    args = harness.parse_args(["--paths", "cog,cog_lora", "--lora-adapters", "3", "--lora-rank", "8"])
    assert args.paths == ["cog", "cog_lora"] and (args.lora_adapters, args.lora_rank) == (3, 8)
    assert "cog_lora" not in harness.parse_args([]).paths
    assert "cog_lora" not in harness.parse_args(["--engine", "reference"]).paths
    for bad in (["--engine", "reference", "--paths", "cog_lora"], ["--lora-adapters", "0"], ["--lora-rank", "65"]):
        with pytest.raises(SystemExit):
            harness.parse_args(bad)


def test_lora_requests_mix_the_adapters_round_robin_and_expect_the_same_text() -> None:
    work = harness.Workload(harness.parse_args(["--paths", "cog,cog_lora", "--tokens", "8"]))
    work.adapter_urls = ["http://a/0.tar.gz", "http://a/1.tar.gz", "http://a/2.tar.gz"]
    requests = [work.request("cog_lora", i) for i in range(6)]
    assert [r["body"]["input"]["lora_weights"] for r in requests] == work.adapter_urls * 2
    for i, request in enumerate(requests):
        plain = work.request("cog", i)
        assert request["expect_text"] == plain["expect_text"]
        assert {k: v for k, v in request["body"]["input"].items() if k != "lora_weights"} == plain["body"]["input"]


def test_the_lora_table_compares_each_stream_count_with_no_adapter() -> None:
    def point(path: str, streams: int, rate: float, servers: float) -> dict:
        return {"path": path, "streams": streams, "tokens_per_s": rate, "cpu_us_per_token_servers": servers,
                "cpu_us_per_token": {"stream_proc": servers / 2, "stub:tensorrt_llm": servers / 4}}

    doc = {"meta": {"concurrency": [4, 16], "lora_adapters": 4, "lora_rank": 16},
           "points": [point("cog", 4, 400, 500), point("cog_lora", 4, 380, 530), point("cog", 16, 1600, 280)]}
    lines = harness.lora_lines(doc)
    assert "4 adapters of rank 16" in lines[1]
    assert lines[-1] == "| 4 | 100.0 | 95.0 | 0.95 | 500 | 530 | +30 | 250 | 265 | 125 | 132 |"
    assert not harness.lora_lines({"meta": {"concurrency": [4]}, "points": [point("cog", 4, 1, 1)]})


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_run_with_adapters_delivers_every_token(smoke_run: Path) -> None:
    """The cog_lora path end to end (in the smoke run): two adapters made with peft, mixed over the streams; every
    prediction gets exactly the stand-in's tokens, each adapter is downloaded once (in the warm-up)."""
    out = smoke_run
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["lora_adapters"] == 2 and doc["meta"]["lora_rank"] == 4
    lora = [p for p in doc["points"] if p["path"] == "cog_lora"]
    assert [p["streams"] for p in lora] == doc["meta"]["concurrency"] == [1, 4]
    for p in lora:
        assert p["errors"] == 0 and p["count_mismatches"] == 0 and p["content_mismatches"] == 0, p
        assert p["tokens"] == p["expected_tokens"] == p["streams"] * doc["meta"]["tokens"]
    assert "LoRA adapters (`cog_lora`: 2 adapters of rank 4" in (out / "results.md").read_text()
    cog_log = (out / "work" / "cog.log").read_text()
    assert cog_log.count("lora_task_id") == 2, "each adapter is resolved once, in the warm-up"


@pytest.mark.integration
@pytest.mark.parametrize("tokens", [pytest.param(32, id="short"), pytest.param(96, id="long", marks=pytest.mark.soak)])
def test_at_128_streams_every_prediction_gets_exactly_what_the_engine_sent(tmp_path: Path, default_archive: Path,
                                                                           tokens: int) -> None:
    """The lost-token check under overload: 128 concurrent predictions through the real Cog server and
    Triton on this 2-core machine, the stand-in sending from 4 threads (as the C++ backend's several
    response paths can). Over HTTP generate_stream, 107-215 of 256 such predictions ended short
    (cog_triton/streaming/client.py); every prediction must now get every token, its text exactly the decode of
    what the engine sent, and the engine must have sent every response. 32 tokens each by default; 96 in the
    long version (``--soak``)."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [str(REPO_ROOT / "scripts" / "benchmark"), "--paths", "cog", "--concurrency", "128", "--tokens", str(tokens),
         "--rounds", "1", "--sender-threads", "4", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [point] = json.loads((out / "results.json").read_text())["points"]
    assert point["requests"] == 128
    assert point["errors"] == 0, point["error_messages"]  # coglet's spurious 409s are retried, not errors
    assert point["count_mismatches"] == 0 and point["content_mismatches"] == 0, point["mismatch_samples"]
    assert point["incomplete_events"] == 0 and point["engine_send_failures"] == 0
    assert point["tokens"] == point["expected_tokens"] == 128 * tokens


# ------------------------------------------------------------------------------------------------
# --engine pytorch: the PyTorch-backend model over the paced LLM API stand-in
# ------------------------------------------------------------------------------------------------


def test_the_pytorch_wrapper_has_the_product_models_tensors_and_the_reference_placeholders(tmp_path: Path) -> None:
    """setup() renders the wrapper as tensorrt_llm_reference (every reference value must name a placeholder there),
    and Triton serves it with the product PyTorch-backend model's tensors and parameters."""
    from tensorrtllm_backend.templates import RenderOptions, template_values

    templates = harness.write_pytorch_standin_templates(tmp_path / "t", step_ms=7)
    path = templates / "tensorrt_llm_reference" / "config.pbtxt"
    wrapper = parse_model_config(fill_template(path.read_text(), PRODUCT_VALUES, source=str(path)), source=str(path))
    info_values = template_values(RenderOptions(template_dir=REPO_ROOT / "triton_model_repo", model_repo_dir=Path("/x"),
                                                llm_args={"model": "/w"}), _weights())["tensorrt_llm_pytorch"]
    product_path = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_pytorch" / "config.pbtxt"
    product = parse_model_config(fill_template(product_path.read_text(), info_values, source="p"), source="p")
    assert list(wrapper.input) == list(product.input) and list(wrapper.output) == list(product.output)
    assert (wrapper.name, wrapper.backend, wrapper.max_batch_size) == ("tensorrt_llm", "python", 64)
    assert list(wrapper.instance_group) == list(product.instance_group)  # one instance: one LLM per GPU
    params = {k: v.string_value for k, v in wrapper.parameters.items()}
    assert params["step_ms"] == "7" and params["cancellation_check_period_ms"] == "100.0"
    assert params["hf_model_dir"] == "/weights" and params["max_seq_len"] == "200"
    assert params["images"] == "false"  # the benchmark's requests are text
    product_code = templates / "tensorrt_llm_pytorch_code" / "1"
    assert Path(params["pytorch_model"]) == (product_code / "model.py").resolve()
    assert (product_code / "model.py").read_text() == (product_path.parent / "1" / "model.py").read_text()
    assert {p.name for p in product_code.iterdir()} >= {"parsing.py", "triton_glue.py", "samplers.py"}
    assert (Path(params["standin_root"]) / "tensorrt_llm" / "__init__.py").is_file()
    assert (templates / "tensorrt_llm_reference" / "1" / "model.py").read_text() == (
        REPO_ROOT / "benchmarks" / "standin_pytorch" / "1" / "model.py").read_text()


def _weights():
    from tensorrtllm_backend.engine import ModelLimits, WeightsInfo

    return WeightsInfo(kind="hf_checkpoint", weights_dir=Path("/weights"), tokenizer_dir=Path("/weights"),
                       limits=ModelLimits(max_batch_size=64, max_input_len=100, max_seq_len=200))


def test_the_pytorch_engine_runs_the_paced_paths_only() -> None:
    args = harness.parse_args(["--engine", "pytorch"])
    assert args.paths == ["tensorrt_llm", "ensemble_ids", "cog", "floor"] and args.engine_instances == 1
    assert args.tokens == 256 and args.concurrency == [1, 8, 32, 64, 128]
    for bad in (["--engine", "pytorch", "--paths", "cog,cog_json"], ["--engine", "pytorch", "--paths", "cog_lora"],
                ["--engine", "pytorch", "--engine-instances", "2"]):
        with pytest.raises(SystemExit):
            harness.parse_args(bad)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_smoke_run_of_the_pytorch_engine_delivers_every_token(tmp_path: Path, default_archive: Path) -> None:
    """scripts/benchmark --engine pytorch: the real Cog server and predictor, setup() rendering the wrapper, the
    product's PyTorch-backend model over the paced LLM API stand-in; direct (tensorrt_llm, ensemble) and cog get
    exactly the stand-in text's tokens."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [str(REPO_ROOT / "scripts" / "benchmark"), "--smoke", "--engine", "pytorch", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["engine"] == "pytorch" and doc["meta"]["paths"] == ["tensorrt_llm", "ensemble_ids", "cog", "floor"]
    for p in doc["points"]:
        assert p["errors"] == 0 and p["count_mismatches"] == 0 and p["content_mismatches"] == 0, p
        assert p["tokens"] == p["expected_tokens"] == p["requests"] * doc["meta"]["tokens"], p["path"]
        assert p["step_ms"] == 10.0 and p["ratio_to_ideal"] is not None
    triton_log = (out / "work" / "triton.log").read_text(errors="replace")
    assert "[tensorrt_llm pytorch] LLM ready" in triton_log and '\\"max_batch_size\\": 8' in triton_log
    assert "the PyTorch-backend model over the paced LLM API stand-in" in (out / "results.md").read_text()


# ------------------------------------------------------------------------------------------------
# the load generator's HTTP/SSE parsing
# ------------------------------------------------------------------------------------------------


def _chunked_sse(events: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body


@pytest.mark.parametrize("split", [1, 3, 7, 64, 10_000])
def test_loadgen_parses_chunked_sse_however_it_is_split(split: int) -> None:
    from benchmarks.loadgen import SSEParser, triton_ids

    events = [b'data: {"output_ids":[%d],"sequence_length":1}\n\n' % i for i in range(20)]
    events.append(b'event: completed\ndata: {"status": "succeeded"}\n\n')
    got, ends = [], []
    parser = SSEParser(lambda name, data, t: got.append((name, data)), ends.append)
    raw = _chunked_sse(events)
    for i in range(0, len(raw), split):
        parser.feed(raw[i:i + split], 0.0)
    assert ends == [None] and parser.status == 200
    assert [triton_ids(d) for _, d in got[:-1]] == [[i] for i in range(20)]
    assert got[-1] == ("completed", b'{"status": "succeeded"}')


def test_loadgen_reads_errors_and_end_token_finals() -> None:
    from benchmarks.loadgen import SSEParser, triton_ids

    assert triton_ids(b'{"model_name":"ensemble_ids","output_ids":[5,6],"sequence_length":1}') == [5]
    assert triton_ids(b'{"output_ids":[],"sequence_length":0}') == []
    assert triton_ids(b'{"error":"boom"}') is None and triton_ids(b'{"id":"x"}') is None
    ends = []
    parser = SSEParser(lambda *a: None, ends.append)
    parser.feed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 15\r\n\r\n{\"error\":\"bad\"}", 0.0)
    parser.closed()
    assert ends == [None] and parser.status == 400 and parser.error_body == b'{"error":"bad"}'
    broken = SSEParser(lambda *a: None, ends.append)
    broken.feed(b"garbage\r\n\r\n", 0.0)
    assert ends[-1].startswith("illegal status line")


def test_loadgen_retries_coglets_spurious_409_and_counts_it() -> None:
    """coglet 0.23.1 can answer "409 At capacity" with free slots (benchmarks/loadgen.py RETRIES_409):
    the load generator retries, keeps the first attempt's start time, and reports the retries."""
    import socketserver

    from benchmarks.loadgen import run_sweep, summarize

    answers = {"n": 0}
    busy = b'{"error":"At capacity - all prediction slots busy","status":"failed"}'

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += self.rfile.read(1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            self.rfile.read(length)
            answers["n"] += 1
            if answers["n"] <= 2:
                self.wfile.write(b"HTTP/1.1 409 Conflict\r\nContent-Length: %d\r\n\r\n%s" % (len(busy), busy))
                return
            self.wfile.write(_chunked_sse([
                b'event: output\ndata: {"chunk": "Hi"}\n\n',
                b'event: completed\ndata: {"status": "succeeded", "metrics": {"output_token_count": 1}}\n\n',
            ]))

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        spec = {"path": "cog", "host": "127.0.0.1", "port": server.server_address[1], "url_path": "/predictions",
                "concurrency": 1, "tokens": 1, "timeout_s": 30,
                "requests": [{"body": {"input": {"prompt": "x"}}, "expect_text": "Hi"}]}
        results, t0, t1 = run_sweep(spec)
        server.shutdown()
    summary = summarize(spec, results, t0, t1, 0.0)
    assert answers["n"] == 3
    assert summary["errors"] == 0 and summary["succeeded"] == 1 and summary["retried_409"] == 2
    assert summary["count_mismatches"] == 0 and summary["content_mismatches"] == 0
    assert results[0].ttft is not None and results[0].ttft >= 0.01  # from the first attempt: two 5 ms waits


def test_guided_requests_are_checked_against_their_schema_not_a_token_count() -> None:
    from benchmarks.loadgen import Result, check

    schema = harness.GUIDED_SCHEMA
    good = {"title": "Gutenberg Bible", "year": 1455, "language": "Latin", "printer": {"name": "Gutenberg"}}
    request = {"body": {}, "expect_json_schema": schema}

    def result(text: str, tokens: int) -> Result:
        res = Result(0)
        res.text, res.tokens = [text[:5], text[5:]], tokens
        return res

    assert check(result(json.dumps(good), 30), request, "cog_json", 64) == {"count_ok": True, "content_ok": True}
    assert check(result(json.dumps({**good, "year": 2024}), 30), request, "cog_json", 64)["content_ok"] is False
    assert check(result(json.dumps(good)[:-1], 64), request, "cog_json", 64)["content_ok"] is False  # cut short
    assert check(result(json.dumps(good), 0), request, "cog_json", 64)["count_ok"] is False
    work_body = harness.Workload.body(types.SimpleNamespace(tokens=64), "cog_json", 7)
    assert json.loads(work_body["input"]["json_schema"]) == schema and "min_tokens" not in work_body["input"]


@pytest.mark.integration
@pytest.mark.parametrize("seconds", [pytest.param(15, id="short"), pytest.param(30, id="long", marks=pytest.mark.soak)])
def test_short_soak_recovers_from_a_killed_stub_and_reports_it(tmp_path: Path, default_archive: Path,
                                                               seconds: int) -> None:
    """`--soak --smoke`: 4 streams through Cog for 15 s (30 s in the long version, ``--soak``), every 5th
    prediction cancelled, the tensorrt_llm stub SIGKILLed at 40%. Only predictions in flight at the kill may fail;
    Triton is restarted once; predictions started afterwards succeed with exactly the engine's tokens (a stream
    goes on until the end of the soak, and a prediction that arrives while Triton restarts waits for it); the
    report has every process's RSS at start and end."""
    out = tmp_path / "soak"
    result = subprocess.run(
        [str(REPO_ROOT / "scripts" / "benchmark"), "--soak", "--smoke", "--soak-minutes", f"{seconds / 60:.4f}",
         "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    soak = json.loads((out / "soak.json").read_text())["soak"]
    s = soak["summary"]
    assert soak["kill"]["role"] == "stub:tensorrt_llm"
    assert s["triton_restarts"] == 1
    assert s["errors"] == s["errors_after_kill"] == s["in_flight_at_kill_failed"] <= 4, s["error_messages"]
    # Each error names the killed stub's model, or Triton's own death: Triton 2.51 sometimes aborts (SIGABRT) when
    # the tensorrt_llm stub dies under a running request, before the supervisor's next look at the stubs (as in
    # tests/test_faults.py); the messages are cut at 300 characters.
    assert all("tensorrt_llm" in m or "Triton was killed by SIGABRT" in m for m in s["error_messages"]), \
        s["error_messages"]
    assert s["recoveries"] > 0 and s["first_success_after_kill_s"] is not None
    assert s["count_mismatches"] == 0 and s["content_mismatches"] == 0
    assert s["canceled"] > 0 and s["canceled"] + s["cancel_too_late"] <= s["cancel_requested"]
    for when in ("start", "end"):
        rss = soak["rss_bytes"][when]
        assert all(rss.get(role) for role in ("tritonserver", "cog_worker", "cog_server", "stub:tensorrt_llm")), rss
    assert "Triton restarts" in (out / "soak.md").read_text()
    assert f"for {seconds / 60:.4g} min" in (out / "soak.md").read_text()


def test_the_ttft_phases_add_up_to_the_clients_ttft() -> None:
    """Each result's steps, from the client's request to predict() (the client's clock, perf_counter, is moved to
    time.monotonic) through the timing metric's marks to the client's first chunk, add up to its TTFT; a result
    without every mark is left out."""
    import time

    offset = time.monotonic() - time.perf_counter()
    res = Result(0)
    res.start, res.ttft, res.server_ttft = 100.0, 0.050, 0.030
    run_at = 100.0 + offset + 0.004
    res.timing = {"run_at_monotonic": run_at, "start_sent_s": 0.001, "start_received_s": 0.002, "prepared_s": 0.005,
                  "first_text_sent_s": 0.031, "first_text_relayed_s": 0.033, "first_text_yielded_s": 0.040}
    partial = Result(1)
    partial.start, partial.ttft, partial.timing = 100.0, 0.05, {"run_at_monotonic": run_at}
    phases = ttft_phases([res, partial])
    values = {name: v[0] for name, v in phases.items()}
    assert len(phases["coglet to predict()"]) == 2  # the partial one (a floor prediction) has that step only
    assert all(len(v) == 1 for name, v in phases.items() if name != "coglet to predict()")
    assert abs(sum(values.values()) - 0.050) < 1e-3
    assert abs(values["coglet to predict()"] - 0.004) < 1e-3 and abs(values["engine's first token"] - 0.025) < 1e-9
    assert abs(values["coglet to the client"] - 0.006) < 1e-3
    assert len(ttft_phases([partial])["coglet to predict()"]) == 1
    assert ttft_phases([Result(2)]) == {}
