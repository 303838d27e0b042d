"""`run_pretraining(args)`: the whole run, each stage a short function (checks -> data -> model -> train -> publish).

Every check that can fail on bad input (arguments, output folder, data files, tokenizer/model vocabulary, how the
streams split over processes and chunks, the checkpoint to resume) runs before the first optimizer step.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs, ProjectConfiguration, set_seed

from tokenization import declare_task_tokens

from ..data.pretrain_data import UNKNOWN_WARNING_SHARE, PretrainData, unknown_share
from ..data.tokenizer_choice import tokenizer_vocab_size
from ..runtime.checkpoint_state import check_compatible, read_training_state
from ..runtime.processes import end_run, is_launch_main_process, keep_freed_host_memory
from ..runtime.run_folder import FINAL_FILES, LOG_FILE, OutputDirLock, StepLog, clear_run_records, prepare_output_dir
from .arguments import RUN_RECORDS, PretrainArguments, earlier_pretraining_run, processes_split, save_resolved
from .checkpointing import check_same_stream, load_checkpoint, resolve_checkpoint, save_checkpoint, schedule_change
from .engines import check_engine, describe_run, final_model, refuse_split_world, refuse_unsupported
from .feedback import PLOT_FILE, Progress, plot_losses, tracker_names
from .models import build_config, build_model, build_optimizer, build_scheduler
from .objectives import objective_for
from .process_layout import PROCESS_KEYS, check_process_layout
from .publishing import model_card, push_folder, save_card_keeping_sections, write_results
from .shared_storage import check_shared_folder
from .steps import NonFiniteLossError, train_step

logger = logging.getLogger(__name__)


@dataclass
class RunState:
    """What changes from step to step (and goes into a checkpoint besides Accelerate's state)."""

    step: int = 0  # optimizer steps done = training segments consumed per stream
    tokens_seen: int = 0
    memories: list = field(default_factory=list)  # one entry per accumulation chunk: tuple of n_layer tensors or None
    eval_history: list = field(default_factory=list)
    last_checkpoint: str | None = None
    started: float = field(default_factory=time.perf_counter)  # this process's start (perf_counter)
    elapsed_before: float = 0.0  # seconds the run had taken before the checkpoint it resumed from

    def elapsed(self) -> float:
        """Wall time of the whole run so far, the parts before a resume included."""
        return self.elapsed_before + time.perf_counter() - self.started


def make_accelerator(args: PretrainArguments) -> Accelerator:
    """Accelerate handles devices, DDP, autocast and grad scaling. We feed tensors ourselves (ordered streams), so
    no dataloader is prepared; `split_batches=True` makes the scheduler step once per optimizer step."""
    trackers = tracker_names(args.report_to) if args.with_tracking else []
    return Accelerator(
        mixed_precision=args.mixed_precision,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/runs"),
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        # a stalled or dead rank ends the run after ddp_timeout seconds instead of leaving the others waiting forever
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.ddp_timeout))],
    )


def run_pretraining(args: PretrainArguments, data_builder: Callable[..., PretrainData] | None = None) -> dict:
    """Train, evaluate, write the final folder (and push it). Returns the final validation metrics.

    `data_builder(args, process_index, num_processes, per_process)` -> PretrainData; default: `data_sources.build_data`
    (the datasets/tokenizers pipeline). Tests pass their own to train on tiny corpora. The output folder is locked
    for the whole run (`run_folder.OutputDirLock`): a second run there is refused instead of mixing with this one.
    On the CPU it sets glibc's malloc to keep freed memory for the rest of the process
    (`processes.keep_freed_host_memory`).
    """
    with OutputDirLock(args.output_dir, enabled=is_launch_main_process()):
        return _run_pretraining(args, data_builder)


