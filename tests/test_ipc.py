"""cog_triton.ipc: the typed messages between the Cog worker and a stream process survive a real socket pair."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path

import pytest

from common.errors import InputError, TritonDiedError
from cog_triton import ipc
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from tensorrtllm_backend.engine import ModelLimits


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_every_message_arrives_typed_with_its_fields(pair) -> None:
    ours, theirs = pair
    inputs = validate_inputs(prompt="Hi", temperature=0)
    config = GeneratorConfig(tokenizer_dir=Path("/tok"), limits=ModelLimits(max_batch_size=8, max_input_len=64, max_seq_len=128), grpc_address="127.0.0.1:1")
    commands = [ipc.Config(config, 0.05), ipc.Start(7, "req-7", inputs, 12.5), ipc.Cancel(7, False),
                ipc.StopRequest("req-3"), ipc.Reconnect()]
    frame = ipc.Frame(
        texts=[(7, "Hel"), (8, "Hi"), (7, "lo")],
        events=[ipc.Ready(41, load_s=1.5), ipc.Accepted(7, 12), ipc.Rejected(9, InputError("the prompt is empty")),
                ipc.FirstToken(7, 0.02), ipc.End(7, 3), ipc.Failed(8, TritonDiedError("Triton exited"), 1),
                ipc.Cancelled(10, 4), ipc.Stats({"fetches": 1})],
    )
    theirs.sendall(b"".join(ipc.encode(command) for command in commands) + ipc.encode(frame))
    reader = ipc.FrameReader(ours)
    got = [reader.read() for _ in range(len(commands) + 1)]
    assert got[:-1] == commands and [type(c) for c in got[:-1]] == [type(c) for c in commands]
    assert got[1].inputs == inputs and got[0].generator == config and got[2].send_stop_request is False
    received = got[-1]
    assert type(received) is ipc.Frame and received.texts == [(7, "Hel"), (8, "Hi"), (7, "lo")]
    assert [type(e) for e in received.events] == [type(e) for e in frame.events]
    rejected, failed = received.events[2], received.events[5]
    assert type(rejected.error) is InputError and rejected.error.message == "the prompt is empty"
    assert type(failed.error) is TritonDiedError and failed.output_tokens == 1
    assert received.events[0] == ipc.Ready(41, 1.5, "") and received.events[-1].counts == {"fetches": 1}


def test_text_travels_as_plain_pairs_so_a_frame_pickles_on_the_fast_path() -> None:
    """A frame's text chunks are plain tuples (pickle's fast path; the figures are in cog_triton.ipc): the only
    class a frame of text names is Frame itself, however many chunks it holds."""
    data = pickle.dumps(ipc.Frame([(i, f"chunk {i}") for i in range(40)], []), protocol=5)
    assert data.count(b"Frame") == 1
    assert b"cog_triton.ipc" in data and data.count(b"cog_triton") == 1


def test_a_closed_channel_and_an_oversized_frame_are_errors(pair) -> None:
    ours, theirs = pair
    theirs.sendall(ipc.HEADER.pack(ipc.MAX_FRAME_BYTES + 1))
    with pytest.raises(ValueError, match="at most"):
        ipc.FrameReader(ours).read()
    reader = ipc.FrameReader(theirs)
    ours.sendall(ipc.encode(ipc.Reconnect())[:-1])  # cut inside the frame
    ours.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError, match="inside a frame"):
        reader.read()
