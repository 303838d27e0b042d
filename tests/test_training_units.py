"""Unit tests of the training library: arguments, batches, accumulation maths, evaluation maths, checkpoints, Hub."""

import logging
import math
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from generated_corpora import write_wikitext_folder

from modeling_xl.data.pretrain_data import data_from_tokens
from modeling_xl.data.sources import StreamLayout
from modeling_xl.evaluation.stream_scoring import bits_per_character, perplexity, recurrence_settings
from modeling_xl.runtime.run_folder import check_output_dir
from modeling_xl.training import arguments as arguments_module
from modeling_xl.training.accumulation import chunk_loss_weight, chunk_slices
from modeling_xl.training.arguments import parse_args, processes_split
from modeling_xl.training.checkpointing import list_checkpoints, resolve_checkpoint, save_checkpoint
from modeling_xl.training.publishing import HubUploadError, push_folder, upload_file_list

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- arguments

def test_preset_recipe_then_yaml_then_command_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 0.01\ntgt_len: 12\nmax_train_steps: 7\n")
    args = parse_args(["--preset", "debug", "--config", str(config), "--tgt_len", "6", "--output_dir", str(tmp_path)])
    assert args.tgt_len == 6  # command line beats YAML
    assert args.learning_rate == 0.01 and args.max_train_steps == 7  # YAML beats the recipe
    assert args.train_batch_size == 4 and args.eval_mem_len == 16  # recipe of the debug preset
    assert args.max_grad_norm == 0.25 and args.dataset_name == "builtin"


def test_a_short_run_of_a_preset_scales_the_recipes_warmup():
    """`--preset tiny --max_train_steps 5` failed: the recipe's 50 warmup steps were longer than the run. A run
    shorter than the recipe's keeps the recipe's share of warmup; a warmup the caller gave is never changed."""
    from modeling_xl.training.arguments import PretrainArguments, resolve

    assert parse_args(["--preset", "tiny"]).num_warmup_steps == 50  # the recipe's 1,500 steps
    assert parse_args(["--preset", "tiny"]).max_grad_norm == 1.0  # chosen on held-out data (docs/pretraining.md)
    for steps in (5, 49, 50, 51, 750):
        assert parse_args(["--preset", "tiny", "--max_train_steps", str(steps)]).num_warmup_steps == 50 * steps // 1500
    assert parse_args(["--preset", "tiny", "--max_train_steps", "3000"]).num_warmup_steps == 50
    assert resolve(PretrainArguments(preset="tiny", num_warmup_steps=10, max_train_steps=30)).num_warmup_steps == 10
    assert parse_args(["--preset", "tiny", "--max_train_steps", "30", "--num_warmup_steps", "7"]).num_warmup_steps == 7
    with pytest.raises(ValueError, match="num_warmup_steps=50 is longer than max_train_steps=5"):
        parse_args(["--preset", "tiny", "--max_train_steps", "5", "--num_warmup_steps", "50"])  # given: refused


def test_character_level_is_read_from_a_saved_tokenizer():
    """A char or byte tokenizer given by --tokenizer_name reports bits per character (it went by --tokenizer_type)."""
    from modeling_xl.data.tokenizer_choice import is_character_level
    from tokenization import byte_level_tokenizer, train_char_level_tokenizer, train_word_level_tokenizer

    assert is_character_level(train_char_level_tokenizer(["ab c"])) and is_character_level(byte_level_tokenizer())
    assert not is_character_level(train_word_level_tokenizer(["ab c"]))


