"""Issue 48's fetch hardening where a caller meets it: the real Cog HTTP server (coglet) running predict.py, its
stream process and a real Triton for the adapters, and Cog servers whose setup() fetches the weights.

* **The deadline holds the connect** (cog_triton/fetch/guard.py): names whose addresses drop connection attempts
  (tests/dropnet.py: a network namespace made here, nothing sent off this machine) and a resolver that does not
  answer. The Cog server runs under a resolver of the test's own (tests/dropnet.py ``resolver_prefix``: in a mount
  namespace of its own, ``/etc/hosts`` names ``one.drop.test`` with one such address and ``multi.drop.test`` with
  eight, and ``/etc/resolv.conf`` names a nameserver among them, so any other name waits the resolver's whole 30 s);
  the process resolves with glibc as in production. The fetch rules pass them: the namespace's network is allowed
  (``COG_TRITON_FETCH_ALLOW_NETWORKS``) and http:// too. Each fetch ends at its deadline: an adapter by URL and by
  hf:// (the Hub's redirect to its file CDN on the 8-address name), setup's weights by URL and by hf://, each against
  the same fetch from the one-address name measured in the same test (before the fix, 8 addresses held a fetch 8
  connect timeouts).
* **No signed URL in any error** (cog_triton/fetch/hub_errors.py, redaction.py): the Hub (tests/hub_server.py)
  redirects an LFS file to a signed URL of its CDN, and the CDN answers S3's 403, whose body echoes the credential
  and the signature: the prediction's error, setup's error and the whole Cog server log (coglet's own "Prediction
  failed" line included) hold none of it, while the error names the answer that came.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.dev.local import CogServer, serving_env
from tests.dropnet import DropNet, resolver_prefix
from tests.hub_server import FakeHub, s3_signature_refusal, tiny_checkpoint
from tests.lora_adapters import ADAPTER_FILES
from tests.test_lora_integration import _weights_folder

pytestmark = pytest.mark.integration

PROMPT = "What is machine learning?"
#: Each fetch's deadline here (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S, COG_TRITON_DOWNLOAD_DEADLINE_S), seconds. The
#: connect timeout stays at its default (60 s), far above it: only the deadline ends these fetches.
DEADLINE_S = 3
ONE, MULTI, SLOW_DNS = "one.drop.test", "multi.drop.test", "slow-dns.drop.test"
#: The CDN's signature and credential (in the signed URLs the Hub's redirects name, and in S3's refusal).
SIGNATURE, CREDENTIAL = "cdn-s1gnature-48", "AKIAFAKEHUB"
SECRETS = (SIGNATURE, CREDENTIAL, "X-Amz-Signature", "X-Amz-Credential")


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The drop network, the resolver prefix naming it, and the fake Hub (an adapter and a checkpoint whose CDN is
    the 8-address name, one of each whose CDN answers S3's refusal)."""
    work = tmp_path_factory.mktemp("hardening")
    with DropNet(count=8) as drop, FakeHub() as hub:
        prefix = resolver_prefix(work / "resolver", {ONE: drop.addresses[:1], MULTI: drop.addresses},
                                 drop.nameserver)
        adapter = {name: b"{}" if name.endswith(".json") else b"\0" * 64 for name in ADAPTER_FILES}
        for repo in ("owner/adapter-drop", "owner/adapter-cdn-error"):
            hub.add_repo(repo, adapter)
        for repo in ("owner/model-drop", "owner/model-cdn-error"):
            hub.add_repo(repo, tiny_checkpoint())
        hub.cdn_secret = SIGNATURE
        hub.cdn_error = s3_signature_refusal(SIGNATURE, CREDENTIAL)
        hub.cdn_for = {"owner/adapter-drop": f"http://{MULTI}", "owner/model-drop": f"http://{MULTI}"}
        yield {"work": work, "drop": drop, "prefix": prefix, "hub": hub,
               "allow": f"127.0.0.1/32,{drop.network}"}


def _leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(secret in line for secret in SECRETS)]


# --- adapters, through a serving stack ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(net: dict[str, Any], checkpoint_dir: Path) -> Iterator[dict[str, Any]]:
    work = net["work"] / "serving"
    env = serving_env(
        str(_weights_folder(checkpoint_dir, work / "weights_src")), work=work,
        COG_TRITON_STREAM_PROCESSES="1", COG_TRITON_ADAPTER_CACHE_DIR=str(work / "adapter_cache"),
        COG_TRITON_REFERENCE_MAX_INPUT_LEN="256", COG_TRITON_REFERENCE_MAX_SEQ_LEN="512",
        COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S=str(DEADLINE_S),
        COG_TRITON_FETCH_ALLOW_HTTP="true", COG_TRITON_FETCH_ALLOW_NETWORKS=net["allow"], **net["hub"].env(),
    )
    cog = CogServer(env, log_file=work / "cog.log", max_concurrency=4, prefix=net["prefix"])
    cog.start()
    try:
        cog.wait_ready(timeout_s=600)
        yield {"cog": cog, "log": work / "cog.log"}
    finally:
        cog.stop()


