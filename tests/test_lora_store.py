"""The lora_weights input's references (cog_triton.fetch.adapter_refs) and the adapter disk cache
(cog_triton.streaming.lora.store), against real local HTTP servers: archives of three kinds, fetched once, shared
by processes, bounded (LRU), refused when they are not adapters or are too large; hf:// through
huggingface_hub against the local stand-in of the Hub in tests/hub_server.py (the Hub cannot be reached from
the test machines; the stand-in answers what huggingface_hub's ``get_hf_file_metadata`` reads)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import multiprocessing
import os
import tarfile
import threading
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from common.errors import InputError, LoraAdapterError
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.dev.local import WeightsHTTPServer, free_port
from cog_triton.fetch.adapter_refs import parse_adapter_ref
from cog_triton.fetch.rules import FetchRules, parse_owners
from cog_triton.streaming.lora.store import AdapterStore
from cog_triton.stream_config import StoreLimits
from tests.hub_server import FakeHub
from tests.lora_adapters import pack_files

CONFIG = json.dumps({"peft_type": "LORA", "r": 2}).encode()
ADAPTER = {"adapter_config.json": CONFIG, "adapter_model.safetensors": b"\x08" + b"\0" * 7 + b"{}" + b" " * 6}


def content_sha(files: dict[str, bytes]) -> str:
    return hashlib.sha256(files["adapter_config.json"] + files["adapter_model.safetensors"]).hexdigest()


# --- refs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,kind,display", [
    ("https://user:secret@example.com/a.tar.gz?X-Amz-Signature=abc", "url", "https://example.com/a.tar.gz"),
    ("http://127.0.0.1:8111/a.zip", "url", "http://127.0.0.1:8111/a.zip"),
    ("hf://owner/repo", "hf", "hf://owner/repo"),
    ("hf://owner/my.repo-1@v1.0", "hf", "hf://owner/my.repo-1@v1.0"),
])
def test_accepted_references(value, kind, display):
    ref = parse_adapter_ref(value)
    assert (ref.kind, ref.display, ref.source) == (kind, display, value)
    assert len(ref.key) == 40 and ref.key == parse_adapter_ref(value).key
    if kind == "hf":
        assert ref.repo_id.startswith("owner/")


@pytest.mark.parametrize("value,fragment", [
    ("/etc/passwd", "'/etc/passwd' is not allowed"),
    ("file:///etc/passwd", "is not allowed"),
    ("ftp://example.com/a.tar", "is not allowed"),
    ("https:///nohost.tar", "has no host"),
    ("hf://justaname", "hf://owner/repo or hf://owner/repo@revision"),
    ("hf://owner/repo@", "hf://owner/repo or"),
])
def test_refused_references_say_what_is_allowed(value, fragment):
    with pytest.raises(LoraAdapterError) as info:
        parse_adapter_ref(value)
    assert fragment in info.value.message and "hf://owner/repo" in info.value.message


def test_predict_inputs_check_lora_weights():
    assert validate_inputs(prompt="hi").lora is None
    assert validate_inputs(prompt="hi", lora_weights="  ").lora is None
    assert validate_inputs(prompt="hi", lora_weights="hf://a/b").lora.repo_id == "a/b"
    with pytest.raises(InputError, match="lora_weights has 4097 characters; at most 4096"):
        validate_inputs(prompt="hi", lora_weights="h" * 4097)


# --- store -------------------------------------------------------------------------------------


def _tar(path: Path, files: dict[str, bytes], folder: str = "") -> Path:
    return pack_files(path, {f"{folder}/{k}" if folder else k: v for k, v in files.items()})


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "served"
    root.mkdir()
    with WeightsHTTPServer(root) as server:
        yield root, server


def _store(tmp_path: Path, **limits) -> AdapterStore:
    """A store whose fetch rules let it fetch from the test's servers on 127.0.0.1 over http://."""
    return AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, **{"rules": FetchRules.open(), **limits}))