def test_yaml_with_unknown_key_is_rejected(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rat: 0.01\n")
    with pytest.raises(ValueError, match=r"unknown keys \['learning_rat'\]"):
        parse_args(["--config", str(config)])


def test_yaml_values_are_converted_to_the_argument_types(tmp_path):
    config = tmp_path / "run.yaml"  # PyYAML reads 3e-4 (no dot) as the string '3e-4'
    config.write_text("learning_rate: 3e-4\nadam_epsilon: 1e-6\nmax_train_steps: 1e3\neval_steps: '7'\n"
                      "bi_data: 'yes'\ndataset_config_name: 103\nmixed_precision: 'no'\n")
    args = parse_args(["--preset", "debug", "--config", str(config)])
    assert args.learning_rate == 3e-4 and isinstance(args.learning_rate, float) and args.adam_epsilon == 1e-6
    assert args.max_train_steps == 1000 and args.eval_steps == 7 and args.bi_data is True
    assert args.dataset_config_name == "103" and args.mixed_precision == "no"


@pytest.mark.parametrize("text, message", [
    ("learning_rate: fast", r"learning_rate='fast' is invalid; expected a number"),
    ("max_train_steps: 2.5", r"max_train_steps=2.5 is invalid; expected an integer"),
    ("with_tracking: maybe", r"with_tracking='maybe' is invalid; expected a boolean"),
    ("mixed_precision: no", r"mixed_precision=False is invalid; expected a string \(YAML reads unquoted yes/no"),
    ("seed: [1, 2]", r"seed=\[1, 2\] is invalid; expected an integer"),
])
def test_yaml_values_of_the_wrong_type_are_named(tmp_path, text, message):
    config = tmp_path / "run.yaml"
    config.write_text(text + "\n")
    with pytest.raises(ValueError, match=rf"config='{config}': {message}"):
        parse_args(["--config", str(config)])


@pytest.mark.parametrize("argv, message", [
    (["--tokenizer_vocab_size", "0"], r"tokenizer_vocab_size=0 is invalid; expected an integer >= 3"),
    (["--tokenizer_vocab_size", "-5"], r"tokenizer_vocab_size=-5 is invalid; expected an integer >= 3"),
    (["--tokenizer_vocab_size", "4", "--objective", "plm"], r"tokenizer_vocab_size=4 is invalid; expected an integer >= 5"),
    (["--overwrite_output_dir", "--resume_from_checkpoint", "latest"], r"overwrite_output_dir=True and "
                                                                       r"resume_from_checkpoint='latest' are both set"),
    (["--objective", "mlm"], r"objective='mlm' is invalid; expected one of \['clm', 'plm'\]"),
    (["--train_file", "/nonexistent/train.txt"], r"train_file='/nonexistent/train.txt' does not exist"),
    (["--lr_scheduler_type", "step"], r"lr_scheduler_type='step' is invalid"),
    (["--tgt_len", "0"], r"tgt_len=0 is invalid; expected a positive integer"),
    (["--train_batch_size", "4", "--per_device_train_batch_size", "2"], r"are both set; expected one"),
    (["--tokenizer_name", "tok", "--tokenizer_vocab_size", "50"], r"tokenizer_vocab_size=50 and tokenizer_name='tok' "
     r"are both set; expected one"),
    (["--model_name_or_path", "out", "--tokenizer_type", "char"], r"tokenizer_type='char' and "
     r"model_name_or_path='out' are both set"),
    (["--model_name_or_path", "/nonexistent/model"], r"model_name_or_path='/nonexistent/model' does not exist; "
     r"expected a local folder"),
    (["--tokenizer_name", "~/tok"], r"tokenizer_name='~/tok' starts with '~', which is not expanded here"),
])
def test_bad_arguments_are_named(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_args(argv)


def test_streams_must_split_over_processes_and_chunks():
    args = parse_args(["--preset", "debug", "--train_batch_size", "6", "--gradient_accumulation_steps", "2"])
    assert processes_split(args, 1) == (6, 6)
    with pytest.raises(ValueError, match=r"train_batch_size=6 streams cannot be shared by 4 processes"):
        processes_split(args, 4)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2 does not divide the 3 streams"):
        processes_split(args, 2)
    per_device = parse_args(["--preset", "debug", "--per_device_train_batch_size", "3"])
    assert processes_split(per_device, 2) == (6, 3)


def test_unwritable_output_dir_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=r"output_dir=.* is not writable"):
        check_output_dir(str(blocker / "out"), arguments_module.earlier_pretraining_run)


def test_output_dir_check_leaves_other_processes_probes_alone(tmp_path):
    """Every process of a multi-process run checks the output folder at once: one process's write probe must not be
    another's (a shared probe name let one process delete the file the other was about to remove, and that process
    then reported the folder as not writable). The check leaves nothing behind."""
    other = tmp_path / ".write_test"  # the probe name every process used before
    other.write_text("another process's probe")
    assert check_output_dir(str(tmp_path), arguments_module.earlier_pretraining_run) == tmp_path
    assert other.read_text() == "another process's probe"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".write_test"]


