"""Transformer-XL and XLNet-style permutation-LM models for transformers 5.

Importing this package registers every config and model class with the transformers Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .backbones import TransformerXLAnyBackbone
from .configuration_transformer_xl import PRESETS, LegacyTransfoXLConfig, TransformerXLConfig
from .modeling_classification import TransformerXLForSequenceClassification, TransformerXLSequenceClassifierOutput
from .modeling_multiple_choice import TransformerXLForMultipleChoice, TransformerXLMultipleChoiceOutput
from .modeling_permutation_lm import (
    TransformerXLForPermutationLM,
    TransformerXLPermutationLMOutput,
    TransformerXLPermutationModel,
)
from .modeling_question_answering import (
    TransformerXLForQuestionAnswering,
    TransformerXLForQuestionAnsweringSimple,
    TransformerXLQuestionAnsweringOutput,
    TransformerXLQuestionAnsweringSimpleOutput,
)
from .modeling_token_classification import TransformerXLForTokenClassification, TransformerXLTokenClassifierOutput
from .modeling_transformer_xl import (
    TransformerXLCausalLMOutput,
    TransformerXLForCausalLM,
    TransformerXLModel,
    TransformerXLModelOutput,
    TransformerXLPreTrainedModel,
)

AutoConfig.register(TransformerXLConfig.model_type, TransformerXLConfig, exist_ok=True)
# Legacy transformers-4.x Transformer-XL folders (model_type "transfo-xl"): converted on load by the Auto classes too.
AutoConfig.register(LegacyTransfoXLConfig.model_type, LegacyTransfoXLConfig, exist_ok=True)
# one config class for both backbones: AutoModel builds the one of the config's attn_type (`backbones.backbone_class`)
AutoModel.register(TransformerXLConfig, TransformerXLAnyBackbone, exist_ok=True)
AutoModelForCausalLM.register(TransformerXLConfig, TransformerXLForCausalLM, exist_ok=True)
# XLNet-style pretraining head (transformers maps XLNetLMHeadModel to AutoModelForPreTraining too).
AutoModelForPreTraining.register(TransformerXLConfig, TransformerXLForPermutationLM, exist_ok=True)
AutoModelForSequenceClassification.register(TransformerXLConfig, TransformerXLForSequenceClassification, exist_ok=True)
# as transformers maps XLNet: AutoModelForQuestionAnswering builds the span head run_qa.py reads (start/end logits)
AutoModelForQuestionAnswering.register(TransformerXLConfig, TransformerXLForQuestionAnsweringSimple, exist_ok=True)
AutoModelForTokenClassification.register(TransformerXLConfig, TransformerXLForTokenClassification, exist_ok=True)
AutoModelForMultipleChoice.register(TransformerXLConfig, TransformerXLForMultipleChoice, exist_ok=True)

# `save_pretrained` then writes the code next to the weights and a complete `auto_map` (trust_remote_code loading).
TransformerXLConfig.register_for_auto_class()
TransformerXLModel.register_for_auto_class("AutoModel")
TransformerXLForCausalLM.register_for_auto_class("AutoModelForCausalLM")
TransformerXLForPermutationLM.register_for_auto_class("AutoModelForPreTraining")
TransformerXLForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
TransformerXLForQuestionAnsweringSimple.register_for_auto_class("AutoModelForQuestionAnswering")
# XLNet's beam-search head: its own folders map AutoModelForQuestionAnswering to it (their weights are its)
TransformerXLForQuestionAnswering.register_for_auto_class("AutoModelForQuestionAnswering")
TransformerXLForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
TransformerXLForMultipleChoice.register_for_auto_class("AutoModelForMultipleChoice")

__all__ = [
    "PRESETS",
    "TransformerXLConfig",
    "TransformerXLModel",
    "TransformerXLForCausalLM",
    "TransformerXLForSequenceClassification",
    "TransformerXLSequenceClassifierOutput",
    "TransformerXLPreTrainedModel",
    "TransformerXLModelOutput",
    "TransformerXLCausalLMOutput",
    "TransformerXLPermutationModel",
    "TransformerXLForPermutationLM",
    "TransformerXLPermutationLMOutput",
    "TransformerXLForQuestionAnsweringSimple",
    "TransformerXLQuestionAnsweringSimpleOutput",
    "TransformerXLForQuestionAnswering",
    "TransformerXLQuestionAnsweringOutput",
    "TransformerXLForTokenClassification",
    "TransformerXLTokenClassifierOutput",
    "TransformerXLForMultipleChoice",
    "TransformerXLMultipleChoiceOutput",
]


def __getattr__(name):
    """`modeling_xl.RECIPES`: the training recipes live in `modeling_xl.training.recipes` (they are read only by
    training; saved model folders carry the configuration file, not them), imported on first use."""
    if name == "RECIPES":
        from .training.recipes import RECIPES

        return RECIPES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
