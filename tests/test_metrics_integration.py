"""The Prometheus endpoint during real runs: the real Cog server (coglet) running predict.py, a real Triton with
the CPU reference model, the endpoint on its own port (COG_TRITON_PROMETHEUS_PORT). Each test scrapes before,
during and after what it does, and checks that the counts moved by exactly what it caused, against what the
predictions themselves reported (their Cog metrics). Nothing is mocked.

One stack for the module (one setup); the test that kills processes runs last. The endpoint listens on 127.0.0.2
(COG_TRITON_PROMETHEUS_ADDRESS), not on the 127.0.0.1 every other stack uses, so that a predictor binding anything
but the configured address fails here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env
from tests.scrape_load import Looping, scrape_times
from tests.proc import descendants_of, listening_on, pid_holding_socket, pids_mentioning, thread_count

pytestmark = pytest.mark.integration

#: Where this module's stack is told to serve its metrics (a loopback address other than 127.0.0.1).
ADDRESS = "127.0.0.2"
#: The endpoint's request timeout here (COG_TRITON_PROMETHEUS_REQUEST_TIMEOUT_S): longer than any test, so that only
#: the connection bound (COG_TRITON_PROMETHEUS_MAX_CONNECTIONS, left at its default) closes an idle connection.
REQUEST_TIMEOUT_S = 900
#: The default bound, which the stack keeps: the documented value (docs/settings.md), not the code's default, so
#: that a default made unbounded fails here.
MAX_CONNECTIONS = 64

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, default_archive: Path):
    work = tmp_path_factory.mktemp("metrics")
    with WeightsHTTPServer(default_archive.parent) as weights:
        env = serving_env(
            f"{weights.url}/{default_archive.name}", work=work, COG_TRITON_REFERENCE_MAX_INPUT_LEN="384",
            COG_TRITON_REFERENCE_MAX_SEQ_LEN="768", COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_STREAM_PROCESSES="2",
            COG_TRITON_PROMETHEUS_ADDRESS=ADDRESS,
            # idle connections are closed only to make room (the bound), never by a request timeout during a test
            COG_TRITON_PROMETHEUS_REQUEST_TIMEOUT_S=str(REQUEST_TIMEOUT_S),
        )
        cog = CogServer(env, log_file=work / "cog.log", max_concurrency=4)
        cog.start()
        try:
            cog.wait_ready(timeout_s=400)
            port = int(env["COG_TRITON_PROMETHEUS_PORT"])
            yield {"cog": cog, "work": work, "url": f"http://{ADDRESS}:{port}/metrics", "port": port}
        finally:
            cog.stop()


def scrape(stack) -> tuple[Samples, str]:
    """Every sample of one scrape (ours and Triton's: the whole answer must parse), and its text."""
    response = httpx.get(stack["url"], timeout=30)
    assert response.status_code == 200, response.text
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, response.text


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return get(after, name, **labels) - get(before, name, **labels)


def wait_until(stack, predicate: Callable[[Samples], bool], timeout_s: float = 120.0) -> Samples:
    """Scrape until ``predicate`` holds (the bound only means "not hung")."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples, _ = scrape(stack)
        if predicate(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


class Streamed:
    """A prediction with a chosen id over SSE, read in a thread (so it can be cancelled while it runs)."""

    def __init__(self, cog: CogServer, inputs: dict[str, Any], prediction_id: str) -> None:
        self.cog, self.id = cog, prediction_id
        self.events: list[tuple[str, Any]] = []
        self.first_output = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(inputs,), daemon=True)
        self.thread.start()

    def _read(self, inputs: dict[str, Any]) -> None:
        with httpx.stream("POST", f"{self.cog.url}/predictions", json={"id": self.id, "input": inputs},
                          headers={"Accept": "text/event-stream"}, timeout=600) as response:
            event = "message"
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    self.events.append((event, json.loads(line[5:])))
                    if event == "output":
                        self.first_output.set()
        self.first_output.set()

    def final(self) -> dict[str, Any]:
        self.thread.join(timeout=600)  # only "not hung"
        event, data = self.events[-1]
        assert event == "completed", self.events[-3:]
        return data


def test_a_scrape_during_and_after_a_run_finds_the_counts_it_caused(stack) -> None:
    cog = stack["cog"]
    before, text = scrape(stack)
    # The self-test of setup is not a prediction; Triton's own metrics come in the same answer.
    assert get(before, "cog_triton_predictions_total", outcome="succeeded") == 0
    assert get(before, "cog_triton_triton_metrics_up") == 1
    # (prometheus_client's parser names a counter's samples <name>_total; Triton's text says nv_inference_count)
    assert get(before, "nv_inference_count_total", model="ensemble_ids", version="1") > 0  # the self-test's request
    assert 'nv_inference_count{model="ensemble_ids",version="1"}' in text
    assert "# TYPE nv_inference_request_success counter" in text

    succeeded = [cog.predict({"prompt": prompt, "max_tokens": n, "temperature": 0})
                 for prompt, n in (("What is a cat?", 12), ("What is rain?", 20), ("Name a colour.", 6))]
    assert all(doc["status"] == "succeeded" for doc in succeeded), succeeded
    refused = cog.predict({"prompt": ""})  # refused by predict()'s validation
    too_long = cog.predict({"prompt": "word " * 1000})  # refused by the stream process (tokenized: too long)
    assert refused["status"] == too_long["status"] == "failed"
    assert "[invalid_input]" in refused["error"] and "too long" in too_long["error"]
    # Triton's own count, in the same endpoint: the ensemble served the 3 (the refused ones never reached it).
    served = wait_until(stack, lambda s: delta(s, before, "nv_inference_request_success_total",
                                               model="ensemble_ids", version="1") >= 3)
    assert delta(served, before, "nv_inference_request_success_total", model="ensemble_ids", version="1") == 3

    # A long prediction: scraped while it streams, then cancelled.
    running = Streamed(cog, {"prompt": "Write a very long story about a robot.", "max_tokens": 400,
                             "min_tokens": 400, "temperature": 0}, f"metrics-cancel-{time.monotonic_ns()}")
    assert running.first_output.wait(300), "no output"
    # (a scrape may be answered by a rendering up to COG_TRITON_PROMETHEUS_REUSE_S old: until it shows the stream)
    during = wait_until(stack, lambda s: get(s, "cog_triton_predictions_running") == 1)
    assert get(during, "cog_triton_predictions_running") == 1
    assert get(during, "cog_triton_predictions_queued") == 0
    assert httpx.post(f"{cog.url}/predictions/{running.id}/cancel", timeout=60).status_code == 200
    cancelled = running.final()
    assert cancelled["status"] == "canceled", cancelled

    made = sum(doc["metrics"]["output_token_count"] for doc in succeeded)
    # The cancelled stream's tokens come from its stream process a moment after the cancel (CANCELLED).
    after = wait_until(stack, lambda s: get(s, "cog_triton_predictions_running") == 0
                       and delta(s, before, "cog_triton_predictions_total", outcome="canceled") == 1
                       and delta(s, before, "cog_triton_generation_tokens_total") > made)
    assert delta(after, before, "cog_triton_predictions_total", outcome="succeeded") == 3
    assert delta(after, before, "cog_triton_predictions_total", outcome="failed") == 2
    assert delta(after, before, "cog_triton_predictions_total", outcome="canceled") == 1
    assert delta(after, before, "cog_triton_prediction_errors_total", code="invalid_input") == 2
    assert get(after, "cog_triton_predictions_running") == get(after, "cog_triton_predictions_queued") == 0

    # Histograms: one time to first token per prediction that got a token (the 3 and the cancelled one), one time
    # per output token per prediction that ended with 2 or more tokens (not the cancelled one).
    with_token = [doc for doc in [*succeeded, cancelled] if "time_to_first_token_s" in doc["metrics"]]
    assert len(with_token) == 4
    assert delta(after, before, "cog_triton_time_to_first_token_seconds_count") == 4
    assert delta(after, before, "cog_triton_time_to_first_token_seconds_sum") == pytest.approx(
        sum(doc["metrics"]["time_to_first_token_s"] for doc in with_token), abs=4e-4)  # Cog's are rounded to 0.1 ms
    assert delta(after, before, "cog_triton_time_per_output_token_seconds_count") == 3
    # Tokens: each prediction's own counts; the cancelled one's prompt counts, and the tokens it made before
    # the cancel (at least the first output, fewer than the 400 asked for).
    assert delta(after, before, "cog_triton_prompt_tokens_total") == sum(
        doc["metrics"]["input_token_count"] for doc in [*succeeded, cancelled])
    cancelled_tokens = delta(after, before, "cog_triton_generation_tokens_total") - made
    assert 1 <= cancelled_tokens < 400
    assert get(after, "cog_triton_triton_restarts_total") == get(after, "cog_triton_stream_process_restarts_total") == 0


def _stream_pids(cog: CogServer) -> list[int]:
    assert cog.proc is not None
    return sorted(set(pids_mentioning("cog_triton.streaming.streamer")) & descendants_of(cog.proc.pid))


def _triton_pid(stack) -> int:
    [pid] = pids_mentioning("tritonserver", f"--model-repository={stack['work'] / 'model_repository'}")
    return pid


def test_the_endpoint_listens_on_the_configured_address_only(stack) -> None:
    """COG_TRITON_PROMETHEUS_ADDRESS=127.0.0.2: the kernel lists the one listening socket on that address (held by
    the Cog worker), a scrape there answers, and 127.0.0.1 refuses the connection."""
    [(address, inode)] = listening_on(stack["port"])
    assert address == ADDRESS
    assert pid_holding_socket(inode, descendants_of(stack["cog"].proc.pid)) is not None
    scrape(stack)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{stack['port']}/metrics", timeout=10)


def test_hundreds_of_idle_connections_add_no_thread_to_the_worker_and_a_scrape_answers(stack) -> None:
    """400 connections to the endpoint that never send a request: the Cog worker's threads stay as they were (the
    thread-per-connection server this replaced grew by 400 and kept them), a scrape answers meanwhile without
    waiting for the idle ones to time out, and the endpoint holds at most its default bound of them (the request
    timeout is longer than the test here: only the bound closes them)."""
    [(_, inode)] = listening_on(stack["port"])
    worker = pid_holding_socket(inode, descendants_of(stack["cog"].proc.pid))
    assert worker is not None
    scrape(stack)  # the endpoint's scrape thread exists from here on
    before = thread_count(worker)
    idle = []
    try:
        for _ in range(400):
            idle.append(socket.create_connection((ADDRESS, stack["port"])))
        started = time.monotonic()
        samples, _ = scrape(stack)  # (within scrape()'s 30-s timeout: no idle connection timed out for it)
        print(f"a scrape behind 400 idle connections: {time.monotonic() - started:.2f} s")
        during = thread_count(worker)
        open_ = set(idle)
        deadline = time.monotonic() + 60  # only "not hung": the endpoint holds at most MAX_CONNECTIONS of them
        while len(open_) > MAX_CONNECTIONS and time.monotonic() < deadline:
            for sock in list(open_):
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        open_.discard(sock)
                except BlockingIOError:
                    pass
                except ConnectionError:
                    open_.discard(sock)
            time.sleep(0.05)
    finally:
        for sock in idle:
            sock.close()
    assert get(samples, "cog_triton_triton_metrics_up") == 1
    assert during - before <= 2, f"the worker's threads went from {before} to {during}"
    assert len(open_) <= MAX_CONNECTIONS, f"{len(open_)} idle connections still held"


@pytest.mark.parametrize("clients", [64, 256])
def test_a_real_scraper_is_answered_however_many_clients_loop(stack, clients: int) -> None:
    """``clients`` connections looping GET /metrics on the Cog worker's endpoint (from another process): a real
    scraper, one scrape after another, is answered every time; its median time is bounded by its baseline (alone,
    in this test) plus two of the looping clients' mean round trips under the same load (a newcomer queues behind
    at most one connection per client); no looping client is turned away. (The endpoint this replaced answered a
    real scraper 12 times of 37 with 64 clients looping.) The figures go to the test's output."""
    baseline = scrape_times(stack["url"], 20)
    with Looping(ADDRESS, stack["port"], clients) as load:
        loaded = scrape_times(stack["url"], 20)
    alone, busy = sorted(t for _, t in baseline), sorted(t for _, t in loaded)
    round_trip_s = load.result["seconds"] * clients / max(1, load.result["answered"])
    print(f"{clients} clients: the scraper answered {sum(ok for ok, _ in loaded)} of 20, median "
          f"{statistics.median(busy) * 1e3:.1f} ms, max {busy[-1] * 1e3:.1f} ms; alone answered "
          f"{sum(ok for ok, _ in baseline)} of 20, median {statistics.median(alone) * 1e3:.1f} ms, max "
          f"{alone[-1] * 1e3:.1f} ms; the looping clients {load.result}, mean round trip {round_trip_s * 1e3:.1f} ms")
    assert all(ok for ok, _ in baseline)
    assert [ok for ok, _ in loaded] == [True] * 20, f"answered {sum(ok for ok, _ in loaded)} of 20"
    assert load.result["failed"] == 0 and load.result["answered"] > clients, load.result
    assert statistics.median(busy) <= statistics.median(alone) + 2 * round_trip_s