def _run_pretraining(args: PretrainArguments, data_builder) -> dict:
    started = time.perf_counter()
    sources = {name: getattr(args, name) for name in ("model_name_or_path", "config_name", "tokenizer_name")}
    output_dir = prepare_output_dir(args.output_dir, earlier_pretraining_run, FINAL_FILES, sources,
                                    resuming=args.resume_from_checkpoint is not None,
                                    overwrite=args.overwrite_output_dir)
    accelerator = make_accelerator(args)
    describe_run(accelerator, args)
    refuse_split_world(accelerator)  # processes that would each train alone on the same folder
    refuse_unsupported(accelerator)  # FSDP1, DeepSpeed: named, before any data or model is built
    check_shared_folder(accelerator, output_dir)  # before a resume looks for its checkpoint there
    global_batch, per_process = processes_split(args, accelerator.num_processes)
    layout = {"train_batch_size": global_batch, "num_processes": accelerator.num_processes,
              "gradient_accumulation_steps": args.gradient_accumulation_steps, "tgt_len": args.tgt_len}
    resume_from, saved = checkpoint_to_resume(accelerator, args, output_dir, layout)
    set_seed(args.seed)
    if data_builder is None:
        from .data_sources import build_data as data_builder  # the data pipeline is only needed here
    data = data_builder(args, accelerator.process_index, accelerator.num_processes, per_process)
    stream = training_stream(args, data)
    if saved is not None:  # still before anything is written or loaded
        check_same_stream(saved, stream, resume_from)
    warn_about_unknown_tokens(accelerator, args, data)
    config = build_config(args, stream["tokenizer_vocab_size"], data.tokenizer.eos_token_id)
    objective = objective_for(args, data)
    model = build_model(args, config, objective.model_class)
    set_tail_capacity(accelerator, args, model, data, per_process)
    check_engine(accelerator, args, model)
    optimizer = build_optimizer(args, model)
    scheduler = build_scheduler(args, optimizer)
    if accelerator.is_main_process:
        # only now, once every check has passed (bad input must not cost the old run), and only if there is one
        if args.overwrite_output_dir and earlier_pretraining_run(output_dir):
            deleted = clear_run_records(output_dir, RUN_RECORDS)
            if deleted:
                logger.info("overwrite_output_dir: deleted %s of the earlier run in %s", ", ".join(deleted), output_dir)
        save_resolved(args, output_dir, {"resolved_batch": layout, "model_config": config.to_dict()})
    accelerator.wait_for_everyone()
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = RunState(memories=[None] * args.gradient_accumulation_steps, started=started)
    if resume_from is not None:
        restore(accelerator, resume_from, saved, state, args)
    if args.with_tracking:
        accelerator.init_trackers("pretrain", config=_flat_hparams(args))
    keep_freed_host_memory(accelerator.device)  # after the data, the model and a resume: their peaks are one-off
    try:
        train(accelerator, args, model, optimizer, scheduler, data, objective, state, {**layout, **stream},
              global_batch)
    except NonFiniteLossError as error:
        accelerator.end_training()
        kept = state.last_checkpoint or "none (no checkpoint was written yet)"
        raise NonFiniteLossError(f"{error}; training stopped. Last good checkpoint: {kept}. Lower --learning_rate, "
                                 "use --mixed_precision bf16 instead of fp16, or resume from it with "
                                 "--resume_from_checkpoint latest") from None
    results = final_evaluation(accelerator, args, model, data, objective, state)
    finish(accelerator, args, model, data, state, results, global_batch, state.elapsed())
    del model, optimizer, scheduler  # the prepared wrappers go before the process group (see `end_run`)
    end_run(accelerator)
    return results


def checkpoint_to_resume(accelerator, args, output_dir, layout: dict):
    """(folder, training state) of the checkpoint `--resume_from_checkpoint` names, checked before anything is
    written or loaded, on every process: the batch layout (another number of processes is allowed when each chunk
    keeps its streams) and the step; a changed schedule is warned about. (None, None) without a resume."""
    if args.resume_from_checkpoint is None:
        return None, None
    resume_from = resolve_checkpoint(output_dir, args.resume_from_checkpoint)
    saved = read_training_state(resume_from)
    check_process_layout(saved, layout, resume_from)  # another number of processes, same streams per chunk
    check_compatible(saved, {k: v for k, v in layout.items() if k not in PROCESS_KEYS}, resume_from,
                     args.max_train_steps)
    change = schedule_change(saved, args.max_train_steps, args.num_warmup_steps, args.lr_scheduler_type)
    if change and accelerator.is_main_process:
        logger.warning("resume_from_checkpoint=%r: %s", str(resume_from), change)
    return resume_from, saved


def training_stream(args, data: PretrainData) -> dict:
    """What identifies the token stream a checkpoint continues: its length, the tokenizer's vocabulary, the
    objective, and for the permutation LM the seed and sampling settings its samples, targets and permutations are
    drawn from."""
    stream = {"train_tokens": data.info.get("train_tokens"),
              "tokenizer_vocab_size": tokenizer_vocab_size(data.tokenizer), "objective": args.objective}
    if args.objective == "plm":
        from ..data.plm_layout import SAMPLING_VERSION
        from .plm_objective import plm_settings

        stream.update(seed=args.seed, bi_data=args.bi_data, plm_sampling_version=SAMPLING_VERSION,
                      **plm_settings(args))
    return stream