@pytest.mark.parametrize("name,make", [
    ("a.tar.gz", lambda p: _tar(p, ADAPTER)),
    ("a.zip", lambda p: _zip(p, ADAPTER)),
    ("a.tgz", lambda p: _tar(p, ADAPTER, folder="my-adapter")),
])
def test_each_archive_kind_is_fetched_once_and_read_from_the_cache(tmp_path, served, name, make):
    root, server = served
    make(root / name)
    store = _store(tmp_path)
    ref = parse_adapter_ref(f"{server.url}/{name}")
    first = store.get(ref)
    assert first.config == {"peft_type": "LORA", "r": 2}
    assert first.weights_path.read_bytes() == ADAPTER["adapter_model.safetensors"]
    assert first.weights_bytes == len(ADAPTER["adapter_model.safetensors"]) and first.sha256 == content_sha(ADAPTER)
    again = AdapterStore(store.limits).get(ref)  # another process's store, the same folder
    assert again.sha256 == first.sha256
    assert server.counter[f"/{name}"] == 1
    # the folder holding the two files (inside the archive's one folder when it has one), for the PyTorch backend
    assert first.folder == store.folder / ref.key / ("my-adapter" if name == "a.tgz" else "")
    assert sorted(p.name for p in first.folder.iterdir() if not p.name.startswith(".")) == sorted(ADAPTER)


def test_not_an_adapter_lists_what_it_holds(tmp_path, served):
    root, server = served
    _tar(root / "x.tar.gz", {"README.md": b"hi", "adapter_model.bin": b"pickle"})
    with pytest.raises(LoraAdapterError) as info:
        _store(tmp_path).get(parse_adapter_ref(f"{server.url}/x.tar.gz"))
    message = info.value.message
    assert "is not a PEFT LoRA adapter" in message and "README.md" in message and "safetensors" in message


def test_unsafe_zip_members_are_refused(tmp_path, served):
    root, server = served
    _zip(root / "evil.zip", {**ADAPTER, "../outside.txt": b"x"})
    with pytest.raises(LoraAdapterError) as info:
        _store(tmp_path).get(parse_adapter_ref(f"{server.url}/evil.zip"))
    assert "'../outside.txt'" in info.value.message and "'..' path component" in info.value.message
    assert not (tmp_path / "cache" / "outside.txt").exists()


def test_too_large_adapters_are_refused_before_unpacking(tmp_path, served):
    root, server = served
    _tar(root / "big.tar.gz", {**ADAPTER, "adapter_model.safetensors": os.urandom(200_000)})
    with pytest.raises(LoraAdapterError) as info:
        _store(tmp_path, max_adapter_bytes=50_000).get(parse_adapter_ref(f"{server.url}/big.tar.gz"))
    assert "50000 bytes allowed" in info.value.message


@pytest.mark.parametrize("path,fragment", [("missing.tar.gz", "HTTP 404"), (None, "could not connect")])
def test_unreachable_adapters_are_refused(tmp_path, served, path, fragment):
    _, server = served
    url = f"{server.url}/{path}" if path else f"http://127.0.0.1:{free_port()}/a.tar.gz"
    with pytest.raises(LoraAdapterError) as info:
        _store(tmp_path).get(parse_adapter_ref(url))
    assert "could not be fetched" in info.value.message and fragment in info.value.message


def _sized(n: int) -> dict[str, bytes]:
    return {**ADAPTER, "adapter_model.safetensors": bytes([n]) * 10_000}


def test_least_recently_used_adapters_are_removed_above_the_budget(tmp_path, served):
    root, server = served
    for n in range(3):
        _tar(root / f"{n}.tar.gz", _sized(n))
    store = _store(tmp_path, budget_bytes=25_000)  # two adapters of ~10 KB fit, not three
    refs = [parse_adapter_ref(f"{server.url}/{n}.tar.gz") for n in range(3)]
    store.get(refs[0])
    time.sleep(0.05)
    store.get(refs[1])
    time.sleep(0.05)
    store.touch(refs[0])  # 0 used after 1: 1 is now the least recently used
    time.sleep(0.05)
    store.get(refs[2])
    cached = {p.name for p in store.folder.iterdir() if not p.name.startswith(".")}
    assert cached == {refs[0].key, refs[2].key}
    assert sum(size for _, size, _ in store.entries()) <= 25_000
    store.get(refs[1])  # fetched again: it was removed
    assert server.counter["/1.tar.gz"] == 2 and server.counter["/0.tar.gz"] == 1


