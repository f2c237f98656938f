"""Stand-in for tensorrt_llm.llmapi.tokenizer: ``_xgrammar_tokenizer_info`` records its call and returns
a dict of the real function's shape (TensorRT-LLM 1.1.0 and 1.2.x: ``encoded_vocab`` = the vocabulary's token
strings ordered by id, ``tokenizer_str`` = the fast tokenizer's JSON, ``stop_token_ids`` = [eos id];
a slow tokenizer is refused with ValueError). Not the real implementation: tests check the wiring."""

from tensorrt_llm import record


def _xgrammar_tokenizer_info(tokenizer):
    from transformers import PreTrainedTokenizerFast

    record("_xgrammar_tokenizer_info", tokenizer=type(tokenizer).__name__)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"Unsupported tokenizer type: {type(tokenizer)}")
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return {
        "encoded_vocab": [token for token, _ in vocab],
        "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
        "stop_token_ids": [tokenizer.eos_token_id],
    }
