"""Faults must not take the service down: the real Cog server (coglet) and Triton, with faults made
for real (a Python backend stub or Triton killed, Triton stopped with SIGSTOP, hostile inputs).

The tests share the session's ``fault_stack`` (tests/conftest.py) with the fault tests of
tests/test_integration.py; every test leaves it serving. Each fault test checks three things: the
running prediction fails fast with an error that names the fault, the health check says what
coglet users need to know, and the next prediction succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env
from tensorrtllm_backend.server import SHM_DIR, SHM_PREFIX, pid_namespace, shm_region_owner
from tests.proc import descendants_of, pids_mentioning, wait_for_pids_gone

pytestmark = pytest.mark.integration

LONG = {"prompt": "Write a very long story about a robot.", "max_tokens": 400, "min_tokens": 400, "temperature": 0}
SHORT = {"prompt": "Say hi.", "max_tokens": 3, "temperature": 0}


@pytest.fixture
def stack(fault_stack):
    """The session's fault stack (tests/conftest.py: a Cog server + Triton that these tests may break, each
    leaving it serving); a dict of handles."""
    return fault_stack


def triton_pid(stack) -> int:
    pids = pids_mentioning("tritonserver", f"--model-repository={stack['repo']}")
    assert len(pids) == 1, pids
    return pids[0]


def stub_pid(stack, model: str) -> int:
    pids = pids_mentioning("triton_python_backend_stub", str(stack["repo"] / model / "1" / "model.py"))
    assert len(pids) == 1, (model, pids)
    return pids[0]


def start_stream(stack, inputs: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any], threading.Event]:
    """Run a prediction over SSE in a thread; the event is set once its first output arrived."""
    result: dict[str, Any] = {"chunks": []}
    first = threading.Event()

    def run() -> None:
        for name, data in stack["cog"].stream(inputs):
            if name == "output":
                result["chunks"].append(data["chunk"])
                first.set()
            elif name == "completed":
                result["final"] = data
                result["done"] = time.monotonic()
        first.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result, first


def wait_for_end(runs: list[dict[str, Any]], bound_s: float, what: str) -> None:
    """Wait until one of ``runs`` (start_stream's results) has its completed event, for at most ``bound_s``
    (a bound that comes from this run); fail at once, naming ``what`` did not happen, when none has."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and not any("final" in run for run in runs):
        time.sleep(0.05)
    assert any("final" in run for run in runs), f"{what} within {bound_s:.1f} s"


def shm_regions_owned_by(pids: set[int]) -> set[str]:
    """The names of our /dev/shm regions (``cogtriton<pid namespace>p<owner pid>x<n>r<rank>_...``) of this PID
    namespace whose owner is in ``pids``."""
    namespace = pid_namespace()
    owned = set()
    for path in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        owner = shm_region_owner(path.name)
        if owner is not None and owner[0] == namespace and owner[1] in pids:
            owned.add(path.name)
    return owned


def stream_pids(cog: CogServer) -> list[int]:
    """The predictor's stream processes (python -m cog_triton.streaming.streamer) under this Cog server."""
    assert cog.proc is not None
    return sorted(set(pids_mentioning("cog_triton.streaming.streamer")) & descendants_of(cog.proc.pid))


def health(stack) -> dict[str, Any]:
    return stack["cog"].health()


def wait_for_health(stack, status: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc = health(stack)
    while doc["status"] != status and time.monotonic() < deadline:
        time.sleep(0.1)
        doc = health(stack)
    return doc


def serves_again(stack) -> None:
    good = stack["cog"].predict(SHORT, timeout_s=400)
    assert good["status"] == "succeeded", good
    assert wait_for_health(stack, "READY", 30)["status"] == "READY"


def test_the_stack_is_healthy_and_the_healthcheck_runs(stack) -> None:
    doc = health(stack)
    assert doc["status"] == "READY" and "user_healthcheck_error" not in doc, doc


@pytest.mark.parametrize("model", ["preprocessing", "tensorrt_llm"])
def test_a_killed_stub_fails_the_running_prediction_fast_and_triton_restarts(stack, model: str) -> None:
    """kill -9 of a Python backend stub: Triton never restarts it (python_backend r24.06+) and on 2.51
    still reports every model ready. Before: the running prediction hung for 122 s and every later one
    failed with "Stub process is not healthy"."""
    pid = stub_pid(stack, model)
    started = time.monotonic()
    thread, result, first = start_stream(stack, LONG)
    assert first.wait(120) and result["chunks"], result
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    # Failed within twice the time the run took to its first output (a few tokens of the 400; both slow down
    # alike on a loaded machine): not at the 120-s no-token timeout, nor at the end of the ~20-s generation.
    first_output = max(killed - started, 1.0)
    wait_for_end([result], 2 * first_output, f"the prediction did not fail after the {model} stub was killed")
    thread.join(timeout=10)
    final = result["final"]
    assert final["status"] == "failed", final
    # Triton 2.51 itself sometimes aborts (SIGABRT) when the tensorrt_llm stub dies under a running request,
    # before the supervisor's next look at the stubs: then the error names Triton's death. Either way the
    # prediction fails naming the fault and the restart.
    error = final["error"]
    stub_named = f"stub of model '{model}'" in error and "restarting" in error
    triton_aborted = "Triton was killed by SIGABRT" in error and "being restarted" in error
    assert stub_named or triton_aborted, error
    serves_again(stack)
    assert stub_pid(stack, model) != pid


def test_a_killed_stream_process_fails_only_its_prediction_and_is_restarted(stack) -> None:
    """kill -9 of one of the two stream processes while each streams a prediction: the prediction it
    carried fails at once, naming it; the other one completes; health stays READY (the pool restarts
    it) and both processes serve again."""
    before = stream_pids(stack["cog"])
    assert len(before) == 2, before
    started = time.monotonic()
    runs = [start_stream(stack, {**LONG, "max_tokens": 150, "min_tokens": 150, "seed": n}) for n in range(2)]
    for _, result, first in runs:
        assert first.wait(120) and result["chunks"], result
    victim = before[0]
    first_outputs = time.monotonic() - started
    os.kill(victim, signal.SIGKILL)
    # The lost prediction fails within twice the time both streams took to their first outputs: not at the end
    # of the survivor's run (the bound comes from this run, so it grows with the machine's load).
    wait_for_end([result for _, result, _ in runs], 2 * max(first_outputs, 1.0),
                 f"no prediction failed after the stream process {victim} was killed")
    for thread, _, _ in runs:
        thread.join(timeout=600)  # the survivor's own run: only "not hung" (a CPU model, maybe a loaded machine)
        assert not thread.is_alive(), "the surviving prediction did not end"
    finals = [result["final"] for _, result, _ in runs]
    failed = [f for f in finals if f["status"] == "failed"]
    assert len(failed) == 1 and [f["status"] for f in finals].count("succeeded") == 1, finals
    assert f"stream process stream-0 (pid {victim}) was killed by signal 9" in failed[0]["error"] or (
        f"(pid {victim}) was killed by signal 9" in failed[0]["error"]), failed[0]["error"]
    assert health(stack)["status"] == "READY"
    deadline = time.monotonic() + 60
    while (len(stream_pids(stack["cog"])) < 2 or victim in stream_pids(stack["cog"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    after = stream_pids(stack["cog"])
    assert len(after) == 2 and victim not in after, after
    for _ in range(2):  # least-loaded routing sends these to both processes in turn
        serves_again(stack)
    assert "restarting stream process" in (stack["work"] / "cog.log").read_text(errors="replace")


def test_a_stopped_triton_is_unhealthy_fails_fast_and_is_restarted(stack) -> None:
    """SIGSTOP: before, the prediction failed only at the 120 s no-token timeout, and health said READY."""
    pid = triton_pid(stack)
    started = time.monotonic()
    thread, result, first = start_stream(stack, LONG)
    assert first.wait(120) and result["chunks"], result
    stopped = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        seen = []
        deadline = time.monotonic() + 60  # only "not hung"
        while time.monotonic() < deadline:
            doc = health(stack)
            seen.append(doc["status"])
            if doc["status"] == "UNHEALTHY":
                assert "stopped" in doc["user_healthcheck_error"], doc
                break
            time.sleep(0.05)
        assert "UNHEALTHY" in seen, seen
        # Failed within twice the time the run took to its first output (before: only at the 120-s no-token timeout).
        first_output = max(stopped - started, 1.0)
        wait_for_end([result], 2 * first_output, "the prediction did not fail after Triton was stopped")
        thread.join(timeout=10)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)  # in case the supervisor has not killed it
        except ProcessLookupError:
            pass
    final = result["final"]
    assert final["status"] == "failed" and "stopped" in final["error"], final
    serves_again(stack)
    assert triton_pid(stack) != pid


def test_a_prediction_sent_while_triton_restarts_waits_for_it(stack) -> None:
    """Before: is_alive() was true as soon as the new Triton was spawned, so a prediction arriving
    during the restart failed with "Connection refused"."""
    log = stack["work"] / "cog.log"
    offset = log.stat().st_size
    pid = triton_pid(stack)
    os.kill(pid, signal.SIGKILL)
    # Sent once the killed process has exited: Triton is then down or restarting. A prediction sent while it is
    # still exiting goes to a Triton that is alive as far as anyone can see, and is in flight at its death, which
    # fails fast by design (test_triton_death_fails_prediction_fast_then_recovers). This test sent at once and
    # relied on its client's 70 ms of building an SSL context per request (common/http.py) to land after the exit.
    # "Exited" is every thread of it gone: its main thread shows Z before its other threads have exited. Taking that
    # Z for gone, this test failed twice more (test_server.py's leader-thread test; tests/proc.py reads liveness so).
    assert wait_for_pids_gone([pid], 30), "the killed Triton did not exit"
    doc = stack["cog"].predict(SHORT, timeout_s=400)
    assert doc["status"] == "succeeded", doc
    with log.open("rb") as fh:  # only what was logged after the kill
        fh.seek(offset)
        new = fh.read().decode("utf-8", "replace")
    assert new.count("Triton was killed by SIGKILL; failing the running predictions and restarting Triton") == 1
    assert new.count("Triton restarted (") == 1, new[-3000:]
    assert triton_pid(stack) != pid


def handed_to(stack, model: str = "tensorrt_llm") -> int:
    """How many requests Triton has handed to ``model``'s execute() (its statistics' inference_count: a decoupled
    Python model counts a request once execute() returned it queued or running)."""
    stats = httpx.get(f"{stack['triton']}/v2/models/{model}/stats", timeout=30).json()
    return int(stats["model_stats"][0]["inference_count"])


def resend_after_triton_died(stack, short: dict[str, Any], long: dict[str, Any]) -> None:
    """One batch slot (the stack's model takes one request at a time): ``long`` holds it, generating; ``short``
    waits in Triton for it, with no token; Triton is killed. The prediction that had tokens fails naming Triton's
    death, as before; the one that had none waits for the restart and is sent once more: it succeeds with the same
    text as alone (greedy), each part of it once."""
    alone = stack["cog"].predict(short, timeout_s=400)
    assert alone["status"] == "succeeded" and alone["output"], alone
    log = stack["work"] / "cog.log"
    offset = log.stat().st_size
    before = handed_to(stack)
    running, running_result, first = start_stream(stack, long)
    assert first.wait(120) and running_result["chunks"], running_result
    waiting, waiting_result, _ = start_stream(stack, short)
    deadline = time.monotonic() + 120  # only "not hung": the request reaches the model and waits for the slot
    while handed_to(stack) < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handed_to(stack) == before + 2, "the second prediction never reached the model"
    assert not waiting_result["chunks"], "it had a token before Triton died: the test tells nothing"
    pid = triton_pid(stack)
    os.kill(pid, signal.SIGKILL)
    running.join(timeout=120)
    waiting.join(timeout=600)  # the restart, then the whole short generation: only "not hung"
    assert not running.is_alive() and not waiting.is_alive()
    failed = running_result["final"]
    assert failed["status"] == "failed" and "SIGKILL" in failed["error"], failed
    served = waiting_result["final"]
    assert served["status"] == "succeeded", served
    assert "".join(waiting_result["chunks"]) == "".join(alone["output"]), (waiting_result["chunks"], alone["output"])
    with log.open("rb") as fh:  # only what was logged since the test began
        fh.seek(offset)
        new = fh.read().decode("utf-8", "replace")
    assert new.count("before any token: sending it once more when Triton is back") == 1, new[-3000:]
    assert triton_pid(stack) != pid
    serves_again(stack)


@pytest.fixture(scope="module")
def one_slot_stack(tmp_path_factory, default_archive: Path):
    """A stack whose reference model runs one request at a time (COG_TRITON_REFERENCE_MAX_BATCH_SIZE=1): a second
    prediction waits in Triton without a token while the first generates."""
    from tests.stacks import STACK_SETTINGS, cog_stack

    settings = {**STACK_SETTINGS, "COG_TRITON_REFERENCE_MAX_BATCH_SIZE": "1"}
    with cog_stack(tmp_path_factory, default_archive, "one_slot_stack", slots=2, **settings) as stack:
        yield stack


def test_a_prediction_waiting_in_triton_when_it_dies_is_sent_again_after_the_restart(one_slot_stack) -> None:
    """The C++ path (the reference model stands for the C++ backend): before, the waiting prediction failed with
    Triton's death though nothing of it had been generated."""
    resend_after_triton_died(one_slot_stack, SHORT, LONG)


def _gaps(stamps: list[float], start: float, end: float) -> list[float]:
    """The gaps between consecutive arrivals whose later arrival lies in [start, end]."""
    return [b - a for a, b in zip(stamps, stamps[1:]) if start <= b <= end]


def test_hostile_inputs_do_not_stall_a_running_stream(stack) -> None:
    """An 80,000-entry stop_sequences, a 10 MB system prompt and a 1,000,000-character prompt while a
    stream runs: each is refused with what was wrong (the first two by coglet from the schema's bounds,
    the prompt from its token floor, never tokenized), and the serving layer does not stall the stream.

    What the stream's gaps are measured against: a second generation read straight from Triton's
    ensemble at the same time, batched with it in the same engine. On this 2-core machine the CPU
    reference model itself slows while the hostile requests take CPU (each of its steps runs torch on
    both cores), and that shows in both streams; a stall in coglet, the Cog worker or a stream process
    shows only in the one through Cog. Margin: twice the Cog stream's own cadence (the stream interval,
    as measured before the hostile requests), or twice the excess of its largest gap over the direct
    stream's before them, whichever is larger (both from this run)."""
    inputs = {**LONG, "max_tokens": 200, "min_tokens": 200}
    thread, result, first = start_stream(stack, inputs)
    assert first.wait(120)
    stamps: list[float] = []
    count = [0]

    def watch() -> None:  # the arrival time of each new chunk
        while thread.is_alive():
            n = len(result["chunks"])
            if n > count[0]:
                count[0] = n
                stamps.append(time.monotonic())
            time.sleep(0.005)

    direct: list[float] = []
    direct_started = threading.Event()

    def read_direct() -> None:  # the same engine's pace, without Cog: one event per token
        payload = {"text_input": inputs["prompt"], "max_tokens": 200, "min_tokens": 200, "top_k": 1, "stream": True}
        with httpx.stream("POST", f"{stack['triton']}/v2/models/ensemble_ids/generate_stream", json=payload,
                          timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    direct.append(time.monotonic())
                    direct_started.set()
        direct_started.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    reader = threading.Thread(target=read_direct, daemon=True)
    reader.start()
    assert direct_started.wait(120) and direct, "the direct stream from Triton produced nothing"
    both_from = time.monotonic()
    # Both streams' own pace first: at least 1 s and 6 arrivals of each (more time on a loaded machine).
    deadline = both_from + 120  # only "not hung": each stream arrives many times a second when idle
    while time.monotonic() < deadline and (
        time.monotonic() < both_from + 1.0 or min(len(_gaps(stamps, both_from, 1e12)),
                                                  len(_gaps(direct, both_from, 1e12))) < 5
    ):
        time.sleep(0.05)
    hostile_start = time.monotonic()
    url = f"{stack['cog'].url}/predictions"
    stops = json.dumps([f"s{i}" for i in range(80_000)])
    r1 = httpx.post(url, json={"input": {"prompt": "hi", "stop_sequences": stops}}, timeout=60)
    r2 = httpx.post(url, json={"input": {"prompt": "hi", "system_prompt": "x" * 10_000_000}}, timeout=120)
    r3 = httpx.post(url, json={"input": {"prompt": "word " * 199_999}}, timeout=120).json()
    hostile_end = time.monotonic()
    thread.join(timeout=120)
    reader.join(timeout=120)
    watcher.join(timeout=5)
    assert not thread.is_alive() and not reader.is_alive(), "a stream did not end"
    assert r1.status_code == 422 and "stop_sequences" in r1.text
    assert r2.status_code == 422 and "system_prompt" in r2.text
    assert r3["status"] == "failed" and "the prompt is too long: its 999995 characters are at least" in r3["error"], r3
    assert result["final"]["status"] == "succeeded"
    assert direct[-1] > hostile_end + 0.5, "the direct stream ended before the hostile requests were handled"
    during = _gaps(stamps, hostile_start, hostile_end + 0.5)
    during_direct = _gaps(direct, hostile_start, hostile_end + 0.5)
    assert during and during_direct, "a stream produced nothing while the hostile requests were handled"
    before = _gaps(stamps, both_from, hostile_start)
    before_direct = _gaps(direct, both_from, hostile_start)
    cadence = sorted(before)[len(before) // 2]
    margin = 2 * max(cadence, max(before) - max(before_direct))
    assert max(during) <= max(during_direct) + margin, (max(during), max(during_direct), cadence, before, before_direct)


def test_shutdown_leaves_no_process_and_no_shared_memory(tmp_path, default_archive: Path) -> None:
    """Before: every Cog shutdown left Triton's /dev/shm regions behind (the service's shutdown never
    ran under coglet). Now the regions are removed by the server's stop, by its guardian when the
    predictor dies (here: SIGTERM to coglet and its worker, then SIGKILL), and at the next start."""
    with WeightsHTTPServer(default_archive.parent) as weights:
        env = serving_env(f"{weights.url}/{default_archive.name}", work=tmp_path, COG_TRITON_SELF_TEST="false")
        with CogServer(env, log_file=tmp_path / "cog.log") as cog:
            cog.wait_ready(timeout_s=400)
            assert cog.predict(SHORT)["status"] == "succeeded"
            # Other tests' stacks run beside this one (pytest-xdist) and keep their own regions, so "ours"
            # is the regions whose owner (the process that launched Triton, named in the region) is a
            # process of this Cog server, not whatever appeared meanwhile.
            below = descendants_of(cog.proc.pid)
            ours = shm_regions_owned_by(below)
            assert ours, ("the Python backend keeps its regions in /dev/shm",
                          sorted(p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}*")), sorted(below))
            streamers = stream_pids(cog)
            assert streamers, "the predictor runs stream processes"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and ({p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}*")} & ours):
        time.sleep(0.2)
    assert not ({p.name for p in SHM_DIR.glob(f"{SHM_PREFIX}*")} & ours)
    assert not pids_mentioning("tritonserver", str(tmp_path / "model_repository"))
    assert wait_for_pids_gone(streamers, timeout_s=15), "a stream process outlived the Cog server"
