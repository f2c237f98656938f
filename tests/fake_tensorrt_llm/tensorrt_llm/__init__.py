"""Recording stand-in for TensorRT-LLM 1.2.1 (see ../README.md); not the real package."""

import json
import os

__version__ = "1.2.1"


def record(call, **kwargs):
    """Append {"call": call, **kwargs} as a JSON line to $FAKE_TRTLLM_RECORD."""
    with open(os.environ["FAKE_TRTLLM_RECORD"], "a") as fh:
        fh.write(json.dumps({"call": call, **kwargs}, sort_keys=True) + "\n")


class Mapping:
    """tensorrt_llm.Mapping: tp_size/pp_size/cp_size are keyword-only, world_size must match."""

    def __init__(self, world_size=1, rank=0, gpus_per_node=8, *, cp_size=1, tp_size=1, pp_size=1):
        if world_size != tp_size * pp_size * cp_size:
            raise ValueError(f"world_size {world_size} != tp_size {tp_size} * pp_size {pp_size} * cp_size {cp_size}")
        self.world_size, self.rank, self.tp_size, self.pp_size = world_size, rank, tp_size, pp_size

    def to_json(self):
        return {"world_size": self.world_size, "rank": self.rank, "tp_size": self.tp_size, "pp_size": self.pp_size}
