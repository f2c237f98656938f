"""QuantConfig of the stand-in."""


class QuantConfig:
    def __init__(self, quant_algo=None, kv_cache_quant_algo=None):
        self.quant_algo, self.kv_cache_quant_algo = quant_algo, kv_cache_quant_algo

    def to_json(self):
        algo = self.quant_algo.value if self.quant_algo is not None else None
        kv = self.kv_cache_quant_algo.value if self.kv_cache_quant_algo is not None else None
        return {"quant_algo": algo, "kv_cache_quant_algo": kv}
