"""`run_job(job)`: checks -> data -> model -> Accelerate loop -> save the model -> metrics -> results and card, for
every fine-tuning task (`job.Job`: classification, question answering, token classification, multiple choice).

Every check that can fail on bad input (arguments, output folder, every row of the data, the checkpoint to resume,
tokenizer against model) runs before the first optimizer step. After training the model and tokenizer are saved
first: a failure in the final metrics or the card then loses nothing (a `MetricError` names the metric and the
folder holding the weights). Dev metrics are computed over every dev example, whatever the number of processes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tokenization import check_vocab_matches

from ..runs import (LOG_FILE, StepLog, check_output_dir, clear_run_records, end_run, keep_freed_host_memory,
                    local_folder_hint)
from ..training.checkpointing import read_training_state
from ..training.engines import refuse_split_world
from ..training.output_guard import (MODEL_FILES, OutputDirLock, check_foreign_files, check_replaceable,
                                     is_launch_main_process)
from .arguments import TRAINING_CONFIG
from .card import save_model, save_training_config
from .checkpoints import (check_compatible, checkpoint_rng, earlier_run, read_checkpoint_rng, resolve_checkpoint,
                          rng_states, save_checkpoint, set_rng, split_checkpoint_rng)
from .coverage import check_unknown_share, unknown_token_report
from .defaults import apply_defaults
from .job import Job, model_inputs
from .tasks import MetricError

logger = logging.getLogger(__name__)


def final_files(results_file: str) -> tuple[str, ...]:
    """What the final save of a fine-tuning run writes at the top of its output folder: the model files, the step
    log, the resolved arguments, the results (`save_model`, `save_training_config`, `Job.save_records`)."""
    return (*MODEL_FILES, LOG_FILE, TRAINING_CONFIG, results_file)


def run_finetuning(args) -> dict:
    """Sequence classification (`scripts/finetune_classification.py`): `run_job(ClassificationJob(args))`."""
    from .classification import ClassificationJob

    return run_job(ClassificationJob(args))


def run_job(job: Job) -> dict:
    """Fine-tune, save model + tokenizer, evaluate on the dev split, save results + model card; returns the results.
    On the CPU it sets glibc's malloc to keep freed memory for the rest of the process (`runs.keep_freed_host_memory`).
    The output folder is locked for the whole run (`output_guard.OutputDirLock`): a second run there is refused
    instead of mixing its checkpoints and log with this one's. A folder holding somebody's model, tokenizer or card
    but no earlier run is refused unless `overwrite_output_dir` (`output_guard.check_foreign_files`).
    """
    job.validate()
    with OutputDirLock(job.args.output_dir, enabled=is_launch_main_process()):
        return _run_job(job)


def _run_job(job: Job) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer, get_scheduler

    args, results_file = job.args, job.results_file
    resuming = args.resume_from_checkpoint is not None
    check_output_is_not_an_input(args)
    output_dir = check_output_dir(args.output_dir, lambda folder: earlier_run(folder, results_file),
                                  resuming=resuming, overwrite=args.overwrite_output_dir)
    check_foreign_files(output_dir, bool(earlier_run(output_dir, results_file)), args.overwrite_output_dir)
    check_replaceable(output_dir, final_files(results_file))
    if args.overwrite_output_dir:
        check_inputs_survive(args, [output_dir / name for name in earlier_run(output_dir, results_file)])
    resume_from = resolve_checkpoint(output_dir, args.resume_from_checkpoint) if resuming else None
    accelerator = Accelerator()
    refuse_split_world(accelerator)  # processes that would each fine-tune alone and write the same folder
    set_seed(args.seed)
    raw = job.load()  # the `max_train_samples` subset included (`data.load_raw_datasets`)
    model_config = _read_config(args)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name or args.model_name_or_path)
    # before anything is trained: a tokenizer that leaves most of the text unknown is named, with the likely cause
    coverage = unknown_token_report(tokenizer, job.coverage_texts(raw["train"]))
    check_unknown_share(coverage, tokenizer.unk_token, args.allow_unknown_tokens)
    with accelerator.main_process_first():
        train, dev = job.tokenize(raw, tokenizer, model_config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (model_config.pad_token_id or 0)
    collate = job.collate(pad_id)
    train_loader = DataLoader(train, shuffle=True, batch_size=args.per_device_train_batch_size, collate_fn=collate)
    dev_loader = DataLoader(dev, batch_size=args.per_device_eval_batch_size, collate_fn=collate)
    train_loader, dev_loader = accelerator.prepare(train_loader, dev_loader)  # sharded over the processes
    # the schedule the user left unnamed, from this model's width and start (`defaults`), logged and recorded
    chosen = apply_defaults(args, model_config, len(train_loader))
    if chosen:
        logger.info("defaults for this model: %s", "; ".join(f"{k} {v}" for k, v in chosen.items()))
    max_steps = args.max_train_steps or args.num_train_epochs * len(train_loader)
    layout = {"num_processes": accelerator.num_processes, "per_device_train_batch_size":
              args.per_device_train_batch_size, "num_train_examples": len(train), "seed": args.seed}
    saved = None
    if resume_from is not None:  # before the model is loaded or anything is written
        saved = read_training_state(resume_from)
        check_compatible(saved, layout, resume_from, max_steps)
    model = job.build_model(model_config)
    # before the first batch: an id past the embedding would fail there, naming neither the model nor the tokenizer
    check_vocab_matches(tokenizer, model.config, allow_larger_model=True,
                        context=f"tokenizer_name={args.tokenizer_name or args.model_name_or_path!r} does not fit "
                                f"model_name_or_path={args.model_name_or_path!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # the prepared scheduler steps once per process at every optimizer step (Accelerate's convention)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.is_main_process and args.overwrite_output_dir:  # only once every check has passed
        deleted = clear_run_records(output_dir, earlier_run(output_dir, results_file))
        if deleted:
            logger.info("overwrite_output_dir: deleted %s of the earlier run in %s", ", ".join(deleted), output_dir)
    accelerator.wait_for_everyone()
    history, step, seconds_before, resumed_rng = [], 0, 0.0, None
    if saved is not None:
        accelerator.load_state(str(resume_from))  # weights, optimizer, scheduler, every process's RNG
        history, step, seconds_before = saved["history"], saved["step"], saved["train_seconds"]
        resumed_rng = read_checkpoint_rng(resume_from, accelerator.process_index)
        logger.info("resumed from %s at step %d", resume_from, step)
    log = StepLog(output_dir, enabled=accelerator.is_main_process, resume_step=step if resuming else None)
    start = time.perf_counter() - seconds_before  # the training time before a resume counts too

    def evaluate_at(at: int) -> None:
        during = f"during training (step {at}); the weights of this run are only in its checkpoints, if any"
        history.append({"step": at, **scored(job, accelerator, model, dev_loader, during)})
        log.write(history[-1])
        logger.info("step %d: %s", at, history[-1])

    def checkpoint_at(at: int, rng) -> None:
        state = {**layout, "history": history, "train_seconds": time.perf_counter() - start}
        save_checkpoint(accelerator, output_dir, at, state, rng)

    keep_freed_host_memory(accelerator.device)  # after the data, the model and a resume: their peaks are one-off
    step = train_loop(accelerator, args, model, optimizer, scheduler, train_loader, max_steps, step, resumed_rng, start,
                      log, evaluate_at, checkpoint_at)
    train_seconds = time.perf_counter() - start
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # the weights first: nothing after this can lose them
        save_model(accelerator.unwrap_model(model), tokenizer, pad_id, output_dir)
    accelerator.wait_for_everyone()
    already = bool(history) and history[-1]["step"] == step  # the last step was an eval step: already scored
    final = ({k: v for k, v in history[-1].items() if k != "step"} if already
             else scored(job, accelerator, model, dev_loader, f"after training; the fine-tuned model and tokenizer "
                         f"are saved in {output_dir}"))
    results = {**job.results_fields(), "dev": final, "history": history, "train_steps": step,
               "train_seconds": train_seconds,
               "train_examples_seen": step * args.per_device_train_batch_size * accelerator.num_processes,
               "num_train_examples": len(train), "num_dev_examples": len(dev),
               "initialisation": "from scratch" if args.from_scratch else f"pretrained {args.model_name_or_path}",
               "unknown_token_share": None if coverage is None else coverage["share"], "args": asdict(args),
               "defaults_chosen": chosen}
    if accelerator.is_main_process:
        if not already:
            log.write({"step": step, **final})
        save_training_config(args, chosen, output_dir)
        job.save_records(results, accelerator.unwrap_model(model).config)
    del model, optimizer, train_loader, dev_loader, scheduler  # the prepared wrappers go first (see `end_run`)
    end_run(accelerator)
    return results


def scored(job: Job, accelerator, model, dev_loader, when: str) -> dict:
    """`job.evaluate`; a metric failure says when it happened and where the weights are (`when`)."""
    try:
        return job.evaluate(accelerator, model, dev_loader)
    except MetricError as error:
        raise MetricError(f"{error} ({when})") from error


def _read_config(args):
    from ..configuration_transformer_xl import TransformerXLConfig

    try:
        return TransformerXLConfig.from_pretrained(args.model_name_or_path)
    except OSError as error:  # not a local folder and not on the Hub (or offline)
        raise ValueError(f"model_name_or_path={args.model_name_or_path!r} could not be loaded ({error})"
                         f"{local_folder_hint(args.model_name_or_path)}; expected a folder written by save_pretrained "
                         "or a Hub id") from None


def check_output_is_not_an_input(args) -> None:
    """The fine-tuned model, tokenizer and card are saved into output_dir: it must not be the folder of the model or
    tokenizer this run starts from (they would be written over, with or without --overwrite_output_dir)."""
    out = Path(args.output_dir).resolve()
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(args, name)
        if value and Path(value).is_dir() and Path(value).resolve() == out:
            raise ValueError(f"output_dir={args.output_dir!r} is the folder of {name}={value!r}; the fine-tuned model "
                             "would be saved over it. Expected another output folder")


def check_inputs_survive(args, doomed: list[Path]) -> None:
    """--overwrite_output_dir must not delete the model or tokenizer this run starts from."""
    for name in ("model_name_or_path", "tokenizer_name"):
        value = getattr(args, name)
        if value and Path(value).exists():
            inside = [p for p in doomed if Path(value).resolve().is_relative_to(p.resolve())]
            if inside:
                raise ValueError(f"{name}={value!r} lies in {inside[0]}, which --overwrite_output_dir would delete "
                                 "(an earlier run's record); expected a model and tokenizer outside it")


def train_loop(accelerator, args, model, optimizer, scheduler, train_loader, max_steps: int, step: int,
               checkpoint_rng_states: dict | None, start: float, log: StepLog, evaluate, checkpoint) -> int:
    """Optimizer steps from `step` to `max_steps` (or `max_train_time`), each logged to `log`; `evaluate(step)` every
    eval_steps and `checkpoint(step, states)` every checkpointing_steps (`checkpoint_rng`). Returns the steps done.

    An epoch's shuffled order is drawn from the RNG (the torch RNG, or the generator shared by several processes) when
    its iterator starts. A resumed run (`checkpoint_rng_states` from the checkpoint) draws its first epoch's order
    again from the states that epoch started with, skips the batches already read, and goes on with the states of the
    checkpoint: the batches and dropout masks of an uninterrupted run, also in the epochs after."""
    from tqdm.auto import tqdm

    progress = tqdm(total=max_steps, initial=step, desc="fine-tuning",
                    disable=args.disable_tqdm or not accelerator.is_local_main_process)
    model.train()
    resumed = None if checkpoint_rng_states is None else split_checkpoint_rng(checkpoint_rng_states)
    while step < max_steps and not _out_of_time(args, start):
        done = step % len(train_loader)  # batches of this epoch already read (by the run that was resumed)
        if resumed is not None:  # the first epoch after a resume: its order is drawn from the saved states
            set_rng(train_loader, resumed[0] if done else resumed[1])
        epoch_rng = rng_states(train_loader)
        batches = iter(train_loader)
        for _ in range(done):
            next(batches)
        if resumed is not None and done:  # then on with the states of the checkpoint (dropout, the next epochs)
            set_rng(train_loader, resumed[1])
        resumed = None
        for batch in batches:
            loss = model(**model_inputs(batch, args)).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            mean_loss = float(accelerator.reduce(loss.detach(), reduction="mean"))  # over every process's batch
            progress.update(1)
            progress.set_postfix(loss=f"{mean_loss:.4f}")
            log.write({"step": step, "loss": mean_loss, "lr": scheduler.get_last_lr()[0]})
            if args.eval_steps and step % args.eval_steps == 0:
                evaluate(step)
            if args.checkpointing_steps and step % args.checkpointing_steps == 0:
                checkpoint(step, checkpoint_rng(epoch_rng, train_loader))
            if step >= max_steps or _out_of_time(args, start):
                break
    progress.close()
    return step


def _out_of_time(args, start: float) -> bool:
    return args.max_train_time is not None and time.perf_counter() - start >= args.max_train_time
