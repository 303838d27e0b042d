"""What runs the training: the engine Accelerate picked, checked against what the launcher was asked for, and the
engine-specific steps around `accelerator.prepare` (FSDP2 checks, activation checkpointing, the plain final model).

Engines: one process, DDP, FSDP2 (tested on CPU with 2 processes over gloo; see docs/distributed.md). FSDP1 and
DeepSpeed are refused at start with the reason (`check_engine`).
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

import torch
from accelerate.utils import DistributedType

logger = logging.getLogger(__name__)

FSDP1_REFUSAL = (
    "fsdp_version=1 is not supported: FSDP1's flattened parameters lose the optimizer state on load_state (a resume "
    "restarts Adam from zero) and its wrapper class ends up in the saved model; expected fsdp_version: 2 (the same "
    "Accelerate config with `fsdp_version: 2`, or `accelerate launch --use_fsdp --fsdp_version 2`)")
DEEPSPEED_REFUSAL = (
    "DeepSpeed is not supported: its engine takes over the optimizer step inside backward (every accumulation chunk "
    "would step it unless its own counter is kept in sync), applies clipping from its JSON config instead of "
    "--max_grad_norm, and has updated the weights before the loop can check the loss for NaN; the recurrent step "
    "here accumulates one memory per chunk and checks the loss before it steps. Expected DDP (`--multi_gpu`) or FSDP2 "
    "(`--use_fsdp --fsdp_version 2`, which shards parameters, gradients and optimizer state like ZeRO-3)")


def engine_name(accelerator) -> str:
    """'FSDP2', 'FSDP1', 'DeepSpeed', 'DDP' or 'single process'."""
    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return f"FSDP{accelerator.state.fsdp_plugin.fsdp_version}"
    if kind == DistributedType.DEEPSPEED:
        return "DeepSpeed"
    return "DDP" if accelerator.num_processes > 1 else "single process"


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


def launched_world_size(env: Mapping[str, str]) -> int | None:
    """The number of processes the launcher started (its WORLD_SIZE), or None when it set none (or no number)."""
    world = env.get("WORLD_SIZE", "")
    return int(world) if world.isdigit() else None


def launcher_fallbacks(env: Mapping[str, str], engine: str, num_processes: int, device_type: str) -> list[str]:
    """Warnings for what the launcher was asked for (read from the environment it set) but did not start.

    Example: `accelerate launch --use_fsdp ...` on a CPU-only machine sets ACCELERATE_USE_FSDP=true, but Accelerate
    selects FSDP only on GPU-like devices and runs DDP: the parameters are not sharded and nothing else says so.
    """
    found = []
    for flag, asked, option in (("ACCELERATE_USE_FSDP", "FSDP", "--use_fsdp / distributed_type: FSDP"),
                                ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed", "--use_deepspeed / distributed_type: "
                                                                         "DEEPSPEED")):
        if _flag(env, flag) and not engine.startswith(asked):
            found.append(f"the launcher was asked for {asked} ({option}: {flag}=true) but Accelerate runs {engine} on "
                         f"{device_type}: it selects {asked} only on GPU-like devices, so nothing is sharded")
    world = launched_world_size(env)
    if world is not None and world != num_processes:
        found.append(f"the launcher set WORLD_SIZE={world} but this run has {num_processes} process(es)")
    elif world is None and num_processes == 1 and "ACCELERATE_USE_CPU" in env and "MASTER_PORT" in env:
        # Accelerate's simple launcher sets MASTER_ADDR/PORT only when asked for several processes or machines
        found.append("the launcher was asked for several processes (it set MASTER_ADDR/MASTER_PORT) but started one: "
                     "`accelerate launch --cpu --num_processes N` runs a single process; on CPU use "
                     "`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N`")
    return found


def describe_run(accelerator, args, env: Mapping[str, str] | None = None) -> list[str]:
    """Log the world size, engine and precision (main process) and warn about launcher fallbacks. Returns the
    warnings."""
    env = os.environ if env is None else env
    engine = engine_name(accelerator)
    warnings = launcher_fallbacks(env, engine, accelerator.num_processes, accelerator.device.type)
    if accelerator.is_main_process:
        checkpointing = args.gradient_checkpointing or (engine.startswith("FSDP")
                                                        and accelerator.state.fsdp_plugin.activation_checkpointing)
        logger.info("world size %d (%s), engine %s, mixed precision %s, device %s, activation checkpointing %s",
                    accelerator.num_processes, _machines(env), engine, accelerator.mixed_precision,
                    accelerator.device.type, "on" if checkpointing else "off")
        for warning in warnings:
            logger.warning(warning)
    return warnings


def _machines(env: Mapping[str, str]) -> str:
    nodes = env.get("GROUP_WORLD_SIZE") or env.get("NNODES")
    local = env.get("LOCAL_WORLD_SIZE")
    return f"{nodes or 1} machine(s) x {local or 1} process(es)" if local else "1 machine"


def refuse_unsupported(accelerator) -> None:
    """FSDP1 and DeepSpeed stop the run at start, with the reason (before any data or model is built)."""
    engine = engine_name(accelerator)
    if engine == "FSDP1":
        raise ValueError(FSDP1_REFUSAL)
    if engine == "DeepSpeed":
        raise ValueError(DEEPSPEED_REFUSAL)


def refuse_split_world(accelerator, env: Mapping[str, str] | None = None) -> None:
    """ValueError when the launcher started WORLD_SIZE processes but each one runs alone (world size 1 in
    Accelerate): e.g. `accelerate launch --use_fsdp --num_processes 2` on a CPU-only machine without
    ACCELERATE_USE_CPU=1. Each process would train on its own and write the same output folder."""
    world = launched_world_size(os.environ if env is None else env)
    if world is not None and world > 1 and accelerator.num_processes == 1:
        raise ValueError(f"the launcher started WORLD_SIZE={world} processes but each one runs alone (Accelerate sees "
                         f"1 process, engine {engine_name(accelerator)} on {accelerator.device.type}): they would "
                         "train separately and write the same output folder; expected one process group, e.g. on a "
                         f"CPU-only machine `ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes {world}`")


def check_engine(accelerator, args, model) -> None:
    """Before `accelerator.prepare`: refuse FSDP1 and DeepSpeed, check FSDP2's layer classes and tied weights, and
    replace Accelerate's FSDP2 activation checkpointing by the model's own (which keeps dropout exact)."""
    refuse_unsupported(accelerator)
    if engine_name(accelerator) == "FSDP2":
        plugin = accelerator.state.fsdp_plugin
        check_layer_classes(model, plugin.transformer_cls_names_to_wrap)
        check_ties_in_one_unit(model)
        if plugin.activation_checkpointing:
            # Accelerate wraps each layer with `checkpoint_wrapper(preserve_rng_state=False)`: the recomputation in
            # backward draws new dropout masks, so the gradients are not those of the forward's loss. The model's own
            # checkpointing (transformers, preserve_rng_state=True) recomputes with the forward's masks.
            plugin.activation_checkpointing = False
            if not args.gradient_checkpointing:
                from .models import enable_checkpointing

                enable_checkpointing(model)
            logger.info("FSDP2 activation checkpointing: the model's own (dropout masks kept), not Accelerate's")


def check_layer_classes(model, names) -> None:
    """`fsdp_transformer_layer_cls_to_wrap` must name layer classes of this model (the causal LM's layers are
    TransformerXLLayer, the permutation LM's PermutationLMLayer); leaving it out uses `_no_split_modules`."""
    if not names:
        return
    present = {type(m).__name__ for m in model.modules()}
    missing = [name for name in names if name not in present]
    if missing:
        raise ValueError(f"fsdp_transformer_layer_cls_to_wrap={','.join(names)} names {', '.join(missing)}, which "
                         f"{type(model).__name__} does not contain; expected {', '.join(model._no_split_modules)} "
                         "(or leave the option out: the model's _no_split_modules are used)")


def check_ties_in_one_unit(model) -> None:
    """Accelerate's FSDP2 puts the input embedding and the output layer in one unit only when their `weight`s are one
    Parameter. Any other parameter they share (a tied projection with untied tables) would be managed by two units."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None or getattr(inputs, "weight", None) is getattr(outputs, "weight", None):
        return
    shared = {id(p) for p in inputs.parameters()} & {id(p) for p in outputs.parameters()}
    if shared:
        raise ValueError("tie_word_embeddings=False with tied projections (tie_projs) shares parameters between the "
                         "adaptive input and the adaptive softmax while their tables differ, which FSDP2 cannot put "
                         "in one unit; expected tie_word_embeddings=True, or tie_projs all False")


def final_model(accelerator, model, state_dict: dict):
    """The model to `save_pretrained` into the final folder: the unwrapped model, or under FSDP a plain copy of its
    class with the gathered full `state_dict` (the FSDP wrapper class would be saved, with torch's FSDP files copied
    as its remote code). Main process only (`state_dict` is gathered there)."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import PreTrainedModel

    unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    if not isinstance(unwrapped, FSDPModule):
        return unwrapped
    plain_class = next(c for c in type(unwrapped).__mro__
                       if issubclass(c, PreTrainedModel) and not issubclass(c, FSDPModule))
    with torch.device("cpu"):
        plain = plain_class(unwrapped.config)
    plain.load_state_dict({k: v.cpu() for k, v in state_dict.items()}, strict=True)
    return plain
