"""What a fine-tuning run leaves in its output folder, in the order it is written: the model (+ remote code) and the
tokenizer (`save_model`, first, so nothing after it can lose them), then the job's results file and the model card
`README.md` (`Job.save_records`): from `model_cards/sequence_classification.md` for classification
(`classification_card`), from `model_cards/fine_tuned_task.md` for the other tasks (`task_card`)."""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from ..runtime.run_folder import replace_text
from .arguments import TRAINING_CONFIG, FinetuneArguments
from .tasks import TASKS, Task

TEMPLATE = Path(__file__).resolve().parents[2] / "model_cards" / "sequence_classification.md"


def save_model(model, tokenizer, pad_id: int, output_dir) -> None:
    """The classifier and its tokenizer. The tokenizer carries the pad token fine-tuning padded with (word-level
    tokenizers declare none; here `<eos>`), and the config its id, so `tokenizer(texts, padding=True)`,
    `pipeline("text-classification", batch_size=8)` and `DataCollatorWithPadding` work on the folder as it is."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    model.config.pad_token_id = tokenizer.pad_token_id
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def save_training_config(args, chosen: dict[str, str], output_dir) -> None:
    """`training_config.json`: every resolved argument of the run (the defaults chosen for this model included) and,
    under `defaults_chosen`, why each default has its value (`defaults.apply_defaults`)."""
    values = {**asdict(args), "defaults_chosen": chosen}
    replace_text(Path(output_dir) / TRAINING_CONFIG, json.dumps(values, indent=2, default=str) + "\n")


def dev_line(results: dict) -> str:
    """The dev scores, steps, time and examples of a run's results in one line."""
    return run_line(TASKS[results["problem_type"]].summary(results["dev"]), results)


def classification_card(args: FinetuneArguments, task: Task, results: dict, baseline: dict | None, config):
    """`huggingface_hub.ModelCard`: `model-index` with the task's headline dev metrics, a table of them (and of the
    `compare_with` run), the hyperparameters."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    dataset = args.dataset_name or Path(args.train_file).resolve().parent.name  # the folder the files are in
    name = Path(args.output_dir).name
    evals = [EvalResult(task_type="text-classification", dataset_type=dataset, dataset_name=dataset,
                        dataset_config=args.dataset_config_name, dataset_split="validation", metric_type=metric_type,
                        metric_name=title, metric_value=round(results["dev"][key], 4))
             for key, metric_type, title in task.card_metrics if math.isfinite(results["dev"][key])]
    card_data = ModelCardData(model_name=name, library_name="transformers", pipeline_tag="text-classification",
                              tags=["transformer-xl", "text-classification", "modeling_xl"], eval_results=evals)
    runs = [(results["initialisation"], results)] + ([(baseline["initialisation"], baseline)] if baseline else [])
    columns = [title for _, _, title in task.card_metrics]
    rows = [(init, [_shown(r["dev"].get(key)) for key, _, _ in task.card_metrics], r["train_steps"],
             f"{r['train_seconds']:.0f}") for init, r in runs]
    hyperparameters = [(k, v) for k, v in asdict(args).items() if v is not None and k not in ("compare_with",)]
    if not TEMPLATE.exists():  # installed without the repository's model_cards/ folder
        raise FileNotFoundError(f"model card template {TEMPLATE} is missing; expected the repository's model_cards/")
    hardware = f"{platform.machine()} CPU" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    return ModelCard.from_template(
        card_data, template_path=str(TEMPLATE), model_name=name, dataset=dataset, labels=results["labels"],
        problem_type=task.problem_type, initialisation=results["initialisation"], summary_type=config.summary_type,
        architecture=f"{config.n_layer} layers, d_model {config.d_model}, {config.n_head} heads, attn_type "
                     f"{config.attn_type}", columns=columns, results=rows, hyperparameters=hyperparameters,
        num_dev=results["num_dev_examples"], num_train=results["num_train_examples"], hardware=hardware,
        dev_line=dev_line(results), long_document=args.long_document, segment_len=args.max_length,
        unknown_share=results.get("unknown_token_share"))


def _shown(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "-"


TASK_TEMPLATE = TEMPLATE.with_name("fine_tuned_task.md")


def usage_code(auto_class: str, *lines: str) -> str:
    """The card's code: load the folder with `auto_class` and its tokenizer, then `lines` (MODEL: the folder)."""
    return "\n".join([f"from transformers import {auto_class}, AutoTokenizer", "",
                      f'model = {auto_class}.from_pretrained("MODEL", trust_remote_code=True)',
                      'tokenizer = AutoTokenizer.from_pretrained("MODEL")', *lines])


def task_card(job, results: dict, baseline: dict | None, config, *, what: str, unit: str, task_type: str,
              usage: str, model_text: str):
    """The model card of a question-answering, token-classification or multiple-choice run
    (`model_cards/fine_tuned_task.md`): `model-index` with the job's `card_metrics` (`task_type` as the Hub names
    it), a table of them (and of the `compare_with` run), the hyperparameters."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    args = job.args
    dataset = args.dataset_name or Path(args.train_file).resolve().parent.name  # the folder the files are in
    name = Path(args.output_dir).name
    evals = [EvalResult(task_type=task_type, dataset_type=dataset, dataset_name=dataset,
                        dataset_config=args.dataset_config_name, dataset_split="validation", metric_type=metric_type,
                        metric_name=title, metric_value=round(results["dev"][key], 4))
             for key, metric_type, title in job.card_metrics
             if isinstance(results["dev"].get(key), float) and math.isfinite(results["dev"][key])]
    card_data = ModelCardData(model_name=name, library_name="transformers", pipeline_tag=task_type,
                              tags=["transformer-xl", task_type, "modeling_xl"], eval_results=evals)
    runs = [(results["initialisation"], results)] + ([(baseline["initialisation"], baseline)] if baseline else [])
    rows = [(init, [_shown(r["dev"].get(key)) for key, _, _ in job.card_metrics], r["train_steps"],
             f"{r['train_seconds']:.0f}") for init, r in runs]
    hyperparameters = [(k, v) for k, v in asdict(args).items() if v is not None and k not in ("compare_with",)]
    if not TASK_TEMPLATE.exists():  # installed without the repository's model_cards/ folder
        raise FileNotFoundError(f"model card template {TASK_TEMPLATE} is missing; expected the repository's "
                                "model_cards/")
    hardware = f"{platform.machine()} CPU" if not torch.cuda.is_available() else torch.cuda.get_device_name()
    return ModelCard.from_template(
        card_data, template_path=str(TASK_TEMPLATE), model_name=name, dataset=dataset, what=what, unit=unit,
        usage=usage.replace("MODEL", name), model_text=model_text, initialisation=results["initialisation"],
        architecture=f"{config.n_layer} layers, d_model {config.d_model}, {config.n_head} heads, attn_type "
                     f"{config.attn_type}", columns=[title for _, _, title in job.card_metrics], results=rows,
        hyperparameters=hyperparameters, num_dev=results["num_dev_examples"], num_train=results["num_train_examples"],
        hardware=hardware, dev_line=run_line(job.summary(results["dev"]), results),
        unknown_share=results.get("unknown_token_share"))


def run_line(scores: str, results: dict) -> str:
    """`scores` with the run's steps, time and examples."""
    return (f"{scores} after {results['train_steps']} steps ({results['train_seconds']:.0f} s, "
            f"{math.floor(results['train_examples_seen'])} examples)")