# ---------------------------------------------------------------- the loop's view of the streams

class _Tokenizer:
    def __len__(self):
        return 50

    def get_vocab(self):
        return {str(i): i for i in range(50)}


def test_train_batches_wrap_epochs_and_keep_each_rank_on_its_rows():
    tokens = torch.randint(0, 50, (331,))
    whole = data_from_tokens(_Tokenizer(), tokens, tokens[:60], StreamLayout(4, 8, 8))
    ranks = [data_from_tokens(_Tokenizer(), tokens, tokens[:60], StreamLayout(4, 8, 8, 2, r)) for r in range(2)]
    per_epoch = len(whole.train)  # (331 - 1) // 4 = 82 tokens per row -> 10 segments
    assert per_epoch == 10
    seen = list(whole.train_batches(8, 13, "cpu"))
    assert [step for step, _ in seen] == [8, 9, 10, 11, 12]
    assert [batch["new_epoch"] for _, batch in seen] == [False, False, True, False, False]
    assert torch.equal(seen[2][1]["input_ids"], whole.train.batch(0)["input_ids"])
    for step in (0, 3, 11):
        joined = torch.cat([next(r.train_batches(step, step + 1, "cpu"))[1]["input_ids"] for r in ranks])
        assert torch.equal(joined, next(whole.train_batches(step, step + 1, "cpu"))[1]["input_ids"])
    # row b of step t + 1 continues row b of step t (naive reference: row b is tokens[b * 82:(b + 1) * 82])
    (_, now), (_, after) = list(whole.train_batches(3, 5, "cpu"))
    assert torch.equal(after["input_ids"][:, 0], now["next_token_labels"][:, -1])
    assert torch.equal(now["input_ids"][2], tokens[2 * 82 + 24: 2 * 82 + 32])


def test_token_ids_outside_the_tokenizer_are_rejected():
    with pytest.raises(ValueError, match=r"training token ids reach 77, outside the tokenizer's vocabulary of 50"):
        data_from_tokens(_Tokenizer(), torch.tensor([1, 77] * 40), torch.arange(20), StreamLayout(2, 4, 4))


# ---------------------------------------------------------------- accumulation and evaluation maths

def test_chunk_slices_and_weights():
    assert chunk_slices(8, 2) == [slice(0, 4), slice(4, 8)]
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=3 does not divide the 8 rows"):
        chunk_slices(8, 3)
    assert chunk_loss_weight(64, 2) == pytest.approx(1 / 32)
    # sum over chunks and processes of weight x chunk sums, averaged over processes = global mean
    sums = torch.rand(2, 3)  # [process, chunk] NLL sums over 64 tokens in all
    averaged = (sums * chunk_loss_weight(64, 2)).sum(dim=1).mean()
    assert averaged.item() == pytest.approx(sums.sum().item() / 64)


def test_perplexity_is_exp_of_total_nll_over_tokens():
    assert perplexity(40.0, 20) == pytest.approx(math.e ** 2)
    assert bits_per_character(100 * math.log(2), 100) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="total_tokens=0"):
        perplexity(1.0, 0)


def test_recurrence_settings_are_restored_even_on_error():
    from modeling_xl import TransformerXLConfig

    config = TransformerXLConfig.from_preset("debug", mem_len=8, clamp_len=-1, same_length=False)
    with pytest.raises(RuntimeError):
        with recurrence_settings(config, 32, 20, True):
            assert (config.mem_len, config.clamp_len, config.same_length) == (32, 20, True)
            raise RuntimeError("boom")
    assert (config.mem_len, config.clamp_len, config.same_length) == (8, -1, False)


# ---------------------------------------------------------------- checkpoints

class _FakeAccelerator:
    """The parts of Accelerator that save_checkpoint uses, on one process."""

    is_main_process, process_index = True, 0

    def __init__(self, fail=False):
        self.fail = fail

    def wait_for_everyone(self):
        pass

    def save_state(self, folder, safe_serialization=True):
        Path(folder, "model.safetensors").write_text("weights")
        if self.fail:
            raise OSError("disk full")


