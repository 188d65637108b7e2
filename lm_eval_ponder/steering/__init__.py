"""Stage 1 of the data path: the "think step by step" steering vector.

``vector`` (the format every later stage reads), ``extraction`` (the paper's and Fractional
Reasoning's estimators), ``inspection`` (a text report), ``cli`` (``python -m
lm_eval_ponder.steer``). The vector API is re-exported lazily: ``steer --help`` must not pay
for importing torch.
"""

_VECTOR_API = ("DEFAULT_LAYER_FRACTION", "META_FILE", "VECTORS_FILE", "SteeringVector",
               "default_layer", "load_vector", "save_vector")


def __getattr__(name: str):
    if name in _VECTOR_API:
        from lm_eval_ponder.steering import vector

        return getattr(vector, name)
    raise AttributeError(f"module 'lm_eval_ponder.steering' has no attribute {name!r}")