def _predict(stack: dict[str, Any], lora: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    doc = stack["cog"].predict({"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "lora_weights": lora})
    return doc, time.monotonic() - started


def _error(doc: dict[str, Any], lora: str) -> str:
    """The adapter's error of a prediction that failed before any output."""
    assert doc["status"] == "failed" and doc.get("output") in (None, []), doc
    prefix = f"[invalid_lora_adapter] lora_weights {lora} "
    assert prefix in doc["error"], doc["error"]
    return doc["error"].split(prefix, 1)[1]


def test_an_adapters_fetch_ends_at_its_deadline_however_many_addresses_its_name_has(stack: dict[str, Any]) -> None:
    """lora_weights on a name of one dropping address (the baseline), of eight, by hf:// with the Hub's CDN on the
    eight, and on a name the resolver never answers: each prediction fails with the deadline's message, none more
    than one deadline after the baseline (trying each address with the whole connect timeout held the 8-address
    fetch 8 x 3 s). A prediction without an adapter is served afterwards."""
    baseline_doc, baseline_s = _predict(stack, f"http://{ONE}/a.tar.gz")
    assert _error(baseline_doc, f"http://{ONE}/a.tar.gz").startswith(
        f"could not be fetched: the download of http://{ONE}/a.tar.gz did not finish within the deadline of "
        f"{DEADLINE_S} s (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S)"), baseline_doc["error"]
    assert baseline_s >= DEADLINE_S
    took = {}
    for lora, expected in (
        (f"http://{MULTI}/a.tar.gz", f"could not be fetched: the download of http://{MULTI}/a.tar.gz did not finish "
                                     f"within the deadline of {DEADLINE_S} s (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S)"),
        ("hf://owner/adapter-drop", "could not be fetched: the fetch of hf://owner/adapter-drop did not finish "
                                    f"within the deadline of {DEADLINE_S} s (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S)"),
        (f"http://{SLOW_DNS}/a.tar.gz", f"could not be fetched: the download of http://{SLOW_DNS}/a.tar.gz did not "
                                        f"finish within the deadline of {DEADLINE_S} s"),
    ):
        doc, took[lora] = _predict(stack, lora)
        assert _error(doc, lora).startswith(expected), doc["error"]
    print(f"adapter fetches against a {DEADLINE_S} s deadline: one address {baseline_s:.1f} s, "
          + ", ".join(f"{lora} {seconds:.1f} s" for lora, seconds in took.items()))
    for lora, seconds in took.items():
        assert seconds < baseline_s + DEADLINE_S, (lora, seconds, baseline_s)
    doc = stack["cog"].predict({"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    assert doc["status"] == "succeeded", doc


def test_an_adapter_whose_cdn_answers_an_error_shows_no_signed_url(stack: dict[str, Any], net: dict[str, Any]) -> None:
    """hf:// whose file the Hub redirects to a signed CDN URL, and the CDN answers S3's 403 echoing the signature:
    the prediction's error names the CDN's answer (HTTP 403, the file's path on it) and holds no secret, nor does
    any line of the Cog server's log, coglet's "Prediction failed" line included."""
    hub = net["hub"]
    before = len(hub.cdn_requests)
    log_before = stack["log"].read_text(errors="replace").count("Prediction failed")
    doc, _ = _predict(stack, "hf://owner/adapter-cdn-error")
    error = _error(doc, "hf://owner/adapter-cdn-error")
    assert [path for _, path in hub.cdn_requests[before:]] and all(
        SIGNATURE in path for _, path in hub.cdn_requests[before:]), "the signed CDN URL was not requested"
    assert "403" in error and "/cdn/owner/adapter-cdn-error/" in error, error
    assert not _leaks(doc["error"]), doc["error"]
    text = stack["log"].read_text(errors="replace")
    assert text.count("Prediction failed") > log_before, "coglet's line about the failure was not written"
    assert not _leaks(text), _leaks(text)[:3]


# --- setup's weights, through Cog servers whose setup fails ---------------------------------------------------


def _coglet_time(log: Path, fragment: str) -> datetime.datetime:
    """The timestamp coglet gave the first line of ``log`` whose message holds ``fragment`` (coglet writes each line
    as JSON with an ISO ``timestamp``; the worker's own log lines are messages of its)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and fragment in line:
            return datetime.datetime.fromisoformat(json.loads(line)["timestamp"])
    raise AssertionError(f"no line with {fragment!r} in {log}")


def _setup_fails(net: dict[str, Any], name: str, weights: str) -> tuple[str, float, Path]:
    """A Cog server whose setup() fetches ``weights`` under the test's resolver; (its SETUP_FAILED report, the
    seconds its fetch took, its log). The fetch's time is read from the Cog server's log, from the line setup writes
    just before it fetches (the Prometheus endpoint's) to coglet's "Worker initialization failed" (its orchestrator
    writes it once the worker reported the failure: replicate/cog 6110c912 crates/coglet-python/src/lib.rs; the
    worker's own "Setup failed" line may be lost as it exits),
    so that the process's start, which varies more than the fetch, is not counted."""
    work = net["work"] / name
    env = serving_env(weights, work=work, COG_TRITON_DOWNLOAD_DEADLINE_S=str(DEADLINE_S), **net["hub"].env())
    with CogServer(env, log_file=work / "cog.log", prefix=net["prefix"]) as cog:
        with pytest.raises(RuntimeError) as info:
            cog.wait_ready(timeout_s=300)
        health = json.dumps(cog.health())
    assert "SETUP_FAILED" in str(info.value), str(info.value)[-2000:]
    log = work / "cog.log"
    took = (_coglet_time(log, '"Worker initialization failed"')
            - _coglet_time(log, "Prometheus metrics (the predictor's, then"))
    return str(info.value) + health, took.total_seconds(), log


def test_setups_fetch_ends_at_its_deadline_however_many_addresses_its_name_has(net: dict[str, Any]) -> None:
    """COG_WEIGHTS on a name of one dropping address (the baseline), of eight, hf:// with the Hub's CDN on the eight,
    and a name the resolver never answers: each setup fails with the deadline's message, its fetch ending less than
    one deadline after the baseline's (8 addresses took 8 deadlines)."""
    report, baseline_s, _ = _setup_fails(net, "setup-one", f"http://{ONE}/w.tar.gz")
    assert (f"the download of http://{ONE}/w.tar.gz did not finish within the deadline of {DEADLINE_S} s "
            "(COG_TRITON_DOWNLOAD_DEADLINE_S)") in report, report[-2000:]
    took = {}
    for name, weights, expected in (
        ("setup-multi", f"http://{MULTI}/w.tar.gz", f"the download of http://{MULTI}/w.tar.gz did not finish"),
        ("setup-hf", "hf://owner/model-drop", "the fetch of hf://owner/model-drop did not finish"),
        ("setup-dns", f"http://{SLOW_DNS}/w.tar.gz", f"the download of http://{SLOW_DNS}/w.tar.gz did not finish"),
    ):
        report, took[weights], _ = _setup_fails(net, name, weights)
        assert f"{expected} within the deadline of {DEADLINE_S} s (COG_TRITON_DOWNLOAD_DEADLINE_S)" in report, \
            report[-2000:]
    print(f"setup's fetch until SETUP_FAILED, {DEADLINE_S} s deadline: one address {baseline_s:.1f} s, "
          + ", ".join(f"{weights} {seconds:.1f} s" for weights, seconds in took.items()))
    for weights, seconds in took.items():
        assert seconds < baseline_s + DEADLINE_S, (weights, seconds, baseline_s)


def test_setups_hf_weights_whose_cdn_answers_an_error_show_no_signed_url(net: dict[str, Any]) -> None:
    """hf:// weights whose safetensors file the Hub redirects to a signed CDN URL, answered with S3's 403: setup's
    error names the file storage's answer and holds no secret, nor does any line of the Cog server's log."""
    hub = net["hub"]
    before = len(hub.cdn_requests)
    report, _, log = _setup_fails(net, "setup-cdn-error", "hf://owner/model-cdn-error")
    assert [path for _, path in hub.cdn_requests[before:]], "the signed CDN URL was not requested"
    assert ("hf://owner/model-cdn-error could not be fetched: the Hub's file storage (http://localhost:"
            in report and "/cdn/owner/model-cdn-error/" in report and "answered HTTP 403" in report), report[-2000:]
    assert not _leaks(report), _leaks(report)[:3]
    assert not _leaks(log.read_text(errors="replace")), _leaks(log.read_text(errors="replace"))[:3]
