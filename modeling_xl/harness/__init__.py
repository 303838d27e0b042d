"""lm-evaluation-harness with memory: `import modeling_xl.harness` registers the model class `transformer-xl` with
lm_eval (`lm_eval.api.registry`), so `simple_evaluate(model="transformer-xl", model_args="pretrained=FOLDER")` and
`scripts/evaluate_harness.py` (lm_eval's own command line) score a folder segment by segment with memory.

- `settings`: the segment and memory lengths a folder is evaluated with (its pretraining run's evaluation settings);
  needs no lm_eval.
- `lm_eval_model`: `TransformerXLLM`, the lm_eval model class (needs `pip install "modeling-xl[harness]"`); imported
  and registered here where lm_eval is installed. Elsewhere `TransformerXLLM` raises an ImportError naming the extra.
"""

import importlib.util

from .settings import MODEL_NAME, evaluation_settings

if importlib.util.find_spec("lm_eval") is not None:
    from .lm_eval_model import TransformerXLLM


def __getattr__(name):
    if name == "TransformerXLLM":
        raise ImportError("modeling_xl.harness.TransformerXLLM needs lm-evaluation-harness, which is not installed; "
                          "expected `pip install \"modeling-xl[harness]\"`")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODEL_NAME", "TransformerXLLM", "evaluation_settings"]
