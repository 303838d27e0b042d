"""The final folder (model + code, tokenizer, resolved config, results, plot, model card) and its upload to the Hub.

The output folder itself is the final folder, as in the transformers example scripts: `from_pretrained(output_dir)`
works, and `--push_to_hub` uploads exactly its files except the resumable checkpoints (`checkpoints/`) and temporary
files of interrupted saves.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData

from ..runtime.run_folder import card_sections, replace_text, update_card_section
from .checkpointing import CHECKPOINTS

# .write_test*: output-folder probes; .run.lock: the lock of the run (output_guard)
UPLOAD_EXCLUDE = [f"{CHECKPOINTS}/*", ".tmp*", "**/.tmp*", ".write_test*", ".run.lock"]
TEMPLATES = Path(__file__).resolve().parents[2] / "model_cards"


class HubUploadError(RuntimeError):
    """The upload failed; the local folder is intact and the message says how to retry."""


def upload_file_list(folder) -> list[str]:
    """The files `push_folder` sends (relative POSIX paths, sorted): everything but checkpoints and temporary files."""
    folder = Path(folder)
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and relative.parts[0] != CHECKPOINTS and not any(p.startswith(".tmp") for p in relative.parts):
            if not relative.name.startswith(".write_test") and relative.as_posix() != ".run.lock":
                files.append(relative.as_posix())
    return files


def push_folder(folder, repo_id: str, token: str | None = None, private: bool = False,
                commit_message: str = "Upload Transformer-XL pretrained with modeling_xl") -> str:
    """Create the repo (if needed) and upload the folder in one commit. Returns the commit URL."""
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                                 ignore_patterns=UPLOAD_EXCLUDE, repo_type="model")
    except Exception as error:  # any failure (network, auth, quota): keep the folder, explain the retry
        raise HubUploadError(
            f"push_to_hub to {repo_id!r} failed: {type(error).__name__}: {error}\n"
            f"The trained model is intact in {folder}. Retry the upload with:\n"
            f"  hf upload {repo_id} {folder} . --exclude '{CHECKPOINTS}/*'\n"
            f"(log in first with `hf auth login` or pass --token)."
        ) from error
    return str(getattr(info, "commit_url", info))


def card_hyperparameters(args, data_info: dict) -> list[tuple[str, object]]:
    """(name, value) rows of the card's hyperparameter table: the preset, the objective, the batch, the model or
    config folder given, the recipe's settings, precision, size and processes."""
    given = args.model_name_or_path or args.config_name
    rows = [("preset" if given is None else "recipe preset", args.preset), ("objective", args.objective),
            ("train_batch_size (streams)", data_info.get("train_batch_size", args.train_batch_size))]
    rows += [(name, Path(getattr(args, name)).name) for name in ("model_name_or_path", "config_name")
             if getattr(args, name)]
    rows += [(k, getattr(args, k)) for k in (
        "gradient_accumulation_steps", "tgt_len", "mem_len", "eval_tgt_len", "eval_mem_len", "eval_clamp_len",
        "eval_same_length", "max_train_steps", "learning_rate", "optimizer", "weight_decay", "lr_scheduler_type",
        "num_warmup_steps", "max_grad_norm", "seed")]
    return rows + [("mixed_precision", data_info.get("mixed_precision", args.mixed_precision)),
                   ("parameters", f"{data_info.get('num_parameters', 0):,}"),
                   ("processes", data_info.get("num_processes", 1))]


