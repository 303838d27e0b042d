"""Engines under `accelerate launch` with 2 processes over gloo: FSDP2 against DDP (both objectives, with and without
activation checkpointing), FSDP2 kill + resume, the FSDP2 final folder in a fresh process, a 2 -> 1 process resume,
a node-local output folder; and the engine checks themselves (refusals, launcher fallbacks, process layouts).
The training launches get the environment the launcher gives its workers, the workers forked warm (`warm_launch`);
`test_launcher_fallbacks_seen_through_the_real_launcher` starts the real launcher.

Accelerate selects its FSDP path only on GPU-like devices. The driver switches the state of an Accelerator built for
2 CPU processes to FSDP (the launcher's FSDP_* settings) right after it is built, so Accelerate's own FSDP2 prepare,
save_state, load_state and get_state_dict code runs here; nothing else is patched.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import warm_launch
from safetensors.torch import save_file

from modeling_xl.training import engines
from modeling_xl.training.process_layout import check_process_layout, load_memories

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))

DRIVER = textwrap.dedent('''
    """Test driver: run_pretraining on a character-level slice of a corpus, under the engine the test asks for."""
    import json, os, signal, sys
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modeling_xl.data.pretraining import plm_data_from_tokens
    from modeling_xl.data.sources import StreamLayout
    from modeling_xl.training import data_from_tokens, loop, parse_args, run_pretraining
    from modeling_xl.training.data_sources import plm_rows

    if os.environ.get("FORCE_FSDP"):  # Accelerate's FSDP path on CPU: switch the state it built (see module doc)
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        build = loop.make_accelerator

        def make_fsdp_accelerator(args):
            accelerator = build(args)
            accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* settings
            accelerator.state.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # AcceleratorState() copies it
            return accelerator

        loop.make_accelerator = make_fsdp_accelerator

    if os.environ.get("NODE_LOCAL_OUTPUT") and os.environ.get("RANK") == "1":  # rank 1's "machine" has its own disk
        sys.argv[sys.argv.index("--output_dir") + 1] = os.environ["NODE_LOCAL_OUTPUT"]

    if os.environ.get("KILL_AFTER_CHECKPOINT"):  # SIGKILL right after the first checkpoint is complete
        save = loop.save_checkpoint

        def save_then_die(*a, **k):
            save(*a, **k)
            os.kill(os.getpid(), signal.SIGKILL)

        loop.save_checkpoint = save_then_die


    def char_tokenizer(text):
        vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(sorted(set(text)))}}
        tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tokenizer.decoder = decoders.Fuse()
        return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<unk>")


    def builder(args, rank, world, per_process):
        text = Path(os.environ["CORPUS"]).read_text()
        tokenizer = char_tokenizer(text)
        ids = tokenizer(text)["input_ids"]
        split = int(len(ids) * 0.9)
        info = {"char_level": True, "dataset_name": "tinyshakespeare"}
        if args.objective == "plm":
            return plm_data_from_tokens(tokenizer, ids[:split], ids[split:], plm_rows(args),
                                        StreamLayout(per_process * world, args.tgt_len, args.eval_tgt_len, world,
                                                     rank), info=info)
        return data_from_tokens(tokenizer, ids[:split], ids[split:],
                                StreamLayout(per_process * world, args.tgt_len, args.eval_tgt_len, world, rank),
                                info=info)


    print(json.dumps(run_pretraining(parse_args(sys.argv[1:]), builder)))
''')

STEPS = 20
COMMON = ["--preset", "debug", "--train_batch_size", "4", "--tgt_len", "8", "--mem_len", "8", "--eval_tgt_len", "8",
          "--eval_mem_len", "16", "--max_train_steps", str(STEPS), "--eval_steps", "10", "--max_eval_segments", "10",
          "--learning_rate", "3e-3", "--disable_tqdm", "--seed", "7", "--dropout", "0.1"]
OBJECTIVES = {"clm": [], "plm": ["--objective", "plm", "--tgt_len", "16", "--eval_tgt_len", "16"]}
FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
         "--fsdp_state_dict_type", "SHARDED_STATE_DICT"]
CHECKPOINT = ["--checkpointing_steps", "10"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    from generated_corpora import play_text

    (root / "corpus.txt").write_text(play_text(20_000))  # a play-like text made here: no ../shared needed
    (root / "driver.py").write_text(DRIVER)
    return root


def launch(workdir, out, extra=(), launcher=("--multi_gpu",), processes=2, env_extra=None, check=True):
    """The driver under `accelerate launch <launcher>` with `processes` workers (1: `python driver.py`), forked warm
    (`warm_launch`)."""
    env = {**os.environ, "CORPUS": str(workdir / "corpus.txt"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "ACCELERATE_USE_CPU": "1", **(env_extra or {})}
    if launcher and launcher[0] == "--use_fsdp":
        env["FORCE_FSDP"] = "1"
    argv = [*COMMON, "--output_dir", str(out), *extra]
    result = warm_launch.run(workdir / "driver.py", argv, env=env, cwd=workdir, timeout=240, processes=processes,
                             launcher=[*launcher, "--mixed_precision", "no", "--dynamo_backend", "no"])
    if check and result.returncode != 0:
        raise AssertionError(f"run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def losses(out) -> dict[int, float]:
    records = [json.loads(line) for line in Path(out, "train_log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def assert_same_losses(out, reference, rel=1e-6):
    got, expected = losses(out), losses(reference)
    assert sorted(got) == sorted(expected) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=rel, abs=1e-6), step


@pytest.fixture(scope="module")
def ddp_runs(workdir):
    """The reference: 2-process DDP per objective, dropout on, checkpoints at step 10."""
    runs = {}
    for objective, flags in OBJECTIVES.items():
        runs[objective] = workdir / f"ddp_{objective}"
        launch(workdir, runs[objective], [*flags, *CHECKPOINT])
    return runs


@pytest.fixture(scope="module")
def fsdp2_clm(workdir):
    out = workdir / "fsdp2_clm"
    launch(workdir, out, CHECKPOINT, launcher=FSDP2)
    return out


@pytest.mark.parametrize("objective", ["clm", "plm"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation_checkpointing"])
def test_fsdp2_gives_the_ddp_losses(workdir, ddp_runs, fsdp2_clm, objective, checkpointing):
    """Accelerate's FSDP2 (transformer-layer auto-wrap from `_no_split_modules`, tied tables in one unit) trains as
    DDP does; with its activation checkpointing, dropout masks stay those of the forward (else the losses drift)."""
    if objective == "clm" and not checkpointing:
        out = fsdp2_clm
    else:
        out = workdir / f"fsdp2_{objective}_{checkpointing}"
        # with checkpointing, also the README yaml's cpu_ram_efficient_loading (rank 0 loads, the others get shards)
        flags = ["--fsdp_activation_checkpointing", "true", "--fsdp_cpu_ram_efficient_loading", "true"] \
            if checkpointing else []
        if objective == "plm":  # the full (gathered) state dict in its checkpoints
            flags += ["--fsdp_state_dict_type", "FULL_STATE_DICT"]
        launch(workdir, out, [*OBJECTIVES[objective], *CHECKPOINT], launcher=(*FSDP2, *flags))
    assert_same_losses(out, ddp_runs[objective])


@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_fsdp2_resume_after_sigkill_is_exact(workdir, fsdp2_clm, state_dict_type):
    """Killed right after the checkpoint of step 10, resumed: steps 11-20 equal the uninterrupted run's, from a
    sharded (DCP folders) or a full (gathered `.bin` files, read back with weights_only) state dict."""
    launcher = [*FSDP2[:-1], state_dict_type]
    out = workdir / f"fsdp2_killed_{state_dict_type}"
    killed = launch(workdir, out, CHECKPOINT, launcher=launcher, env_extra={"KILL_AFTER_CHECKPOINT": "1"}, check=False)
    assert killed.returncode != 0
    assert sorted(losses(out)) == list(range(1, 11))
    folder = out / "checkpoints" / "step_0000010"
    if state_dict_type == "SHARDED_STATE_DICT":
        assert (folder / "pytorch_model_fsdp_0").is_dir() and (folder / "optimizer_0").is_dir()
    else:
        assert (folder / "pytorch_model_fsdp.bin").is_file() and (folder / "optimizer.bin").is_file()
    launch(workdir, out, [*CHECKPOINT, "--resume_from_checkpoint", "latest"], launcher=launcher)
    assert_same_losses(out, fsdp2_clm)


def test_fsdp2_final_folder_is_the_plain_model_and_loads_in_a_fresh_process(ddp_runs, fsdp2_clm):
    files = {p.name for p in fsdp2_clm.iterdir()}
    assert not [name for name in files if name.startswith("_fsdp")], files
    config = json.loads((fsdp2_clm / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_transformer_xl.TransformerXLForCausalLM"
    script = textwrap.dedent(f'''
        import sys
        sys.path = [p for p in sys.path if p not in ("", "{REPO}")]  # only the folder's own code may be used
        sys.modules["modeling_xl"] = sys.modules["tokenization"] = None  # (the project may be installed editable)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained("{fsdp2_clm}", trust_remote_code=True)
        assert type(model).__name__ == "TransformerXLForCausalLM", type(model)
        tok = AutoTokenizer.from_pretrained("{fsdp2_clm}", trust_remote_code=True)
        ids = tok("ROMEO:", return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
        emb, head = model.transformer.word_emb.emb_layers[0].weight, model.lm_head.out_layers[0].weight
        print("LOADED", out.shape[1] - ids.shape[1], emb is head, float(emb.double().square().sum()))
    ''')
    result = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=120, cwd="/",
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("LOADED")).split()
    assert line[1:3] == ["8", "True"]
    # the trained weights (those DDP ends with), not a fresh initialisation
    from safetensors.torch import load_file

    table = load_file(str(fsdp2_clm / "model.safetensors"))["transformer.word_emb.emb_layers.0.weight"]
    trained = load_file(str(ddp_runs["clm"] / "model.safetensors"))["transformer.word_emb.emb_layers.0.weight"]
    torch.testing.assert_close(table, trained, rtol=1e-4, atol=1e-6)
    assert float(table.double().square().sum()) == pytest.approx(float(line[3]), rel=1e-9)


def test_two_processes_resume_as_one_with_two_chunks(workdir):
    """2 processes x 1 chunk -> 1 process x 2 chunks: the same streams per chunk, so the memories move over and the
    run continues exactly (without dropout: masks are drawn per process)."""
    no_dropout = [*CHECKPOINT, "--dropout", "0.0"]
    whole = workdir / "two_uninterrupted"
    launch(workdir, whole, no_dropout)
    out = workdir / "two_then_one"
    shutil.copytree(whole / "checkpoints" / "step_0000010", out / "checkpoints" / "step_0000010")
    launch(workdir, out, [*no_dropout, "--resume_from_checkpoint", "latest", "--gradient_accumulation_steps", "2"],
           processes=1)
    got, expected = losses(out), losses(whole)
    assert sorted(got) == list(range(11, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step


def test_node_local_output_folder_is_refused_before_training(workdir):
    out, elsewhere = workdir / "shared_view", workdir / "rank1_disk"
    result = launch(workdir, out, env_extra={"NODE_LOCAL_OUTPUT": str(elsewhere)}, check=False)
    assert result.returncode != 0
    assert result.stderr.count("is not one shared folder: process(es) [1] of 2") == 2, result.stderr[-3000:]
    for folder in (out, elsewhere):  # nothing trained or written, and the probe file is gone
        assert not folder.exists() or not [p.name for p in folder.iterdir()], list(folder.iterdir())


# ---- the checks themselves (no processes) ----

def fake_accelerator(kind, fsdp_version=None, processes=2, **plugin):
    plugin = {"transformer_cls_names_to_wrap": None, "activation_checkpointing": False, **plugin}
    state = SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version, **plugin))
    return SimpleNamespace(distributed_type=kind, state=state, num_processes=processes)


def test_fsdp1_and_deepspeed_are_refused_with_the_reason():
    from accelerate.utils import DistributedType

    args = SimpleNamespace(gradient_checkpointing=False)
    with pytest.raises(ValueError, match="fsdp_version=1 is not supported.*expected fsdp_version: 2"):
        engines.check_engine(fake_accelerator(DistributedType.FSDP, 1), args, model=None)
    with pytest.raises(ValueError, match="DeepSpeed is not supported: its engine takes over the optimizer step.*"
                                         "--max_grad_norm.*NaN"):
        engines.check_engine(fake_accelerator(DistributedType.DEEPSPEED), args, model=None)


def test_fsdp2_layer_class_of_the_other_objective_is_named():
    from modeling_xl import TransformerXLConfig, TransformerXLForPermutationLM

    config = TransformerXLConfig.from_preset("debug", cutoffs=[], adaptive=False, tie_projs=[False], attn_type="bi",
                                             d_embed=16)
    model = TransformerXLForPermutationLM(config)
    with pytest.raises(ValueError, match="fsdp_transformer_layer_cls_to_wrap=TransformerXLLayer names "
                                         "TransformerXLLayer.*expected PermutationLMLayer"):
        engines.check_layer_classes(model, ["TransformerXLLayer"])
    engines.check_layer_classes(model, ["PermutationLMLayer"])


def test_launcher_fallbacks_are_named():
    warn = engines.launcher_fallbacks
    assert warn({"ACCELERATE_USE_FSDP": "true"}, "DDP", 2, "cpu")[0].startswith(
        "the launcher was asked for FSDP (--use_fsdp / distributed_type: FSDP: ACCELERATE_USE_FSDP=true) but "
        "Accelerate runs DDP on cpu")
    assert "asked for DeepSpeed" in warn({"ACCELERATE_USE_DEEPSPEED": "true"}, "DDP", 2, "cpu")[0]
    # `accelerate launch --cpu --num_processes 2`: a rendezvous was prepared, one process started
    assert "started one" in warn({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500"}, "single process", 1, "cpu")[0]
    assert "WORLD_SIZE=4" in warn({"WORLD_SIZE": "4"}, "DDP", 2, "cuda")[0]
    assert warn({"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2"}, "FSDP2", 2, "cuda") == []
    assert warn({"ACCELERATE_USE_CPU": "True"}, "single process", 1, "cpu") == []


PROBE = textwrap.dedent("""
    import importlib.util, json, os
    from accelerate import Accelerator
    # the module by its path (it imports torch and accelerate only): importing the package would take seconds
    spec = importlib.util.spec_from_file_location("engines", ENGINES_FILE)
    engines = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engines)
    accelerator = Accelerator()
    found = engines.launcher_fallbacks(os.environ, engines.engine_name(accelerator), accelerator.num_processes,
                                       accelerator.device.type)
    with open(f"probe-{os.getpid()}.json", "w") as out:  # one file per process: their stdout lines may interleave
        json.dump({"rank": accelerator.process_index, "engine": engines.engine_name(accelerator),
                   "processes": accelerator.num_processes, "warnings": found}, out)
