"""How many tokens a prediction may generate: its max_tokens within what the engine's sequence length leaves after
its prompt (in a stream process, once the prompt is tokenized)."""

from __future__ import annotations

from common.errors import InputError
from cog_triton.ipc import PredictInputs


def token_budget(
    inputs: PredictInputs, prompt_tokens: int, max_input_len: int, max_seq_len: int, limit_reason: str = ""
) -> int:
    """Tokens to request for ``inputs``: its ``max_tokens`` capped by what the engine's max_seq_len leaves.

    ``prompt_tokens`` counts the whole rendered input: with ``messages``, every turn of the
    conversation plus the chat template's own tokens. ``max_input_len`` is the longest prompt
    the executor takes (:meth:`tensorrtllm_backend.engine.ModelLimits.executor_max_input_len`),
    ``limit_reason`` how it was reached (named in the error).

    Raises:
        InputError: the prompt (or conversation) exceeds ``max_input_len``, leaves no room to
            generate, or ``min_tokens`` does not fit; the message gives both numbers.
    """
    what, unit = ("conversation", "the chat template") if inputs.messages is not None else ("prompt", "formatting")
    if prompt_tokens > max_input_len:
        reason = f" ({limit_reason})" if limit_reason else ""
        raise InputError(
            f"the {what} is too long: it has {prompt_tokens} tokens (after {unit}), "
            f"and the model's maximum input length is {max_input_len} tokens{reason}; shorten the {what}"
        )
    room = max_seq_len - prompt_tokens
    if room < 1:
        raise InputError(
            f"the {what} has {prompt_tokens} tokens, which leaves no room to generate within the "
            f"model's maximum sequence length of {max_seq_len} tokens"
        )
    if inputs.min_tokens > room:
        raise InputError(
            f"min_tokens={inputs.min_tokens} does not fit: the {what} has {prompt_tokens} tokens and the "
            f"maximum sequence length is {max_seq_len}, so at most {room} tokens can be generated"
        )
    return min(inputs.max_tokens, room)
