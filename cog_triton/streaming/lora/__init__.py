"""LoRA adapters per request on TensorRT-LLM's LoRA cache (the ``lora_weights`` input).

* :mod:`cog_triton.fetch.adapter_refs`: what ``lora_weights`` may name (an http(s) URL of an archive, or
  ``hf://owner/repo[@revision]``), checked in the Cog worker before anything runs.
* :mod:`cog_triton.streaming.lora.store`: the adapter files, fetched with the weights' bounded, verified, locked
  fetcher into a local disk cache shared by the stream processes (LRU within a size budget).
* :mod:`cog_triton.streaming.lora.convert`: a Hugging Face PEFT adapter -> TensorRT-LLM's ``lora_weights`` and
  ``lora_config`` tensors, by upstream's rules, after checking it fits the engine.
* :mod:`cog_triton.streaming.lora.tasks`: a stable ``lora_task_id`` per adapter, the tasks this process has sent
  weights for, and :class:`~cog_triton.streaming.lora.tasks.Adapters`, what a request's preparation calls.
"""
