"""Tools for development: the local stack that scripts/serve, scripts/demo.py, the benchmarks and the tests run
(:mod:`cog_triton.dev.local`). The predictor never imports this package."""