def set_tail_capacity(accelerator, args, model, data: PretrainData, per_process: int) -> None:
    """`--tail_capacity auto`: the adaptive softmax routes each tail cluster's targets into a buffer of the most that
    one forward of this run holds, over every process (`tail_capacity`)."""
    head = getattr(model, "lm_head", None)
    if args.tail_capacity != "auto" or not hasattr(head, "tail_capacity"):
        return
    from .tail_capacity import run_tail_capacity

    capacity = run_tail_capacity(data, head.bounds, per_process // args.gradient_accumulation_steps, args.tgt_len)
    if capacity is None:
        return
    most = accelerator.gather(torch.tensor(capacity, device=accelerator.device))  # every process's
    head.tail_capacity = tuple(int(c) for c in most.reshape(-1, len(capacity)).max(dim=0).values)
    logger.info("tail_capacity: each tail cluster of the adaptive softmax routes at most %s targets per forward",
                list(head.tail_capacity))


def warn_about_unknown_tokens(accelerator, args, data: PretrainData) -> None:
    """A warning (not a check) when a tokenizer from elsewhere leaves much of the main process's first training
    tokens unknown: the loss and perplexity would then be mostly about predicting <unk>."""
    tokenizer_source = args.tokenizer_name or args.model_name_or_path
    if not tokenizer_source or args.objective != "clm" or args.streaming or not accelerator.is_main_process:
        return
    share = unknown_share(data)
    if share is not None and share > UNKNOWN_WARNING_SHARE:
        logger.warning("%.1f%% of the first training tokens are the tokenizer's unknown token %r (tokenizer of "
                       "%s): the loss and perplexity will be mostly about predicting it; expected a tokenizer "
                       "trained on this kind of text (scripts/train_tokenizer.py)", 100 * share,
                       data.tokenizer.unk_token, tokenizer_source)


def restore(accelerator, folder, saved: dict, state: RunState, args) -> None:
    """Load a checkpoint whose training state `saved` already passed `check_compatible`."""
    layout = {"train_batch_size": saved["train_batch_size"], "num_processes": accelerator.num_processes,
              "gradient_accumulation_steps": args.gradient_accumulation_steps}
    memories = load_checkpoint(accelerator, folder, args.gradient_accumulation_steps, accelerator.device, saved, layout)
    state.step, state.tokens_seen = saved["step"], saved["tokens_seen"]
    state.memories, state.eval_history = memories, saved.get("eval_history", [])
    state.last_checkpoint = str(folder)
    state.elapsed_before = saved.get("elapsed_seconds", 0.0)  # absent in checkpoints of older versions
    logger.info("resumed from %s at step %d", folder, state.step)


def train(accelerator, args, model, optimizer, scheduler, data, objective, state: RunState, layout, global_batch):
    """The step loop: train step, log, evaluate every eval_steps, checkpoint every checkpointing_steps. `layout`
    (batch layout and training stream) goes into every checkpoint, for the checks of a resume."""
    main = accelerator.is_main_process
    log = StepLog(args.output_dir, enabled=main, resume_step=state.step if args.resume_from_checkpoint else None)
    tokens_per_step = global_batch * objective.tokens_per_row  # new text per step (tokens/s and tokens_seen)
    progress = Progress(args.max_train_steps, state.step, tokens_per_step, enabled=main and not args.disable_tqdm)
    if state.step == 0:  # the starting point of the validation curve ("falls well below its start")
        evaluate_and_log(accelerator, args, model, data, objective, state, log, progress)
    model.train()
    for step, batch in data.train_batches(state.step, args.max_train_steps, accelerator.device):
        if batch.pop("new_epoch", False):
            state.memories = [None] * len(state.memories)  # a new epoch restarts every stream: old memory is unrelated
        loss = train_step(accelerator, model, optimizer, scheduler, batch, state.memories,
                          objective=objective.step_fn, target_count=objective.target_count,
                          max_grad_norm=args.max_grad_norm, step=step)
        state.step, state.tokens_seen = step + 1, state.tokens_seen + tokens_per_step
        tokens_per_second = progress.update(state.step, loss)
        record = {"step": state.step, "loss": loss, "lr": scheduler.get_last_lr()[0], "tokens_per_second": tokens_per_second}
        log.write(record)
        if args.with_tracking and (state.step % args.logging_steps == 0 or state.step == 1):
            accelerator.log({"train/loss": loss, "train/lr": record["lr"], "train/tokens_per_second": tokens_per_second},
                            step=state.step)
        if state.step % args.eval_steps == 0 and state.step < args.max_train_steps:
            evaluate_and_log(accelerator, args, model, data, objective, state, log, progress)
        if args.checkpointing_steps and state.step % args.checkpointing_steps == 0:
            folder = save_checkpoint(accelerator, args.output_dir, state.step, {
                **layout, "tokens_seen": state.tokens_seen, "eval_history": state.eval_history,
                "elapsed_seconds": state.elapsed(), "data_position": {"segments_consumed": state.step},
                "max_train_steps": args.max_train_steps, "num_warmup_steps": args.num_warmup_steps},
                state.memories, args.checkpoints_total_limit)
            state.last_checkpoint = str(folder)
    progress.close()


def evaluate_and_log(accelerator, args, model, data, objective, state: RunState, log, progress) -> None:
    metrics = evaluate(accelerator, args, model, data, objective, args.max_eval_segments)
    state.eval_history.append({"step": state.step, **metrics})
    log.write({"step": state.step, **metrics})
    progress.write(f"step {state.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    if args.with_tracking:
        accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=state.step)


def evaluate(accelerator, args, model, data, objective, max_segments):
    """Validation metrics with the evaluation segment/memory lengths, summed over every process's rows.

    The forward goes through the prepared model (under FSDP only the wrapper holds whole parameters), uncompiled
    under `--dynamo_backend`: evaluation has its own segment and memory lengths, a memory that fills over many
    segments and no gradients, so compiling it would add a compilation per memory length for a few segments; the
    recurrence settings are switched on the underlying model's config."""
    config = accelerator.unwrap_model(model).config
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper (`OptimizedModule`) -> the module it runs
    return objective.evaluate(model, config, data, args, accelerator.device, max_segments,
                              reduce=lambda t: accelerator.reduce(t, reduction="sum"))


def final_evaluation(accelerator, args, model, data, objective, state: RunState) -> dict:
    metrics = evaluate(accelerator, args, model, data, objective, None)
    state.eval_history.append({"step": state.step, **metrics})
    if accelerator.is_main_process:
        StepLog(args.output_dir, enabled=True, resume_step=state.step).write({"step": state.step, **metrics})
    if args.with_tracking:
        accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=state.step)
    return metrics