def _fetch_in_process(root: str, url: str, queue) -> None:
    store = AdapterStore(StoreLimits(root=Path(root), retries=0, rules=FetchRules.open()))
    queue.put(store.get(parse_adapter_ref(url)).sha256)


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files slowly, so that concurrent fetches overlap; counts GETs."""

    hits: list = []

    def do_GET(self) -> None:  # noqa: N802
        type(self).hits.append(self.path)
        time.sleep(0.5)
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


def test_processes_fetching_the_same_adapter_download_it_once(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    _tar(served / "a.tar.gz", ADAPTER)
    handler = type("Handler", (SlowHandler,), {"hits": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(served), **k))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/a.tar.gz"
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_fetch_in_process, args=(str(tmp_path / "cache"), url, queue)) for _ in range(3)]
        for proc in procs:
            proc.start()
        results = [queue.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(60)
    finally:
        server.shutdown()
        server.server_close()
    assert results == [content_sha(ADAPTER)] * 3
    assert handler.hits == ["/a.tar.gz"], "each process must not download it again"


# --- hf:// -------------------------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch):
    """The shared stand-in of the Hub (tests/hub_server.py), serving an adapter and a repository without one."""
    with FakeHub() as server:
        server.add_repo("me/adapter", ADAPTER, revisions=("main", "v2"))
        server.add_repo("me/not-adapter", {"README.md": b"x"})
        server.use(monkeypatch)
        yield server


def test_hf_references_are_resolved_with_huggingface_hub_and_cached(tmp_path, hub):
    store = _store(tmp_path)
    ref = parse_adapter_ref("hf://me/adapter@v2")
    adapter = store.get(ref)
    assert adapter.sha256 == content_sha(ADAPTER) and adapter.config["peft_type"] == "LORA"
    assert sorted(hub.gets) == [("me/adapter", "v2", "adapter_config.json"),
                                ("me/adapter", "v2", "adapter_model.safetensors")]
    assert AdapterStore(store.limits).get(ref).sha256 == adapter.sha256
    assert len(hub.gets) == 2, "a cached hf:// adapter is not downloaded again"


@pytest.mark.parametrize("value,fragment", [
    ("hf://me/not-adapter", "is not a PEFT LoRA adapter: the repository has no adapter_config.json"),
    ("hf://me/nothing-here", "repository me/nothing-here not found"),
])
def test_hf_references_that_are_not_adapters_are_refused(tmp_path, hub, value, fragment):
    with pytest.raises(LoraAdapterError) as info:
        _store(tmp_path).get(parse_adapter_ref(value))
    assert fragment in info.value.message, info.value.message


def test_hf_adapters_over_the_size_limit_are_refused_before_downloading(tmp_path, hub):
    with pytest.raises(LoraAdapterError, match="more than the 10 allowed"):
        _store(tmp_path, max_adapter_bytes=10).get(parse_adapter_ref("hf://me/adapter"))
    assert hub.gets == []


def test_tar_members_are_listed_as_given():
    """The pack helper writes plain members (a sanity check of the test's own archives)."""
    path = Path(__file__).parent / "__tmp_check.tar.gz"
    try:
        _tar(path, ADAPTER, folder="f")
        with tarfile.open(path) as tar:
            assert sorted(tar.getnames()) == ["f/adapter_config.json", "f/adapter_model.safetensors"]
    finally:
        path.unlink(missing_ok=True)


# --- fetch rules (cog_triton.fetch.rules) ------------------------------------------------------------


def _strict(tmp_path: Path, **rules) -> AdapterStore:
    return AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules(**rules)))


def test_by_default_adapters_come_only_over_https_from_public_addresses(tmp_path, served):
    root, server = served
    _tar(root / "a.tar.gz", ADAPTER)
    url = f"{server.url}/a.tar.gz"
    with pytest.raises(LoraAdapterError) as info:
        _strict(tmp_path).get(parse_adapter_ref(url))
    assert info.value.message == (f"lora_weights {url} is refused: plain http:// is refused; adapters are fetched "
                                  "only over https:// (set COG_TRITON_FETCH_ALLOW_HTTP=true to allow http://)")
    with pytest.raises(LoraAdapterError, match="127.0.0.1 is a loopback address; adapters are fetched only from "
                                               "public addresses"):
        _strict(tmp_path, allow_http=True).get(parse_adapter_ref(url))
    local = url.replace("127.0.0.1", "localhost")  # a name: refused when its address is known, at the connection
    with pytest.raises(LoraAdapterError, match="localhost resolves to a loopback address"):
        _strict(tmp_path, allow_http=True).get(parse_adapter_ref(local))
    assert server.counter == {}
    assert not list((tmp_path / "cache" / "adapters").iterdir())


def test_a_host_off_the_allow_list_is_refused(tmp_path, served):
    root, server = served
    _tar(root / "a.tar.gz", ADAPTER)
    store = _strict(tmp_path, allow_http=True, allow_private=True, allow_hosts=("adapters.example.com",))
    with pytest.raises(LoraAdapterError, match="the host 127.0.0.1 is not on the list of hosts adapters are fetched "
                                               r"from \(COG_TRITON_FETCH_ALLOW_HOSTS=adapters.example.com\)"):
        store.get(parse_adapter_ref(f"{server.url}/a.tar.gz"))
    assert server.counter == {}


