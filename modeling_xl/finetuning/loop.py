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
from dataclasses import asdict, dataclass

import torch

from tokenization import check_vocab_matches

from ..runtime.checkpoint_state import read_training_state
from ..runtime.processes import end_run, is_launch_main_process, keep_freed_host_memory
from ..runtime.run_folder import (
    FINETUNING_CHECKPOINTS,
    LOG_FILE,
    MODEL_FILES,
    OutputDirLock,
    StepLog,
    clear_run_records,
    prepare_output_dir,
)
from ..runtime.validators import local_folder_hint
from ..training.engines import refuse_split_world
from . import adapters
from .arguments import TRAINING_CONFIG
from .card import save_model, save_training_config
from .checkpoints import (
    check_compatible,
    checkpoint_rng,
    earlier_run,
    read_checkpoint_rng,
    rng_states,
    save_checkpoint,
    set_rng,
    split_checkpoint_rng,
)
from .coverage import check_unknown_share, unknown_token_report
from .defaults import apply_defaults
from .job import Job, model_inputs
from .tasks import MetricError

logger = logging.getLogger(__name__)


def final_files(results_file: str) -> tuple[str, ...]:
    """What the final save of a fine-tuning run writes at the top of its output folder: the model files, the step
    log, the resolved arguments, the results (`save_model`, `save_training_config`, `Job.save_records`)."""
    return (*MODEL_FILES, *adapters.ADAPTER_FILES, LOG_FILE, TRAINING_CONFIG, results_file)


def run_finetuning(args) -> dict:
    """Sequence classification (`scripts/finetune_classification.py`): `run_job(ClassificationJob(args))`."""
    from .classification import ClassificationJob

    return run_job(ClassificationJob(args))


def run_job(job: Job) -> dict:
    """Fine-tune, save model + tokenizer, evaluate on the dev split, save results + model card; returns the results.
    On the CPU it sets glibc's malloc to keep freed memory for the rest of the process
    (`processes.keep_freed_host_memory`).
    The output folder is locked for the whole run (`run_folder.OutputDirLock`): a second run there is refused
    instead of mixing its checkpoints and log with this one's; its checks are `run_folder.prepare_output_dir`'s.
    """
    job.validate()
    with OutputDirLock(job.args.output_dir, enabled=is_launch_main_process()):
        return _run_job(job)


@dataclass
class JobData:
    """What a fine-tuning run reads: the model's config, its tokenizer, the tokenized splits and their loaders."""

    model_config: object
    tokenizer: object
    pad_id: int
    coverage: dict | None  # the tokenizer's unknown-token report on the training texts
    train: object
    dev: object
    train_loader: object
    dev_loader: object


def _run_job(job: Job) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    args = job.args
    sources = {"model_name_or_path": args.model_name_or_path, "tokenizer_name": args.tokenizer_name}
    output_dir = prepare_output_dir(args.output_dir, lambda folder: earlier_run(folder, job.results_file),
                                    final_files(job.results_file), sources,
                                    resuming=args.resume_from_checkpoint is not None,
                                    overwrite=args.overwrite_output_dir)
    resume_from = (FINETUNING_CHECKPOINTS.resolve(output_dir, args.resume_from_checkpoint)
                   if args.resume_from_checkpoint is not None else None)
    accelerator = Accelerator()
    refuse_split_world(accelerator)  # processes that would each fine-tune alone and write the same folder
    set_seed(args.seed)
    data = load_job_data(job, accelerator)
    # the schedule the user left unnamed, from this model's width and start (`defaults`), logged and recorded
    chosen = apply_defaults(args, data.model_config, len(data.train_loader))
    if chosen:
        logger.info("defaults for this model: %s", "; ".join(f"{k} {v}" for k, v in chosen.items()))
    max_steps = args.max_train_steps or args.num_train_epochs * len(data.train_loader)
    layout = {"num_processes": accelerator.num_processes, "per_device_train_batch_size":
              args.per_device_train_batch_size, "num_train_examples": len(data.train), "seed": args.seed}
    saved = None
    if resume_from is not None:  # before the model is loaded or anything is written
        saved = read_training_state(resume_from)
        check_compatible(saved, layout, resume_from, max_steps)
    model, optimizer, scheduler = build_training(job, accelerator, data, max_steps)
    if accelerator.is_main_process and args.overwrite_output_dir:  # only once every check has passed
        deleted = clear_run_records(output_dir, earlier_run(output_dir, job.results_file))
        if deleted:
            logger.info("overwrite_output_dir: deleted %s of the earlier run in %s", ", ".join(deleted), output_dir)
    accelerator.wait_for_everyone()
    history, step, seconds_before, resumed_rng = resume(accelerator, resume_from, saved)
    log = StepLog(output_dir, enabled=accelerator.is_main_process, resume_step=None if saved is None else step)
    start = time.perf_counter() - seconds_before  # the training time before a resume counts too

    def evaluate_at(at: int) -> None:
        during = f"during training (step {at}); the weights of this run are only in its checkpoints, if any"
        history.append({"step": at, **scored(job, accelerator, model, data.dev_loader, during)})
        log.write(history[-1])
        logger.info("step %d: %s", at, history[-1])

    def checkpoint_at(at: int, rng) -> None:
        state = {**layout, "history": history, "train_seconds": time.perf_counter() - start}
        save_checkpoint(accelerator, output_dir, at, state, rng)

    keep_freed_host_memory(accelerator.device)  # after the data, the model and a resume: their peaks are one-off
    step = train_loop(accelerator, args, model, optimizer, scheduler, data.train_loader, max_steps, step, resumed_rng,
                      start, log, evaluate_at, checkpoint_at)
    results = finish(job, accelerator, model, data, history, step, time.perf_counter() - start, chosen, output_dir,
                     log)
    del model, optimizer, scheduler, data  # the prepared wrappers go first (see `end_run`)
    end_run(accelerator)
    return results