def test_interrupted_save_leaves_previous_checkpoint_usable(tmp_path):
    memories = [tuple(torch.randn(2, 3, 4) for _ in range(2)), None]
    save_checkpoint(_FakeAccelerator(), tmp_path, 5, {"tokens_seen": 1}, memories, keep=2)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(_FakeAccelerator(fail=True), tmp_path, 10, {"tokens_seen": 2}, memories, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000005"]
    assert resolve_checkpoint(tmp_path, "latest").name == "step_0000005"
    for step in (10, 15, 20):
        save_checkpoint(_FakeAccelerator(), tmp_path, step, {"tokens_seen": step}, memories, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000015", "step_0000020"]


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"resume_from_checkpoint='latest' found no checkpoint"):
        resolve_checkpoint(tmp_path, "latest")
    with pytest.raises(ValueError, match=r"is not a checkpoint folder"):
        resolve_checkpoint(tmp_path, str(tmp_path))


# ---------------------------------------------------------------- Hub upload, offline

def _final_folder(root: Path) -> Path:
    """A final folder with what a kill leaves behind: a checkpoint, the temporary file of a card rewrite killed before
    its rename (`replace_text`) and of `complete_auto_map`'s config.json, none of which is uploaded."""
    from modeling_xl.runtime.run_folder import replace_text

    for name in ("config.json", "model.safetensors", "README.md", "runs/events.out", "checkpoints/step_0000001/x",
                 f".tmp_config.json.{os.getpid()}"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    with mock.patch("os.replace", side_effect=SystemExit("killed")), mock.patch.object(Path, "unlink"):
        with pytest.raises(SystemExit):
            replace_text(root / "README.md", "the card, rewritten")
    assert (root / "README.md").read_text() == "README.md" and len(list(root.glob(".tmp_README.md*"))) == 1
    return root


def test_push_to_hub_uploads_exactly_the_final_folder(tmp_path):
    import huggingface_hub.hf_api as hf_api

    folder = _final_folder(tmp_path / "out")
    commits = []

    def fake_commit(self, repo_id, operations, **kwargs):
        commits.append((repo_id, sorted(op.path_in_repo for op in operations)))
        return hf_api.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message="m",
                                 commit_description="", oid="abc")

    # the network boundary: create_repo, create_commit and the README metadata check (a POST to /api/validate-yaml)
    with mock.patch.object(hf_api.HfApi, "create_repo", return_value=None) as create_repo, \
            mock.patch.object(hf_api.HfApi, "create_commit", fake_commit), \
            mock.patch.object(hf_api.HfApi, "_validate_yaml", return_value=None), \
            mock.patch.object(hf_api, "is_xet_available", return_value=False, create=True):
        url = push_folder(folder, "someone/tiny-xl", token="hf_fake")
    create_repo.assert_called_once()
    assert commits == [("someone/tiny-xl", ["README.md", "config.json", "model.safetensors", "runs/events.out"])]
    assert upload_file_list(folder) == commits[0][1]
    assert url.endswith("/commit/abc")


def test_failed_push_keeps_the_folder_and_says_how_to_retry(tmp_path):
    import huggingface_hub.hf_api as hf_api

    folder = _final_folder(tmp_path / "out")
    before = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    with mock.patch.object(hf_api.HfApi, "create_repo", side_effect=ConnectionError("no network")):
        with pytest.raises(HubUploadError, match=r"(?s)no network.*intact.*hf upload someone/tiny-xl"):
            push_folder(folder, "someone/tiny-xl", token="hf_fake")
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == before


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_optimizer_is_fused_on_cpu_and_decays_only_matrices(optimizer):
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from modeling_xl.training.models import build_optimizer, fused_supported

    args = parse_args(["--preset", "debug", "--optimizer", optimizer, "--weight_decay", "0.1"])
    model = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug"))
    opt = build_optimizer(args, model)
    assert all(group["fused"] for group in opt.param_groups)
    assert not fused_supported([torch.zeros(2, dtype=torch.long)]) and not fused_supported([])
    if optimizer == "adamw":
        decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
        assert id(model.transformer.layers[0].attn.qkv_net.weight) in decayed
        assert id(model.transformer.layers[0].attn.r_w_bias) not in decayed
    model(torch.randint(0, model.config.vocab_size, (2, 5)), labels=torch.randint(0, 8, (2, 5))).loss.backward()
    opt.step()  # the fused kernel runs on CPU


# ---------------------------------------------------------------- permutation-LM data

class _WordTokenizer:
    """A tokenizer that `plm_data_from_tokens` can add <sep> and <cls> to (ids 50 and 51)."""

    eos_token_id = 0
    sep_token = cls_token = None

    def add_special_tokens(self, tokens):
        self.sep_token, self.cls_token = tokens["sep_token"], tokens["cls_token"]
        self.sep_token_id, self.cls_token_id = 50, 51


def _plm_data(*argv, valid_tokens=1200):
    from modeling_xl.data.pretraining import plm_data_from_tokens
    from modeling_xl.training.data_sources import plm_rows

    rng = np.random.default_rng(0)
    args = parse_args(["--objective", "plm", "--preset", "debug", "--tgt_len", "16", "--mem_len", "8", *argv])
    layout = StreamLayout(args.train_batch_size, args.tgt_len, args.eval_tgt_len)
    return plm_data_from_tokens(_WordTokenizer(), rng.integers(0, 50, 3000), rng.integers(0, 50, valid_tokens),
                                plm_rows(args), layout), args


def test_plm_batch_of_a_step_does_not_depend_on_max_train_steps():
    short, _ = _plm_data("--max_train_steps", "8")
    longer, _ = _plm_data("--max_train_steps", "12")
    assert len(short.train) == 8 and len(longer.train) == 12
    for step in range(8):  # a run resumed with a larger --max_train_steps reads the batches of the first run
        for key, value in short.train.batch(step).items():
            assert torch.equal(value, longer.train.batch(step)[key]), (step, key)
    whole, _ = _plm_data("--max_train_steps", "10000")  # past the text: the whole layout, (750 - 16) // 8 + 1 steps
    assert len(whole.train) == 92 and torch.equal(whole.train.batch(7)["input_ids"], short.train.batch(7)["input_ids"])
    # row b of step t starts at token t * reuse_len of row b (rows cut from the whole text: 750 tokens each)
    tokens = np.random.default_rng(0).integers(0, 50, 3000)
    assert short.train.batch(5)["input_ids"][2, :8].tolist() == tokens[2 * 750 + 40: 2 * 750 + 48].tolist()


def test_plm_max_gram_reaches_the_sampler_and_a_resume_with_another_is_refused():
    from modeling_xl.data import plm_sampling
    from modeling_xl.training.checkpointing import check_same_stream

    default, _ = _plm_data("--max_train_steps", "4")
    single, args = _plm_data("--max_train_steps", "4", "--max_gram", "1")
    assert default.train.sampling.max_gram == 5 and single.train.sampling.max_gram == 1
    drawn = []
    real = plm_sampling.sample_target_spans
    with mock.patch.object(plm_sampling, "sample_target_spans",
                           side_effect=lambda *a, **k: drawn.append(k["max_gram"]) or real(*a, **k)):
        single.train.batch(0)
    assert drawn and set(drawn) == {1}
    with pytest.raises(ValueError, match=r"was written with max_gram=5, this run's training data has max_gram=1"):
        check_same_stream({"objective": "plm", "max_gram": 5}, {"max_gram": 1}, "ckpt")
    with pytest.raises(ValueError, match=r"max_gram must be >= 1, got 0"):
        _plm_data("--max_train_steps", "4", "--max_gram", "0")


def test_plm_final_evaluation_reads_the_whole_validation_split():
    from modeling_xl.training.models import build_config, build_model
    from modeling_xl.training.plm_objective import plm_evaluate, plm_model_class

    data, args = _plm_data("--max_train_steps", "4", "--max_eval_segments", "2")
    assert len(data.validation) == (1200 // 4 - 16) // 8 + 1  # every step of every validation row: 36
    model = build_model(args, build_config(args, 52), plm_model_class())
    seen = []
    with mock.patch("modeling_xl.training.plm_objective.plm_step", side_effect=lambda m, batch, mems: (
            seen.append(model.config.same_length) or (torch.ones(()), batch["target_mask"].sum(), None))):
        capped = plm_evaluate(model, model.config, data, args, "cpu", max_segments=2, reduce=None)
        final = plm_evaluate(model, model.config, data, args, "cpu", max_segments=None, reduce=None)
    assert len(seen) == 2 + 36 and final["eval_tokens"] == 36 / 2 * capped["eval_tokens"]
    assert set(seen) == {args.eval_same_length} and model.config.same_length is False  # evaluation setting, restored


# ---------------------------------------------------------------- model card

def _card(tmp_path, argv, data_info):
    from modeling_xl.training.publishing import model_card

    args = parse_args(["--preset", "debug", "--output_dir", str(tmp_path), *argv])
    return model_card(tmp_path, repo_id="someone/tiny-xl", args=args, results={"perplexity": 12.5},
                      data_info=data_info, wall_time_s=60.0, hardware="1 x cpu")


def test_card_of_a_local_dataset_folder_names_it_without_its_path(tmp_path):
    from modeling_xl.data.pretrain_data import describe
    from modeling_xl.training.data_sources import corpus_source, tokenizer_recipe

    data_root = tmp_path / "data"
    folder = str(write_wikitext_folder(data_root / "wikitext-2", train_lines=20)) + "/"
    args = parse_args(["--preset", "debug", "--dataset_name", folder])
    info = describe(corpus_source(args), tokenizer_recipe(args), _Tokenizer(),
                    {"train": np.zeros(10), "validation": np.zeros(5)})
    assert info["dataset_name"] == "wikitext-2" and info["hub_dataset"] is None
    card = _card(tmp_path, ["--dataset_name", folder], info)
    assert card.data.datasets is None and str(data_root) not in str(card)
    assert card.data.eval_results[0].dataset_type == "wikitext-2"
    hub_args = parse_args(["--dataset_name", "someone/corpus"])
    hub = describe(corpus_source(hub_args), tokenizer_recipe(hub_args), _Tokenizer(),
                   {"train": np.zeros(10), "validation": np.zeros(5)})
    assert _card(tmp_path, [], hub).data.datasets == ["someone/corpus"]


def test_card_usage_example_tokenizes_the_prompt_without_eos(tmp_path):
    from tokenization import train_word_level_tokenizer

    card = str(_card(tmp_path, [], {"dataset_name": "custom", "example_prompt": "The"}))
    line = next(row for row in card.splitlines() if row.startswith("ids = tokenizer("))
    tokenizer = train_word_level_tokenizer(["The cat sat", "The end"])  # appends <eos> to every text by default
    namespace = {"tokenizer": tokenizer}
    exec(line, namespace)  # the card's own line
    assert namespace["ids"].tolist() == [[tokenizer.convert_tokens_to_ids("The")]]


def test_plm_card_counts_reuse_len_new_tokens_per_step(tmp_path):
    card = str(_card(tmp_path, ["--objective", "plm", "--tgt_len", "16"], {"dataset_name": "custom"}))
    assert "moves each row 8 tokens further" in card and "count\n8 new tokens per row and step" in card


# ---------------------------------------------------------------- scripts

def test_conversion_into_its_own_legacy_folder_is_refused(tmp_path):
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("convert_script", REPO / "scripts" / "convert_transfo_xl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    legacy = tmp_path / "legacy"
    shutil.copytree(REPO / "tests" / "fixtures" / "legacy_transfo_xl" / "case_a", legacy)
    before = {p.name: p.read_bytes() for p in legacy.iterdir()}
    for out in (str(legacy), str(legacy) + "/", str(tmp_path / "." / "legacy")):
        with pytest.raises(ValueError, match=r"out_dir=.* is the legacy_dir itself; expected another folder"):
            script.convert(str(legacy), out)
    assert {p.name: p.read_bytes() for p in legacy.iterdir()} == before
    script.convert(str(legacy), str(tmp_path / "converted"))  # another folder still works
    assert (tmp_path / "converted" / "config.json").is_file()


def test_plm_bi_data_gives_every_process_and_chunk_forward_rows_then_their_backward_copies():
    """The model reads the first half of the rows it is given with the forward position table and the second half
    with the backward one: with bi_data every process's accumulation chunk must hold forward rows followed by the same
    rows read backwards, not a process or chunk of forward rows only."""
    from modeling_xl.data.plm_streams import bidirectional_row_order
    from modeling_xl.data.pretraining import plm_data_from_tokens
    from modeling_xl.training.accumulation import chunk_slices
    from modeling_xl.training.data_sources import plm_rows

    assert bidirectional_row_order(8, 2) == [0, 1, 4, 5, 2, 3, 6, 7]
    rng = np.random.default_rng(0)
    train_ids, valid_ids = rng.integers(0, 50, 3000), rng.integers(0, 50, 1200)
    args = parse_args(["--objective", "plm", "--preset", "debug", "--tgt_len", "16", "--mem_len", "8", "--bi_data",
                       "--train_batch_size", "8", "--gradient_accumulation_steps", "2", "--max_train_steps", "3"])
    seen = []
    for process in range(2):
        data = plm_data_from_tokens(_WordTokenizer(), train_ids, valid_ids, plm_rows(args),
                                    StreamLayout(8, args.tgt_len, args.eval_tgt_len, 2, process))
        samples = [data.train.layout.sample(i, 1) for i in data.train.rows]  # step 1 of this process's rows
        for chunk in chunk_slices(len(samples), 2):
            part = samples[chunk]
            assert [int(s["reverse"]) for s in part] == [0, 1]
            assert int(part[1]["row"]) == int(part[0]["row"]) + 4  # layout row b + B/2 is row b read backwards
            seen += [int(s["row"]) for s in part]
        batch = data.train.batch(1)
        assert torch.equal(batch["input_ids"], torch.as_tensor(np.stack([s["input_ids"] for s in samples])))
    assert sorted(seen) == list(range(8))  # every layout row once
    with pytest.raises(ValueError, match="train_batch_size / 2 = 4 to be a multiple of 8"):
        bidirectional_row_order(8, 8)


def test_the_end_token_of_a_pretrained_config_comes_from_the_tokenizer():
    from modeling_xl.training.models import build_config

    args = parse_args(["--preset", "debug"])
    assert build_config(args, 52, eos_token_id=7).eos_token_id == 7  # a word-level or Unigram tokenizer's end token
    assert build_config(args, 52, eos_token_id=None).eos_token_id is None  # char/byte level: none, not id 0


def test_a_model_continued_from_a_saved_one_generates_up_to_the_new_tokenizers_end_token(tmp_path):
    from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM
    from modeling_xl.training.models import build_config, build_model

    saved = TransformerXLForCausalLM(TransformerXLConfig.from_preset("debug", vocab_size=52, adaptive=False,
                                                                     eos_token_id=5))
    saved.save_pretrained(tmp_path / "saved")
    assert saved.generation_config.eos_token_id == 5
    args = parse_args(["--preset", "debug", "--model_name_or_path", str(tmp_path / "saved")])
    model = build_model(args, build_config(args, 52, eos_token_id=None))  # now a char-level tokenizer: no end token
    assert model.config.eos_token_id is None and model.generation_config.eos_token_id is None


def test_a_resume_with_another_max_train_steps_says_the_schedule_is_rebuilt():
    from modeling_xl.runtime.checkpoint_state import CheckpointError, validate_training_state
    from modeling_xl.training.checkpointing import schedule_change

    state = {"step": 80, "max_train_steps": 80, "num_warmup_steps": 10}
    message = schedule_change(state, 100, 10, "cosine")
    assert "written by a run of max_train_steps=80; this run has max_train_steps=100" in message
    assert "the rates from step 81 on are the new schedule's" in message
    assert "num_warmup_steps=10; this run has num_warmup_steps=0" in schedule_change(state, 80, 0, "linear")
    assert schedule_change(state, 80, 10, "cosine") is None and schedule_change(state, 100, 0, "constant") is None
    assert schedule_change(state, 100, 10, "constant_with_warmup") is None  # it does not read the length
    assert schedule_change({"step": 80}, 100, 0, "cosine") is None  # written before these were recorded
    with pytest.raises(CheckpointError, match="has max_train_steps=0; expected a positive integer"):
        validate_training_state({"step": 4, "max_train_steps": 0}, "step_0000004")


def test_a_runs_training_config_record_runs_it_again(tmp_path, caplog):
    """training_config.yaml holds every resolved argument plus records (resolved_batch, model_config, the config file
    the run read, the Hub token placeholder): fed back as --config it gives the same arguments."""
    from modeling_xl.training.arguments import save_resolved

    first = parse_args(["--preset", "debug", "--per_device_train_batch_size", "4", "--max_train_steps", "7",
                        "--output_dir", str(tmp_path / "a"), "--hub_token", "secret", "--learning_rate", "3e-4"])
    save_resolved(first, tmp_path, {"resolved_batch": {"train_batch_size": 4}, "model_config": {"d_model": 16}})
    with caplog.at_level(logging.INFO, logger="modeling_xl.training.arguments"):
        again = parse_args(["--config", str(tmp_path / "training_config.yaml"), "--output_dir", str(tmp_path / "b")])
    assert "is the record of an earlier run" in caplog.text
    expected = {**first.to_dict(), "output_dir": str(tmp_path / "b"), "hub_token": None,
                "config": str(tmp_path / "training_config.yaml")}
    assert again.to_dict() == expected
    json_again = parse_args(["--config", str(tmp_path / "training_config.json"), "--output_dir", str(tmp_path / "b")])
    assert json_again.to_dict() == {**expected, "config": str(tmp_path / "training_config.json")}
    # a tokenizer from a folder (its kind and size are the run's defaults, not arguments), the old folder's and the
    # old publication's settings (not carried into a new run)
    (tmp_path / "tok").mkdir()
    second = parse_args(["--preset", "debug", "--tokenizer_name", str(tmp_path / "tok"), "--output_dir",
                         str(tmp_path / "c"), "--overwrite_output_dir", "--push_to_hub", "--hub_model_id", "me/model"])
    save_resolved(second, tmp_path, {"resolved_batch": {}, "model_config": {}})
    rerun = parse_args(["--config", str(tmp_path / "training_config.yaml"), "--output_dir", str(tmp_path / "d")])
    assert rerun.tokenizer_name == str(tmp_path / "tok") and rerun.max_train_steps == second.max_train_steps
    assert not rerun.overwrite_output_dir and not rerun.push_to_hub and rerun.hub_model_id is None


def test_a_model_source_missing_under_a_local_folder_says_so_after_the_lookup(tmp_path, monkeypatch):
    """`outputs/tiny` may be a Hub id, so it is looked up; when that fails and `outputs/` is here, the error adds that
    the local folder is missing."""
    from modeling_xl.training.models import build_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    args = parse_args(["--preset", "debug", "--model_name_or_path", "outputs/tiny"])
    with pytest.raises(ValueError, match=r"(?s)model_name_or_path='outputs/tiny' could not be loaded \(.*\); and there is no "
                                         r"local folder 'outputs/tiny': 'outputs' \(from .*\) holds no 'tiny'; expected"):
        build_config(args, 52)


def test_resume_is_suggested_only_for_an_earlier_run_that_saved_a_checkpoint(tmp_path):
    from modeling_xl.training import arguments as arguments_module

    (tmp_path / "train_log.jsonl").write_text("{}\n")
    with pytest.raises(ValueError) as refused:
        check_output_dir(str(tmp_path), arguments_module.earlier_pretraining_run)
    assert "(train_log.jsonl)" in str(refused.value) and "resume_from_checkpoint" not in str(refused.value)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ValueError, match=r"\(checkpoints, train_log.jsonl\); expected an empty or new folder, "
                                         r"--resume_from_checkpoint latest to continue that run, or --overwrite"):
        check_output_dir(str(tmp_path), arguments_module.earlier_pretraining_run)


def test_report_to_trackio_names_why_no_tracker_starts(monkeypatch):
    """`--report_to trackio` where it cannot start: an Accelerate without the tracker (before 1.9) is named as such,
    not as a missing trackio package; with the tracker but without the package, the package is named."""
    from accelerate import utils

    from modeling_xl.training.feedback import tracker_names

    monkeypatch.delattr(utils, "is_trackio_available", raising=False)
    with pytest.raises(ValueError, match=r"report_to='trackio' but Accelerate .* has no trackio tracker; expected "
                                         r"accelerate>=1.9"):
        tracker_names("trackio")
    assert "trackio" not in tracker_names("all")  # "all": whatever is there, nothing refused
    monkeypatch.setattr(utils, "is_trackio_available", lambda: False, raising=False)
    with pytest.raises(ValueError, match=r"report_to='trackio' but trackio is not installed; expected `pip install "
                                         r"trackio`"):
        tracker_names("trackio")
    monkeypatch.setattr(utils, "is_trackio_available", lambda: True, raising=False)
    assert "trackio" in tracker_names("trackio")