def test_hf_references_follow_the_rules_on_the_hub_endpoint_and_the_owner_list(tmp_path, hub):
    with pytest.raises(LoraAdapterError) as info:
        _strict(tmp_path).get(parse_adapter_ref("hf://me/adapter"))
    assert info.value.message.startswith("lora_weights hf://me/adapter is refused: http://127.0.0.1:")
    assert "/me/adapter/resolve/main/adapter_config.json: plain http:// is refused; adapters" in info.value.message
    with pytest.raises(LoraAdapterError, match="lora_weights hf://me/adapter is refused: 127.0.0.1 is a loopback"):
        _strict(tmp_path, allow_http=True).get(parse_adapter_ref("hf://me/adapter"))
    with pytest.raises(LoraAdapterError) as info:
        _strict(tmp_path, allow_http=True, allow_private=True, allow_hf_owners=("trusted",)).get(
            parse_adapter_ref("hf://me/adapter"))
    assert info.value.message == ("lora_weights hf://me/adapter is refused: the Hub owner 'me' is not on the list of "
                                  "owners adapters are fetched from (COG_TRITON_FETCH_ALLOW_HF_OWNERS=trusted)")
    assert hub.gets == [] and hub.requests == []
    adapter = _strict(tmp_path, allow_http=True, allow_private=True, allow_hf_owners=parse_owners("ME")).get(
        parse_adapter_ref("hf://me/adapter"))
    assert adapter.sha256 == content_sha(ADAPTER)


# --- what one adapter may cost, and a cache that a refused adapter or its files do not weigh on (issue 47) ----------

from cog_triton.streaming.lora.store import SIZE_RECORD, adapter_cap  # noqa: E402
from cog_triton.streaming.lora.tasks import Adapters  # noqa: E402
from tensorrtllm_backend.lora import SUPPORTED_MODULES, LoraSpec, ModelShape  # noqa: E402

#: A model of 2 layers, hidden 8: its largest adapter at rank 2 on every module is a few KB.
TINY = LoraSpec(True, dtype="float32", max_rank=2, target_modules=SUPPORTED_MODULES,
                shape=ModelShape(num_layers=2, hidden_size=8, mlp_hidden_size=16, num_heads=2, num_kv_heads=1,
                                 head_size=4))


def test_the_cap_is_the_smaller_of_the_setting_and_the_largest_adapter_served(tmp_path):
    limits = StoreLimits(root=tmp_path, max_adapter_bytes=4 << 30, extra_bytes=1000)
    cap, reason = adapter_cap(limits, TINY)
    assert cap == TINY.largest_adapter_file_bytes() + 1000
    assert reason == (f"the largest adapter this model serves, {TINY.describe_largest_adapter()}, plus 1000 bytes for "
                      "its other files (COG_TRITON_ADAPTER_EXTRA_BYTES)")
    assert adapter_cap(StoreLimits(root=tmp_path, max_adapter_bytes=5000), TINY) == (
        5000, "COG_TRITON_ADAPTER_MAX_BYTES=5000")
    assert adapter_cap(limits, None) == (4 << 30, f"COG_TRITON_ADAPTER_MAX_BYTES={4 << 30}")
    assert adapter_cap(limits, LoraSpec(False, "off"))[0] == 4 << 30


def test_an_archive_over_the_cap_is_refused_before_it_is_unpacked_and_leaves_nothing(tmp_path, served):
    """The issue's case in small: a few hundred bytes of download whose safetensors unpacks to 2 MB, for a model
    whose largest adapter is a few KB. Refused from the members' declared sizes, naming the largest adapter."""
    root, server = served
    _tar(root / "big.tar.gz", {**ADAPTER, "adapter_model.safetensors": b"\0" * 2_000_000})
    assert (root / "big.tar.gz").stat().st_size < 10_000
    store = AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open(), extra_bytes=1000),
                         TINY)
    with pytest.raises(LoraAdapterError) as info:
        store.get(parse_adapter_ref(f"{server.url}/big.tar.gz"))
    message = info.value.message
    assert f"its members declare {2_000_000 + len(CONFIG)} bytes (up to and including 'adapter_model.safetensors'); " \
           "nothing was written" in message
    assert f"over the limit of {store.cap_bytes} bytes (the largest adapter this model serves, rank 2 on " in message
    assert list(store.folder.iterdir()) == []