def finish(accelerator, args, model, data, state, results, global_batch: int, wall_time_s: float) -> None:
    """Final folder on the main process: model + remote code, tokenizer, results, loss plot, model card; then push."""
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # collective under FSDP: every process takes part
    if not accelerator.is_main_process:
        return
    out = args.output_dir
    unwrapped = final_model(accelerator, model, state_dict)  # the plain model class, also under FSDP
    unwrapped.save_pretrained(out, state_dict=state_dict)
    declare_task_tokens(data.tokenizer)  # task scripts (ours, transformers' run_qa/run_ner/run_swag) pad with <eos>
    data.tokenizer.save_pretrained(out)
    write_results(out, results, state.eval_history)
    plot_losses(f"{out}/{LOG_FILE}", f"{out}/{PLOT_FILE}")
    repo_id = args.hub_model_id or out.rstrip("/").split("/")[-1]
    start = next((h for h in state.eval_history if h["step"] == 0), None)
    info = {**data.info, "num_parameters": sum(p.numel() for p in unwrapped.parameters()),
            "num_processes": accelerator.num_processes, "mixed_precision": accelerator.mixed_precision,
            "train_batch_size": global_batch, **({"start": start} if start else {})}
    hardware = f"{accelerator.num_processes} x {accelerator.device.type} ({platform.processor() or platform.machine()})"
    card = model_card(out, repo_id=repo_id, args=args, results=results, data_info=info, wall_time_s=wall_time_s,
                      hardware=hardware, usage_path=args.hub_model_id or out)
    carried = save_card_keeping_sections(card, f"{out}/README.md")
    if carried:
        logger.info("model card: kept the section(s) %s of the earlier card, marked as measured on earlier weights",
                    ", ".join(carried))
    if args.push_to_hub:
        url = push_folder(out, repo_id, token=args.hub_token, private=args.hub_private_repo)
        logger.info("pushed %s to %s", out, url)


def _flat_hparams(args) -> dict:
    """Tracker-friendly hyperparameters (TensorBoard accepts only scalars and strings)."""
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in args.to_dict().items()
            if v is not None and k != "hub_token"}
