"""tensorrt_llm.llmapi stand-in: only the tokenizer module (see ../../README.md)."""
