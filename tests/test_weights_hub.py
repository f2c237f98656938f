"""``hf://owner/repo[@revision]`` weights (cog_triton.weights.hub) through the real huggingface_hub against a local
stand-in of the Hub (tests/hub_server.py; the Hub cannot be reached from the test machines): which files are
fetched, the commit they are fetched at, reuse, and every refusal (no such repository or revision, gated, private,
not a safetensors checkpoint, a fetch that fails midway) with nothing half-written left and the token never in a
message or a log line."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from common.errors import DownloadError, WeightsError
from cog_triton.weights import fetch_weights
from cog_triton.weights.hub import select_files
from cog_triton.weights.sources import parse_hub_ref
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.engine import inspect_weights
from tests.hub_server import FakeHub, commit_of, s3_signature_refusal, tiny_checkpoint

TOKEN = "hf_secretTOKENvalue1234567890"
DEFAULT_CHECKPOINT = REPO_ROOT / "build" / "default_model" / "checkpoint"


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    with FakeHub(token=TOKEN) as server:
        server.use(monkeypatch)
        yield server


def leftovers(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


def resolved_gets(hub: FakeHub) -> list[str]:
    return sorted(path for _, _, path in hub.gets)


# --- what is fetched ------------------------------------------------------------------------------


def test_only_the_checkpoint_files_are_fetched_at_one_commit_and_reused(hub, tmp_path):
    files = tiny_checkpoint()
    files.update({
        "generation_config.json": b"{}", "pytorch_model.bin": b"duplicate", "model.gguf": b"gguf",
        "original/consolidated.pth": b"meta", "README.md": b"# card", "chat_template.jinja": b"{{ x }}",
    })
    commit = hub.add_repo("me/tiny", files)
    target = tmp_path / "weights"
    result = fetch_weights("hf://me/tiny", target)
    assert (result.skipped, result.commit, result.source) == (False, commit, "hf://me/tiny")
    wanted = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json"]
    assert resolved_gets(hub) == wanted
    assert {rev for _, rev, _ in hub.gets} == {commit}, "every file is fetched at the resolved commit"
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == wanted
    assert (target / "model.safetensors").read_bytes() == files["model.safetensors"]
    marker = json.loads((target / ".cog-triton-weights.json").read_text())
    assert marker["hub"] == {"repo_id": "me/tiny", "revision": None, "commit": commit}
    assert leftovers(target) == [] and not (target / ".cache").exists()

    requests = len(hub.requests)
    again = fetch_weights("hf://me/tiny", target)
    assert (again.skipped, again.commit, again.size_bytes) == (True, commit, result.size_bytes)
    assert len(hub.requests) == requests, "a fetched checkpoint is reused without asking the Hub"
    (target / "model.safetensors").write_bytes(b"x")  # damaged: fetched anew
    assert fetch_weights("hf://me/tiny", target).skipped is False
    assert (target / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_an_index_names_the_shards_and_duplicates_are_not_fetched(hub, tmp_path):
    files = tiny_checkpoint()
    shard = files.pop("model.safetensors")
    files.update({
        "model-00001-of-00002.safetensors": shard, "model-00002-of-00002.safetensors": shard,
        "consolidated.safetensors": shard * 2,  # Mistral's duplicate of the shards
        "model.safetensors.index.json": json.dumps({"metadata": {}, "weight_map": {
            "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}).encode(),
        "hf_quant_config.json": json.dumps({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}).encode(),
    })
    hub.add_repo("nvidia/tiny-FP8", files)
    target = tmp_path / "w"
    fetch_weights("hf://nvidia/tiny-FP8", target)
    assert sorted(set(resolved_gets(hub))) == [
        "config.json", "hf_quant_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    info = inspect_weights(target)  # the ModelOpt checkpoint is reported as it is
    assert (info.quantization.algo, info.quantization.kv_cache_algo, info.quantization.supported) == ("FP8", "FP8", True)


PROCESSOR = {"preprocessor_config.json": b'{"image_processor_type": "Qwen2VLImageProcessor"}',
             "processor_config.json": b'{"processor_class": "Qwen2_5_VLProcessor"}',
             "video_preprocessor_config.json": b"{}", "chat_template.json": b'{"chat_template": "{{ x }}"}'}


def test_a_multimodal_checkpoint_comes_with_its_processor_files_and_passes_the_setup_check(hub, tmp_path):
    """What TensorRT-LLM's LLM loads beside the weights of a multimodal architecture (its Hugging Face processor)
    is fetched, so the setup check (tensorrtllm_backend.checkpoint) passes; a repository without the processor's
    config is fetched, then refused by that check, naming the file."""
    from common.errors import IncompatibleWeightsError
    from tensorrtllm_backend.checkpoint import check_pytorch_checkpoint

    files = tiny_checkpoint("Qwen2_5_VLForConditionalGeneration", model_type="qwen2_5_vl")
    hub.add_repo("Qwen/tiny-VL", {**files, **PROCESSOR, "README.md": b"# card"})
    target = tmp_path / "w"
    fetch_weights("hf://Qwen/tiny-VL", target)
    assert set(PROCESSOR) <= set(resolved_gets(hub)) and "README.md" not in resolved_gets(hub)
    check_pytorch_checkpoint(inspect_weights(target))

    hub.add_repo("Qwen/tiny-VL-bare", files)
    fetch_weights("hf://Qwen/tiny-VL-bare", tmp_path / "bare")
    with pytest.raises(IncompatibleWeightsError, match="preprocessor_config.json, which the checkpoint lacks"):
        check_pytorch_checkpoint(inspect_weights(tmp_path / "bare"))


def test_the_repositorys_code_is_fetched_only_when_allowed(hub, tmp_path):
    """Top-level *.py files (what auto_map names) only with hub_code (COG_TRITON_LLM_TRUST_REMOTE_CODE); a fetch
    without them is not reused for one that wants them. Then the setup check passes with the setting."""
    from common.errors import IncompatibleWeightsError
    from tensorrtllm_backend.checkpoint import check_pytorch_checkpoint

    files = tiny_checkpoint(auto_map={"AutoConfig": "configuration_x.XConfig"})
    code = {"configuration_x.py": b"# code\n", "modeling_x.py": b"# code\n", "sub/helper.py": b"# code\n"}
    hub.add_repo("me/custom", {**files, **code})
    target = tmp_path / "w"
    fetch_weights("hf://me/custom", target)
    assert not [p for p in resolved_gets(hub) if p.endswith(".py")]
    with pytest.raises(IncompatibleWeightsError, match="COG_TRITON_LLM_TRUST_REMOTE_CODE=true"):
        check_pytorch_checkpoint(inspect_weights(target))
    with pytest.raises(IncompatibleWeightsError, match="needs configuration_x.py beside it"):
        check_pytorch_checkpoint(inspect_weights(target), trust_remote_code=True)
    assert fetch_weights("hf://me/custom", target).skipped is True
    gets = len(hub.gets)
    assert fetch_weights("hf://me/custom", target, hub_code=True).skipped is False
    assert sorted(p for _, _, p in hub.gets[gets:] if p.endswith(".py")) == ["configuration_x.py", "modeling_x.py"]
    check_pytorch_checkpoint(inspect_weights(target), trust_remote_code=True)
    assert fetch_weights("hf://me/custom", target, hub_code=True).skipped is True


def test_a_revision_is_resolved_to_its_commit(hub, tmp_path):
    hub.add_repo("me/tiny", tiny_checkpoint(), revisions=("main", "v1.0"))
    result = fetch_weights("hf://me/tiny@v1.0", tmp_path / "w")
    assert result.commit == commit_of("me/tiny", "v1.0") != commit_of("me/tiny", "main")
    assert {rev for _, rev, _ in hub.gets} == {result.commit}
    pinned = fetch_weights(f"hf://me/tiny@{result.commit}", tmp_path / "w2")
    assert pinned.commit == result.commit


def test_a_branch_that_moves_during_the_fetch_does_not_change_what_is_fetched(hub, tmp_path):
    hub.add_repo("me/tiny", tiny_checkpoint(), revisions=("main", "v1.0"))
    hub.after_model_info = lambda repo: hub.repos[repo].revisions.pop("v1.0", None)  # the tag is deleted meanwhile
    result = fetch_weights("hf://me/tiny@v1.0", tmp_path / "w")
    assert result.commit == commit_of("me/tiny", "v1.0")
    assert {rev for _, rev, _ in hub.gets} == {result.commit}


def test_the_default_models_checkpoint_is_served_and_inspected(hub, tmp_path):
    """The bundled SmolLM2 checkpoint, served from build/default_model/checkpoint as the Hub would serve it."""
    hub.add_folder("HuggingFaceTB/SmolLM2-135M-Instruct", DEFAULT_CHECKPOINT)
    target = tmp_path / "w"
    result = fetch_weights("hf://HuggingFaceTB/SmolLM2-135M-Instruct", target)
    names = sorted(p.name for p in DEFAULT_CHECKPOINT.iterdir())
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith(".")) == names
    assert result.size_bytes == sum(p.stat().st_size for p in DEFAULT_CHECKPOINT.iterdir())
    for name in ("config.json", "tokenizer.json"):
        assert hashlib.sha256((target / name).read_bytes()).digest() == \
            hashlib.sha256((DEFAULT_CHECKPOINT / name).read_bytes()).digest()
    info = inspect_weights(target)
    assert (info.kind, info.architecture, info.quantization) == ("hf_checkpoint", "LlamaForCausalLM", None)


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["hf://justaname", "hf://a/b@", "hf://a/b/c", "hf:///x"])
def test_malformed_references_show_the_form(value, tmp_path):
    with pytest.raises(WeightsError, match=r"hf://owner/repo or hf://owner/repo@revision"):
        fetch_weights(value, tmp_path / "w")


def test_a_checksum_is_refused_for_a_hub_source(tmp_path):
    with pytest.raises(WeightsError, match="pinned by its revision"):
        fetch_weights("hf://me/tiny", tmp_path / "w", sha256="a" * 64)


def _previous(target: Path) -> None:
    target.mkdir(parents=True)
    (target / "old.txt").write_text("previous weights")


def assert_untouched(target: Path) -> None:
    assert (target / "old.txt").read_text() == "previous weights"
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert leftovers(target) == []


def test_an_unknown_revision_is_refused_naming_it(hub, tmp_path):
    hub.add_repo("me/tiny", tiny_checkpoint())
    target = tmp_path / "w"
    _previous(target)
    with pytest.raises(WeightsError) as info:
        fetch_weights("hf://me/tiny@no-such-branch", target)
    assert "revision 'no-such-branch' was not found in me/tiny" in info.value.message
    assert_untouched(target)


@pytest.mark.parametrize("token", [None, "hf_someoneElsesToken"])
def test_an_unknown_or_private_repository_is_refused(hub, tmp_path, monkeypatch, token):
    hub.add_repo("me/private", tiny_checkpoint(), private=True)
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    for repo in ("me/nothing", "me/private"):
        with pytest.raises(WeightsError) as info:
            fetch_weights(f"hf://{repo}", tmp_path / "w")
        note = "a Hugging Face token is set, but it has no access" if token else "no Hugging Face token is set"
        assert f"repository {repo} was not found, or it is private and {note}" in info.value.message
    assert hub.gets == []


def test_a_private_repository_is_fetched_with_the_token_from_the_environment(hub, tmp_path, monkeypatch):
    hub.add_repo("me/private", tiny_checkpoint(), private=True)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    fetch_weights("hf://me/private", tmp_path / "w")
    assert all(auth == f"Bearer {TOKEN}" for _, path, auth in hub.requests if path.startswith(("/api/models", "/me/")))


def test_a_gated_repository_without_a_token_is_refused_before_any_file(hub, tmp_path):
    hub.add_repo("meta-llama/Llama-3.1-8B-Instruct", tiny_checkpoint(), gated="manual")
    target = tmp_path / "w"
    _previous(target)
    with pytest.raises(WeightsError) as info:
        fetch_weights("hf://meta-llama/Llama-3.1-8B-Instruct", target)
    assert "is a gated repository ('manual' approval) and no Hugging Face token is set" in info.value.message
    assert "set HF_TOKEN" in info.value.message
    assert hub.gets == [] and not any("/resolve/" in path for _, path, _ in hub.requests)
    assert_untouched(target)


def test_a_token_without_access_is_refused_and_never_shown(hub, tmp_path, monkeypatch, caplog, capfd):
    """A token in the environment, a failing fetch (403 GatedRepo): the token reached the Hub, and is in no error
    message, no log record (any logger, DEBUG) and nothing printed."""
    hub.add_repo("meta-llama/Llama-3.1-8B-Instruct", tiny_checkpoint(), gated="manual")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    target = tmp_path / "w"
    _previous(target)
    with caplog.at_level(logging.DEBUG), pytest.raises(WeightsError) as info:
        fetch_weights("hf://meta-llama/Llama-3.1-8B-Instruct", target)
    assert "a Hugging Face token is set, but it has no access to it" in info.value.message
    assert any(auth == f"Bearer {TOKEN}" for _, _, auth in hub.requests), "the token from HF_TOKEN was sent"
    out, err = capfd.readouterr()
    for text in (str(info.value), repr(info.value), caplog.text, out, err,
                 " ".join(str(r.args) for r in caplog.records)):
        assert TOKEN not in text
    assert_untouched(target)

    hub.granted.add("meta-llama/Llama-3.1-8B-Instruct")  # the license accepted: the same token now works
    assert fetch_weights("hf://meta-llama/Llama-3.1-8B-Instruct", target).skipped is False


def test_a_repository_without_safetensors_is_refused_naming_what_it_has(hub, tmp_path):
    files = tiny_checkpoint()
    files["pytorch_model.bin"] = files.pop("model.safetensors")
    hub.add_repo("old/bin-only", files)
    with pytest.raises(WeightsError) as info:
        fetch_weights("hf://old/bin-only", tmp_path / "w")
    assert "has no safetensors weights" in info.value.message and "found pytorch_model.bin" in info.value.message
    assert hub.gets == []


def test_a_repository_without_config_json_is_not_a_checkpoint(hub, tmp_path):
    hub.add_repo("me/adapter", {"adapter_config.json": b"{}", "adapter_model.safetensors": b"x"})
    with pytest.raises(WeightsError, match="has no config.json at its top level.*adapter_config.json"):
        fetch_weights("hf://me/adapter", tmp_path / "w")


def test_a_fetch_failing_midway_leaves_nothing_half_written(hub, tmp_path):
    files = tiny_checkpoint()
    files["model-2.safetensors"] = files["model.safetensors"]
    hub.add_repo("me/tiny", files)
    hub.fail_get.add(("me/tiny", "model-2.safetensors"))
    target = tmp_path / "w"
    _previous(target)
    with pytest.raises(WeightsError) as info:
        fetch_weights("hf://me/tiny", target)
    assert type(info.value) is WeightsError
    assert info.value.message == ("hf://me/tiny: a file listed in the repository was not found at its commit "
                                  f"(model-2.safetensors does not exist on \"{commit_of('me/tiny', 'main')}\")")
    assert any(path != "model-2.safetensors" for _, _, path in hub.gets), "other files had arrived"
    assert_untouched(target)


def test_an_unreachable_hub_is_a_download_error(tmp_path, monkeypatch):
    """Nothing listens: under huggingface_hub 0.x the error is requests' ConnectionError, an OSError, which must
    not read as a disk failure."""
    with FakeHub() as hub:
        hub.use(monkeypatch)
    # the server is stopped: nothing listens on its port any more
    with pytest.raises(DownloadError, match=r"^\[download_error\] hf://me/tiny could not be fetched: the Hub could "
                                            r"not be reached \((ConnectionError|ConnectError): "):
        fetch_weights("hf://me/tiny", tmp_path / "w", timeout_s=5)


@pytest.mark.parametrize("failing,status", [("/api/models/", 500), ("/resolve/", 403)])
def test_an_error_answer_is_a_download_error_naming_the_status(hub, tmp_path, failing, status):
    """HTTP 500 from the metadata API; 403 (no Hub error code: a proxy's) from a file's HEAD, which
    hf_hub_download wraps in a LocalEntryNotFoundError in every major (the status is read from its cause; a 5xx
    there would be retried for ~20 s by huggingface_hub 0.x's http_backoff)."""
    hub.add_repo("me/tiny", tiny_checkpoint())
    hub.intercept = lambda method, path: (status, {"X-Error-Message": "not now"}) if failing in path else None
    target = tmp_path / "w"
    _previous(target)
    with pytest.raises(DownloadError) as info:
        fetch_weights("hf://me/tiny", target)
    assert info.value.message == f"hf://me/tiny could not be fetched: the Hub answered HTTP {status} (not now)"
    assert_untouched(target)


def test_a_cdn_answering_an_error_after_the_hubs_redirect_shows_no_signed_url(hub, tmp_path, caplog):
    """The Hub redirects the checkpoint's safetensors file to a signed URL of its CDN, which answers S3's 403
    echoing the credential and the signature: the error names the file storage's answer (its URL without the
    query string) and holds neither, and no log record does. huggingface_hub's own message held both."""
    hub.add_repo("me/tiny", tiny_checkpoint())
    hub.cdn_secret = "cdn-s1g-weights"
    hub.cdn_error = s3_signature_refusal("cdn-s1g-weights", "AKIACDNWEIGHTS")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(DownloadError) as info:
        fetch_weights("hf://me/tiny", tmp_path / "w")
    assert hub.cdn_requests and all("cdn-s1g-weights" in path for _, path in hub.cdn_requests)
    commit = commit_of("me/tiny", "main")
    assert info.value.message == (f"hf://me/tiny could not be fetched: the Hub's file storage (http://localhost:"
                                  f"{hub.url.rsplit(':', 1)[1]}/cdn/me/tiny/{commit}/model.safetensors) answered "
                                  "HTTP 403"), info.value.message
    for secret in ("cdn-s1g-weights", "AKIACDNWEIGHTS", "X-Amz"):
        assert secret not in str(info.value) and secret not in caplog.text, secret


def test_an_endpoint_that_is_not_a_hub_is_named(hub, tmp_path):
    """A file answer without X-Repo-Commit (FileMetadataError, an OSError): not a disk failure."""
    hub.add_repo("me/tiny", tiny_checkpoint())
    hub.intercept = lambda method, path: (200, {"ETag": '"x"'}) if "/resolve/" in path else None
    with pytest.raises(DownloadError) as info:
        fetch_weights("hf://me/tiny", tmp_path / "w")
    assert info.value.message.startswith("hf://me/tiny could not be fetched: the answer lacks the headers of a Hugging "
                                         "Face Hub (X-Repo-Commit, ETag); is HF_ENDPOINT a Hugging Face Hub? "
                                         "(FileMetadataError: ")


def test_hf_hub_offline_is_honoured_by_the_guarded_client(hub, tmp_path, monkeypatch):
    """HF_HUB_OFFLINE forbids reaching the Hub, also once this process's huggingface_hub client is the guarded one
    (every hf:// fetch installs it): nothing is asked."""
    import huggingface_hub.constants as constants

    from cog_triton.fetch.guard import install_hub_guard

    install_hub_guard()
    hub.add_repo("me/tiny", tiny_checkpoint())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError) as info:
        fetch_weights("hf://me/tiny", tmp_path / "w")
    assert info.value.message == "hf://me/tiny cannot be fetched: HF_HUB_OFFLINE is set, which forbids reaching the Hub"
    assert hub.requests == []


def test_a_connection_opened_under_open_rules_is_not_reused_under_stricter_ones(hub, tmp_path):
    """The operator's fetch (any endpoint) then a caller's held to public addresses, in one thread, to the same Hub
    (HTTP/1.1, keep-alive): the caller's request gets a connection of its own, refused at its address.
    huggingface_hub 0.x keeps one requests session per thread, whose pools would keep the first connection."""
    import huggingface_hub

    from common.errors import FetchRefusedError
    from cog_triton.fetch.guard import hub_guard
    from cog_triton.fetch.rules import FetchRules

    hub.add_repo("me/tiny", tiny_checkpoint())
    api = huggingface_hub.HfApi(endpoint=hub.url)
    with hub_guard(FetchRules.open(), "checkpoints"):
        assert api.model_info("me/tiny").sha == commit_of("me/tiny", "main")
    asked = len(hub.requests)
    with hub_guard(FetchRules(allow_http=True), "checkpoints"), \
            pytest.raises(FetchRefusedError, match="127.0.0.1 is a loopback address; checkpoints are fetched only"):
        api.model_info("me/tiny")
    assert len(hub.requests) == asked


def test_select_files_reads_only_top_level_tokenizer_and_metadata():
    listing = {"config.json": 1, "model.safetensors": 2, "sub/tokenizer.json": 3, "tokenizer.model": 4,
               "x.tiktoken": 5, "quant_cfg.json": 6, "sub/model.safetensors": 7, "preprocessor_config.json": 8,
               "sub/preprocessor_config.json": 9, "modeling_x.py": 10, "sub/x.py": 11}
    assert select_files(listing, None, "hf://a/b") == [
        "config.json", "model.safetensors", "preprocessor_config.json", "quant_cfg.json", "tokenizer.model",
        "x.tiktoken"]
    assert select_files(listing, None, "hf://a/b", code=True) == [
        "config.json", "model.safetensors", "modeling_x.py", "preprocessor_config.json", "quant_cfg.json",
        "tokenizer.model", "x.tiktoken"]
    with pytest.raises(WeightsError, match="names b.safetensors, which the repository lacks"):
        select_files(listing, ["b.safetensors"], "hf://a/b")
    assert parse_hub_ref(" hf://Org/Name.v2@refs/pr/1 ").revision == "refs/pr/1"


def test_a_subprocess_reaches_the_stand_in_through_its_environment(hub, tmp_path):
    """What the lead's end-to-end test through the real Cog server relies on: a fresh process finds the stand-in
    through ``FakeHub.env()`` alone (HF_ENDPOINT, HF_HUB_OFFLINE=0), and with a token that has no access prints
    the refusal without the token."""
    import os
    import subprocess
    import sys

    hub.add_repo("me/tiny", tiny_checkpoint())
    hub.add_repo("me/gated", tiny_checkpoint(), gated="auto")
    script = ("import sys; from cog_triton.weights import fetch_weights; "
              "print(fetch_weights(sys.argv[1], sys.argv[2]).commit)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(hub.env(), HF_TOKEN=TOKEN, PYTHONPATH=str(REPO_ROOT), HF_HOME=str(tmp_path / "hf-home"))
    ok = subprocess.run([sys.executable, "-c", script, "hf://me/tiny", str(tmp_path / "a")], env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == commit_of("me/tiny", "main")
    refused = subprocess.run([sys.executable, "-c", script, "hf://me/gated", str(tmp_path / "b")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "a Hugging Face token is set, but it has no access to it" in refused.stderr
    assert TOKEN not in refused.stderr + refused.stdout + ok.stderr + ok.stdout


def test_the_operators_hub_weights_are_not_held_to_the_callers_fetch_rules(hub, tmp_path):
    """Once a caller's fetch (a LoRA adapter) has made this process's huggingface_hub client the guarded one, the
    operator's own hf:// weights (HF_ENDPOINT on a private network here: 127.0.0.1, plain http) are still fetched;
    a caller's hf:// checkpoint under the default rules is refused, before any request, and by owner."""
    from common.errors import FetchRefusedError
    from cog_triton.fetch.guard import install_hub_guard
    from cog_triton.fetch.rules import FetchRules

    install_hub_guard()
    hub.add_repo("me/tiny", tiny_checkpoint())
    assert fetch_weights("hf://me/tiny", tmp_path / "weights").path == tmp_path / "weights"
    requests = len(hub.requests)
    with pytest.raises(FetchRefusedError, match="plain http:// is refused"):
        fetch_weights("hf://me/tiny", tmp_path / "caller", rules=FetchRules(), what="checkpoints")
    with pytest.raises(FetchRefusedError, match="hf://me/tiny: the Hub owner 'me' is not on the list"):
        fetch_weights("hf://me/tiny", tmp_path / "caller", rules=FetchRules.open().__class__(
            allow_private=True, allow_http=True, allow_hf_owners=("trusted",)), what="checkpoints")
    assert len(hub.requests) == requests and not (tmp_path / "caller").exists()