def test_restarts_and_a_prediction_queued_behind_one_are_counted(stack) -> None:
    """A killed stream process and a killed Triton are each restarted and counted once; a prediction that
    arrives while Triton restarts waits for it, counted as queued meanwhile, then succeeds."""
    cog, log = stack["cog"], stack["work"] / "cog.log"
    before, _ = scrape(stack)
    [victim, *_] = _stream_pids(cog)
    os.kill(victim, signal.SIGKILL)
    after = wait_until(stack, lambda s: delta(s, before, "cog_triton_stream_process_restarts_total") == 1)
    assert delta(after, before, "cog_triton_stream_process_restarts_total") == 1

    faults = log.read_text(errors="replace").count("restarting Triton")
    os.kill(_triton_pid(stack), signal.SIGKILL)
    deadline = time.monotonic() + 60  # only "not hung": the supervisor looks every 0.5 s
    while log.read_text(errors="replace").count("restarting Triton") == faults and time.monotonic() < deadline:
        time.sleep(0.1)
    result: dict[str, Any] = {}
    waiting = threading.Thread(target=lambda: result.update(
        doc=cog.predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0}, timeout_s=400)))
    waiting.start()
    queued: Optional[Samples] = wait_until(stack, lambda s: get(s, "cog_triton_predictions_queued") == 1
                                           or "doc" in result)
    assert get(queued, "cog_triton_predictions_queued") == 1, "the prediction was not seen waiting for Triton"
    assert get(queued, "cog_triton_predictions_running") == 0
    waiting.join(timeout=400)
    assert result["doc"]["status"] == "succeeded", result["doc"]
    after = wait_until(stack, lambda s: get(s, "cog_triton_predictions_running") == 0)
    assert delta(after, before, "cog_triton_triton_restarts_total") == 1
    assert delta(after, before, "cog_triton_predictions_total", outcome="succeeded") == 1
    assert get(after, "cog_triton_predictions_queued") == 0
    assert get(after, "cog_triton_triton_metrics_up") == 1  # the new Triton's metrics are read again
