"""The tests whose outcome depends on a dependency's version: `.ci/run` runs them (`-m floors`) at the floor of every
dependency pyproject.toml declares. `conftest.py` marks them at collection.

Each entry is a whole file (its tests all wrap a dependency's API) or one test, with the dependency it exercises.
The single tests are the ones that failed below a floor when the floors were chosen (docs/ecosystem.md,
"Dependency floors"); the files are the package's surface towards transformers, datasets, tokenizers, accelerate,
peft and lm-eval. The rest of the suite checks this package's own maths and pipelines, which the same code runs
whatever the versions: the newest releases' pass covers it.
"""

FLOOR_FILES = {
    "test_transformers_api.py": "transformers: the non-public names this package uses, pinned",
    "test_ecosystem.py": "transformers: pipeline, TextStreamer, Trainer, AutoTokenizer with and without remote code",
    "test_adapters.py": "peft (extra): default targets, adapters in every projection, fine-tuning with --lora_r",
    "test_harness.py": "lm-eval (extra): the registered model class against evaluate_lm.py and the hf model",
    "test_tokenizers.py": "tokenizers, transformers: training, saving and loading every tokenizer kind",
    "test_corpora.py": "datasets, pyarrow: reading corpora into datasets and their caches",
    "test_xlnet_conversion.py": "transformers: XLNet checkpoints import with transformers' XLNet logits",
}

FLOOR_TESTS = {
    "test_modeling_transformer_xl.py::test_presets_build_and_unknown_preset_errors":
        "transformers 5.0-5.2: a preset's config fails to build",
    "test_modeling_transformer_xl.py::test_remote_code_loading_in_fresh_process":
        "transformers 5.4-5.9: remote code copied one import deep",
    "test_permutation_lm.py::test_remote_code_loading_in_fresh_process": "transformers: remote code",
    "test_permutation_lm.py::test_auto_model_loads_the_bidirectional_backbone":
        "transformers 5.10-5.12: AutoModel on a permutation-LM folder",
    "test_task_heads.py::test_remote_code_loads_every_task_head_in_a_fresh_process": "transformers: remote code",
    "test_classification.py::test_remote_code_loading_in_fresh_process": "transformers: remote code",
    "test_finetuning.py::test_remote_code_classifier_and_pipeline_in_a_fresh_process": "transformers: pipeline",
    "test_adaptive_softmax.py::test_tied_table_gradient_under_fsdp2": "torch 2.7-2.8: FSDP2 with the tied table",
    "test_distributed.py::test_fsdp2_resume_after_sigkill_is_exact": "accelerate 1.8-1.12: FSDP2 resume not exact",
    "test_task_scripts.py::test_multiple_choice_labels_keys_texts_and_context":
        "datasets 4.0-4.6: a JSON-lines column of strings and numbers",
    "test_task_scripts.py::test_multiple_choice_script_with_three_four_and_five_choices":
        "datasets, evaluate, accelerate: a task script end to end",
    "test_compile.py::test_training_step_compiles_to_one_graph_and_equals_eager": "torch: Dynamo traces the step",
    "test_warm_launch.py::test_workers_get_the_environment_of_the_real_launcher":
        "accelerate, torch: the environment of `accelerate launch` that the tests' launches copy",
    "test_training_steps.py::test_script_on_a_char_level_text_file_reports_bpc":
        "accelerate, datasets: the pretraining script end to end",
}


def is_floor_test(nodeid: str) -> bool:
    """Whether the test `nodeid` ("tests/test_x.py::test_y[param]") is in the floor pass."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    return file in FLOOR_FILES or f"{file}::{name.split('[', 1)[0]}" in FLOOR_TESTS