def load_job_data(job: Job, accelerator) -> JobData:
    """The task's data (`job.load`, the `max_train_samples` subset included), the model's config and tokenizer, the
    tokenizer's coverage of the training texts (refused when most of it is unknown), the tokenized splits and their
    loaders, prepared (sharded over the processes)."""
    from torch.utils.data import DataLoader
    from transformers import AutoTokenizer

    args = job.args
    raw = job.load()
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
    train_loader, dev_loader = accelerator.prepare(train_loader, dev_loader)
    return JobData(model_config, tokenizer, pad_id, coverage, train, dev, train_loader, dev_loader)


def build_training(job: Job, accelerator, data: JobData, max_steps: int):
    """The model (with `--lora_r`, under a LoRA adapter; checked against the tokenizer), AdamW and the linear schedule, prepared."""
    from transformers import get_scheduler

    args = job.args
    model = adapters.attach_adapter(job.build_model(data.model_config), args)  # with --lora_r: a LoRA adapter (peft)
    # before the first batch: an id past the embedding would fail there, naming neither the model nor the tokenizer
    check_vocab_matches(data.tokenizer, model.config, allow_larger_model=True,
                        context=f"tokenizer_name={args.tokenizer_name or args.model_name_or_path!r} does not fit "
                                f"model_name_or_path={args.model_name_or_path!r}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    # the prepared scheduler steps once per process at every optimizer step (Accelerate's convention)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max_steps * accelerator.num_processes)
    return accelerator.prepare(model, optimizer, scheduler)


def resume(accelerator, folder, saved: dict | None):
    """(evaluation history, step, training seconds, this process's checkpoint RNG) of the checkpoint in `folder`
    whose training state `saved` passed `check_compatible`, loaded into the prepared objects; a fresh start without
    one."""
    if saved is None:
        return [], 0, 0.0, None
    accelerator.load_state(str(folder))  # weights, optimizer, scheduler, every process's RNG
    logger.info("resumed from %s at step %d", folder, saved["step"])
    return (saved["history"], saved["step"], saved["train_seconds"],
            read_checkpoint_rng(folder, accelerator.process_index))


def finish(job: Job, accelerator, model, data: JobData, history: list, step: int, train_seconds: float, chosen: dict,
           output_dir, log: StepLog) -> dict:
    """Save the model and tokenizer (first: nothing after this can lose them), score the dev split (unless the last
    step was an evaluation step), then write the results, the log's last record, the resolved arguments and the
    card. Returns the results."""
    args = job.args
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        if adapters.is_adapted(unwrapped):  # --lora_r: the adapter (with --merge_lora, the merged model too)
            adapters.save_adapted(unwrapped, data.tokenizer, data.pad_id, output_dir, args.merge_lora)
        else:
            save_model(unwrapped, data.tokenizer, data.pad_id, output_dir)
    accelerator.wait_for_everyone()
    already = bool(history) and history[-1]["step"] == step  # the last step was an eval step: already scored
    final = ({k: v for k, v in history[-1].items() if k != "step"} if already
             else scored(job, accelerator, model, data.dev_loader, f"after training; the fine-tuned model and "
                         f"tokenizer are saved in {output_dir}"))
    results = {**job.results_fields(), "dev": final, "history": history, "train_steps": step,
               "train_seconds": train_seconds,
               "train_examples_seen": step * args.per_device_train_batch_size * accelerator.num_processes,
               "num_train_examples": len(data.train), "num_dev_examples": len(data.dev),
               "initialisation": "from scratch" if args.from_scratch else f"pretrained {args.model_name_or_path}",
               "unknown_token_share": None if data.coverage is None else data.coverage["share"], "args": asdict(args),
               "defaults_chosen": chosen, "parameters": adapters.trainable_parameters(accelerator.unwrap_model(model))}
    if accelerator.is_main_process:
        if not already:
            log.write({"step": step, **final})
        save_training_config(args, chosen, output_dir)
        job.save_records(results, accelerator.unwrap_model(model).config)
        adapters.write_card_section(accelerator.unwrap_model(model), args, output_dir)
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
