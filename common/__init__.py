"""The bottom layer of cog-triton: what both ``tensorrtllm_backend`` and ``cog_triton`` use.

Layers point one way (``tests/test_layers.py`` enforces it)::

    predict.py, train.py, scripts/   ->  cog_triton  ->  tensorrtllm_backend  ->  common

* :mod:`common.errors`: the error tree (codes and messages) of every layer.
* :mod:`common.files`: sha256 hashing of files and the names the weights folder reserves.
* :mod:`common.http`: one SSL context for a process's one-shot httpx requests (each would otherwise load the CA bundle).
"""
