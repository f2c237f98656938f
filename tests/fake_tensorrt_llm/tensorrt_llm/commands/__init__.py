"""tensorrt_llm.commands (stand-in): only ``build``, the module behind the ``trtllm-build`` console script."""