""").replace("ENGINES_FILE", repr(str(REPO / "modeling_xl" / "training" / "engines.py")))


FSDP_ON_CPU = ["the launcher was asked for FSDP"]
# what the launcher starts: (ranks, engine, warnings), one of `outcomes`
SPLIT_WORLD = ([0, 0], "single process", FSDP_ON_CPU + ["the launcher set WORLD_SIZE=2 but this run has 1 process(es)"])


@pytest.mark.parametrize("launcher, cpu_env, outcomes", [
    # without ACCELERATE_USE_CPU: two processes that each run alone (WORLD_SIZE=2, Accelerate sees 1; accelerate 1.15),
    # named and refused by refuse_split_world, or (accelerate 1.8) one DDP group of two: named either way
    (["--use_fsdp", "--fsdp_version", "2", "--num_processes", "2"], False, [SPLIT_WORLD, ([0, 1], "DDP", FSDP_ON_CPU)]),
    (["--use_fsdp", "--fsdp_version", "2", "--num_processes", "2"], True, [([0, 1], "DDP", FSDP_ON_CPU)]),
    (["--cpu", "--num_processes", "2"], False, [([0], "single process", ["asked for several processes"])]),
    (["--multi_gpu", "--num_processes", "2"], True, [([0, 1], "DDP", [])]),
])
def test_launcher_fallbacks_seen_through_the_real_launcher(tmp_path, launcher, cpu_env, outcomes):
    """The environment `launcher_fallbacks` reads is the one `accelerate launch` really sets on a CPU-only machine:
    --use_fsdp runs DDP (or, without ACCELERATE_USE_CPU, two separate single processes), --cpu --num_processes 2 runs
    one process; each is named. A plain DDP launch warns nothing."""
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("ACCELERATE_USE_CPU", None)
    env.pop("WORLD_SIZE", None)
    if cpu_env:
        env["ACCELERATE_USE_CPU"] = "1"
    result = subprocess.run([ACCELERATE, "launch", *launcher, "--num_machines", "1", "--mixed_precision", "no",
                             "--dynamo_backend", "no", "--main_process_port", str(warm_launch.free_port()),
                             str(tmp_path / "probe.py")],
                            env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    probes = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("probe-*.json"))]
    seen = sorted(p["rank"] for p in probes)
    matching = [outcome for outcome in outcomes if outcome[0] == seen]
    assert matching, (seen, probes)
    ranks, engine, warnings = matching[0]
    for probe in probes:
        assert probe["engine"] == engine and probe["processes"] == (len(ranks) if engine == "DDP" else 1)
        assert len(probe["warnings"]) == len(warnings), probe["warnings"]
        for expected, got in zip(warnings, probe["warnings"]):
            assert expected in got
        split = SimpleNamespace(num_processes=probe["processes"], distributed_type=None,
                                device=torch.device("cpu"))
        if probe["processes"] == 1 and len(ranks) > 1:  # the training loop stops such a launch before any data
            with pytest.raises(ValueError, match="WORLD_SIZE=2 processes but each one runs alone"):
                engines.refuse_split_world(split, {"WORLD_SIZE": "2"})


def test_process_layouts_that_keep_the_streams_per_chunk_are_accepted():
    saved = {"train_batch_size": 8, "num_processes": 2, "gradient_accumulation_steps": 1}
    check_process_layout(saved, {"train_batch_size": 8, "num_processes": 1, "gradient_accumulation_steps": 2}, "ck")
    check_process_layout(saved, {"train_batch_size": 8, "num_processes": 2, "gradient_accumulation_steps": 1}, "ck")
    with pytest.raises(ValueError, match=r"written with train_batch_size=8 over 2 process\(es\) x 1 chunk\(s\) of 4 "
                                         r"streams, this run has train_batch_size=8 over 1 process\(es\) x 1 chunk\(s\) "
                                         r"of 8 streams; expected"):
        check_process_layout(saved, {"train_batch_size": 8, "num_processes": 1, "gradient_accumulation_steps": 1},
                             "ck")
    with pytest.raises(ValueError, match="train_batch_size=16 over 1"):
        check_process_layout(saved, {"train_batch_size": 16, "num_processes": 1, "gradient_accumulation_steps": 2},
                             "ck")


def test_memories_move_to_the_process_and_chunk_that_hold_their_streams(tmp_path):
    """Written by 2 processes x 2 chunks (global chunks 0..3); read by 1 process x 4 chunks and by 4 x 1."""
    for rank in range(2):
        tensors = {"rng_state": torch.full((3,), rank, dtype=torch.uint8)}
        for chunk in range(2):
            for layer in range(2):
                tensors[f"chunk{chunk}.layer{layer}"] = torch.full((1, 2, 3), 10.0 * (2 * rank + chunk) + layer)
        save_file(tensors, str(tmp_path / f"memories_rank{rank}.safetensors"))
    saved = {"train_batch_size": 8, "num_processes": 2, "gradient_accumulation_steps": 2}
    one = {"train_batch_size": 8, "num_processes": 1, "gradient_accumulation_steps": 4}
    memories, rng = load_memories(tmp_path, saved, one, 0, "cpu")
    assert [[float(m[0, 0, 0]) for m in chunk] for chunk in memories] == [[0, 1], [10, 11], [20, 21], [30, 31]]
    assert rng.tolist() == [0, 0, 0]
    four = {"train_batch_size": 8, "num_processes": 4, "gradient_accumulation_steps": 1}
    for rank in range(4):
        memories, rng = load_memories(tmp_path, saved, four, rank, "cpu")
        assert [float(m[0, 0, 0]) for m in memories[0]] == [10.0 * rank, 10.0 * rank + 1]
        assert (rng is None) == (rank >= 2)  # processes the checkpoint did not have keep their own RNG


def test_the_start_of_a_run_says_what_runs(caplog):
    from accelerate.utils import DistributedType

    accelerator = fake_accelerator(DistributedType.FSDP, 2, activation_checkpointing=True)
    accelerator.__dict__.update(is_main_process=True, mixed_precision="bf16", device=torch.device("cpu"))
    args = SimpleNamespace(gradient_checkpointing=False)
    with caplog.at_level("INFO", logger="modeling_xl.training.engines"):
        warnings = engines.describe_run(accelerator, args, env={"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert warnings == []
    assert ("world size 2 (1 machine(s) x 2 process(es)), engine FSDP2, mixed precision bf16, device cpu, activation "
            "checkpointing on") in caplog.text
    caplog.clear()
    ddp = fake_accelerator(DistributedType.MULTI_CPU)
    ddp.__dict__.update(is_main_process=True, mixed_precision="no", device=torch.device("cpu"))
    with caplog.at_level("INFO", logger="modeling_xl.training.engines"):
        engines.describe_run(ddp, args, env={"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2"})
    assert "engine DDP" in caplog.text and "asked for FSDP" in caplog.text