def test_hf_adapters_over_the_cap_are_refused_by_their_head(tmp_path, hub):
    hub.add_repo("me/huge", {**ADAPTER, "adapter_model.safetensors": b"\0" * 200_000})
    store = AdapterStore(StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open(), extra_bytes=10),
                         TINY)
    with pytest.raises(LoraAdapterError, match=r"has \d+ bytes of adapter files, more than the \d+ allowed \(the "
                                               "largest adapter this model serves, rank 2 on"):
        store.get(parse_adapter_ref("hf://me/huge"))
    assert [got for got in hub.gets if got[0] == "me/huge"] == []


def _cache_entries(store: AdapterStore) -> list[str]:
    return sorted(p.name for p in store.folder.iterdir()) if store.folder.is_dir() else []


@pytest.mark.parametrize("files,fragment", [
    ({"README.md": b"hi", **{f"junk/{i}": b"" for i in range(50)}}, "is not a PEFT LoRA adapter"),
    ({**ADAPTER, "adapter_config.json": b'{"peft_type": "LORA", "lora_alpha": "8"}'},
     "adapter_config.json lora_alpha must be a finite number"),
], ids=["not-peft", "bad-config"])
def test_a_refused_adapter_leaves_nothing_in_the_cache(tmp_path, served, files, fragment):
    root, server = served
    _tar(root / "x.tar.gz", files)
    store = _store(tmp_path)
    with pytest.raises(LoraAdapterError, match=fragment):
        store.get(parse_adapter_ref(f"{server.url}/x.tar.gz"))
    assert _cache_entries(store) == []


def test_an_adapter_the_converter_refuses_leaves_nothing_in_the_cache(tmp_path, served):
    """The files are a PEFT adapter, but not one this model serves (a module it does not apply): Adapters.resolve
    refuses it and removes it, so the next request fetches and refuses it again rather than finding it."""
    import torch
    from safetensors.torch import save

    root, server = served
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    weights = save({f"{prefix}.lora_A.weight": torch.ones(2, 8), f"{prefix}.lora_B.weight": torch.ones(8, 2)})
    _tar(root / "q.tar.gz", {"adapter_config.json": CONFIG, "adapter_model.safetensors": weights})
    spec = dataclasses.replace(TINY, target_modules=("attn_v",))
    adapters = Adapters(spec, StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open()))
    for attempt in (1, 2):
        with pytest.raises(LoraAdapterError, match=r"it adapts q_proj \(attn_q\), but the engine applies LoRA to"):
            adapters.resolve(parse_adapter_ref(f"{server.url}/q.tar.gz"))
        assert _cache_entries(adapters.store) == [], attempt
    assert server.counter["/q.tar.gz"] == 2


def _filesystem_calls(monkeypatch) -> Counter:
    """Count the calls that visit the file system (each a directory read or a stat) while the test runs."""
    calls: Counter = Counter()
    for name in ("scandir", "listdir", "stat", "lstat", "open"):
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    return calls


def test_eviction_reads_one_record_per_adapter_whatever_the_folders_hold(tmp_path, served, monkeypatch):
    """Each cached folder's bytes are counted once, when it is first read, and kept in it (SIZE_RECORD); an eviction
    then costs the same number of file-system calls with 5,000 more files in a folder as without them (it walked
    every file of every folder: 0.9-2 s per fetch after 100,000 files)."""
    root, server = served
    for n in range(3):
        _tar(root / f"{n}.tar.gz", _sized(n))
    store = _store(tmp_path, budget_bytes=10**9)
    refs = [parse_adapter_ref(f"{server.url}/{n}.tar.gz") for n in range(3)]
    for ref in refs:
        store.get(ref)
        assert (store.folder / ref.key / SIZE_RECORD).is_file()
    recorded = int((store.folder / refs[0].key / SIZE_RECORD).read_text())
    assert recorded == sum(f.stat().st_size for f in (store.folder / refs[0].key).rglob("*")
                           if f.is_file() and f.name != SIZE_RECORD)

    with monkeypatch.context() as patch:
        calls = _filesystem_calls(patch)
        store.evict()
    before = dict(calls)
    junk = store.folder / refs[1].key / "junk"
    junk.mkdir()
    for i in range(5000):
        (junk / str(i)).touch()
    with monkeypatch.context() as patch:
        calls = _filesystem_calls(patch)
        store.evict()
    assert dict(calls) == before and sum(before.values()) < 30, (before, dict(calls))