def model_card(folder, *, repo_id: str, args, results: dict, data_info: dict, wall_time_s: float,
               hardware: str, template: str = "causal_lm.md", usage_path: str | None = None) -> ModelCard:
    """Render `model_cards/<template>` with `model-index` metadata built offline (ModelCardData + EvalResult).

    `usage_path`: what the card's usage sample loads (the Hub id a folder is pushed to, or the local folder as the
    user named it); `repo_id` by default."""
    path = TEMPLATES / template
    if not path.is_file():
        raise FileNotFoundError(f"model card template {path} is missing; expected the repository's model_cards/ folder")
    dataset = data_info.get("dataset_name", "custom")
    metric_type, metric_name = ("bpc", "Bits per character") if "bpc" in results else ("perplexity", "Perplexity")
    reuse_len = None
    if args.objective == "plm":  # exp(NLL per predicted token) under the permutation objective, not a causal LM's
        from .plm_objective import plm_settings

        metric_name = "Permutation-LM perplexity"
        reuse_len = plm_settings(args)["reuse_len"]
    eval_results = [
        EvalResult(task_type="text-generation", task_name="Language modeling", dataset_type=dataset,
                   dataset_name=data_info.get("dataset_pretty_name", dataset), dataset_split="validation",
                   metric_type=metric_type, metric_name=metric_name, metric_value=round(results[metric_type], 4))
    ]
    card_data = ModelCardData(
        language="en", license="apache-2.0", library_name="transformers", pipeline_tag="text-generation",
        tags=["transformer-xl", "modeling_xl", args.objective], model_name=repo_id.split("/")[-1],
        eval_results=eval_results,
        datasets=[data_info["hub_dataset"]] if data_info.get("hub_dataset") else None,  # local data: no Hub link
    )
    global_batch = data_info.get("train_batch_size", args.train_batch_size)
    # the architecture is the preset's unless a model or config folder gave it (the recipe may still be the preset's)
    given = args.model_name_or_path or args.config_name
    architecture = (f"Transformer-XL ({args.preset} preset)" if given is None
                    else f"Transformer-XL (the configuration of `{Path(given).name}`)")
    shown = [(k, f"{v:.4f}" if isinstance(v, float) else v) for k, v in results.items()]
    if "start" in data_info:  # the same metrics before training, for scale
        shown += [(f"{k} at step 0", f"{v:.4f}" if isinstance(v, float) else v)
                  for k, v in data_info["start"].items() if k in ("perplexity", "bpc")]
    return ModelCard.from_template(
        card_data, template_path=str(path), model_name=repo_id.split("/")[-1], repo_id=repo_id, objective=args.objective,
        usage_path=usage_path or repo_id,
        architecture=architecture,
        objective_name="causal LM" if args.objective == "clm" else "XLNet-style permutation LM",
        wall_time=f"{wall_time_s / 60:.1f} minutes", hardware=hardware,
        example_prompt=data_info.get("example_prompt", "The"),
        intended_use_note=("This checkpoint is CPU-sized and trained briefly: a demonstration, not a useful model."
                           if args.preset in ("tiny", "debug") else ""),
        dataset_description=data_info.get("description", dataset),
        train_tokens=f"{data_info.get('train_tokens', 0):,}", eval_tokens=f"{data_info.get('eval_tokens', 0):,}",
        # the Results table counts the tokens scored (a causal LM scores every token but the first)
        scored_tokens=(f"{results['eval_tokens']:,}" if "eval_tokens" in results
                       and results["eval_tokens"] != data_info.get("eval_tokens") else None),
        tokenizer_description=data_info.get("tokenizer", "see tokenizer files"),
        hp=args, global_batch=global_batch, hyperparameters=card_hyperparameters(args, data_info), results=shown,
        reuse_len=reuse_len,
        metric_description="bits per character" if metric_type == "bpc" else "perplexity = exp(total NLL / tokens)",
        scale_note=("Trained for a few minutes on a small corpus: its perplexity is far from the paper's "
                    "WikiText-103 (24.0 base) or enwik8 (0.99 bpc) figures." if args.preset in ("tiny", "debug")
                    else "Check the measured results above against the paper before relying on this checkpoint."),
    )


def write_results(folder, results: dict, history: list[dict]) -> None:
    """`eval_results.json`: final validation metrics and every evaluation during training."""
    replace_text(Path(folder, "eval_results.json"), json.dumps({**results, "history": history}, indent=2))


STALE_NOTE = ("> Measured on the weights this folder held before its latest training run, not on the current ones: run "
              "the evaluation again to update this section.")


def save_card_keeping_sections(card, path) -> list[str]:
    """Save `card` to `path` (README.md), carrying over the `<!-- name:start -->` ... `<!-- name:end -->` sections
    other tools added to the card it replaces (`scripts/evaluate_lm.py`'s), each marked as measured on the earlier
    weights. Returns the names of the sections carried over."""
    path = Path(path)
    sections = card_sections(path.read_text(encoding="utf-8")) if path.exists() else []
    replace_text(path, str(card))
    for name, body in sections:
        update_card_section(path, name, body if body.startswith(STALE_NOTE) else f"{STALE_NOTE}\n\n{body}")
    return [name for name, _ in sections]
