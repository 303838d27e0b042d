"""Pretraining library behind `scripts/pretrain.py`: arguments -> data -> model -> recurrent training -> publishing."""

from ..data.pretrain_data import PretrainData, data_from_tokens
from ..evaluation.stream_scoring import bits_per_character, evaluate_causal_lm, perplexity
from .arguments import PretrainArguments, build_parser, parse_args, processes_split, resolve
from .checkpointing import list_checkpoints, resolve_checkpoint
from .loop import run_pretraining
from .publishing import HubUploadError, push_folder, upload_file_list
from .recipes import RECIPES
from .steps import NonFiniteLossError, train_step

__all__ = [
    "PretrainArguments",
    "PretrainData",
    "RECIPES",
    "HubUploadError",
    "NonFiniteLossError",
    "bits_per_character",
    "build_parser",
    "data_from_tokens",
    "evaluate_causal_lm",
    "list_checkpoints",
    "parse_args",
    "perplexity",
    "processes_split",
    "push_folder",
    "resolve",
    "resolve_checkpoint",
    "run_pretraining",
    "train_step",
    "upload_file_list",
]
