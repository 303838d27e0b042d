"""torch.compile of the whole training step (forward, loss, backward) of both language models.

The compiled model is the one `accelerate launch --dynamo_backend inductor` builds (`torch.compile(model)`). Here the
`aot_eager` backend traces exactly what inductor is given (dynamo's graph, then AOT autograd's forward and backward
graphs) without generating code, so the checks stay short on a CPU; `fullgraph=True` turns any graph break into an
error. One slow test runs the training script itself under `accelerate launch --dynamo_backend inductor`.
"""

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch._dynamo
import warm_launch
from kernel_sets import available_capabilities, inductor_cache_dir
from torch._dynamo.backends.debugging import aot_eager

from modeling_xl import TransformerXLConfig, TransformerXLForCausalLM, TransformerXLForPermutationLM

REPO = Path(__file__).resolve().parents[1]

VOCAB, BATCH, SEQ = 60, 2, 6
STEPS = 4

# the smallest models that take every path: adaptive input and softmax with two tail clusters, one shared table
# (div_val 1) or one table per cluster (div_val 2); the permutation LM's two streams; memory in every case
COMMON = dict(vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_head=8, d_inner=32, dropout=0.0, dropatt=0.0)
CASES = {
    "causal-div1": lambda: TransformerXLForCausalLM(TransformerXLConfig(
        **COMMON, d_embed=16, cutoffs=[20, 40], div_val=1, mem_len=4)),
    "causal-div2": lambda: TransformerXLForCausalLM(TransformerXLConfig(
        **COMMON, d_embed=16, cutoffs=[20, 40], div_val=2, mem_len=4)),
    # mem_len = reuse_len: the memory is full from the second step on (a filling memory changes shape: see docs)
    "plm": lambda: TransformerXLForPermutationLM(TransformerXLConfig(
        **COMMON, adaptive=False, attn_type="bi", ff_activation="gelu", reuse_len=3, mem_len=3)),
}


def batches(case: str, seed: int = 0) -> list[dict]:
    """STEPS random training batches; the causal LM's next-token labels reach every cluster."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        if case.startswith("causal"):
            labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
            labels[0, 0] = -100  # an ignored target
            out.append(dict(input_ids=ids, next_token_labels=labels))
        else:
            out.append(dict(input_ids=ids, perm_mask=(torch.rand(BATCH, SEQ, SEQ, generator=g) > 0.5).float(),
                            target_mapping=torch.nn.functional.one_hot(torch.tensor([[1, 4], [2, 5]]), SEQ).float(),
                            labels=torch.randint(0, VOCAB, (BATCH, 2), generator=g)))
    return out


def train(model, steps: list[dict], on_step=lambda i: None):
    """Forward + backward of every batch with the memory carried; per step (loss, gradients by name)."""
    mems, results = None, []
    for i, batch in enumerate(steps):
        on_step(i)
        model.zero_grad(set_to_none=True)
        out = model(**batch, mems=mems)
        out.loss.backward()
        mems = out.mems
        named = getattr(model, "_orig_mod", model).named_parameters()  # the same names through the compiled wrapper
        results.append((out.loss.detach(), {n: p.grad.clone() for n, p in named
                                            if p.grad is not None}))
    return results


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_step_compiles_to_one_graph_and_equals_eager(case, fresh_dynamo):
    """With memory over 4 steps: no graph break (fullgraph), one compilation without memory and one with it, none
    after; every loss and every parameter's gradient equal to the eager model's (dropout 0)."""
    torch.manual_seed(0)
    model = CASES[case]().train()
    eager = copy.deepcopy(model)
    step, compiled_at = [0], []

    def counting_backend(graph, example_inputs):
        compiled_at.append(step[0])
        return aot_eager(graph, example_inputs)

    data = batches(case)
    expected = train(eager, data)
    got = train(torch.compile(model, backend=counting_backend, fullgraph=True), data,
                on_step=lambda i: step.__setitem__(0, i))
    assert compiled_at == [0, 1]  # mems None at step 0, tensors from step 1 on; no recompilation after
    for i, ((loss, grads), (loss_eager, grads_eager)) in enumerate(zip(got, expected)):
        torch.testing.assert_close(loss, loss_eager, msg=lambda m: f"step {i}: {m}")
        assert grads.keys() == grads_eager.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], grads_eager[name], msg=lambda m: f"step {i}, {name}: {m}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_input_checks_stop_the_step(case, fresh_dynamo):
    """A label out of the vocabulary stops a compiled step with the eager check's text (an in-graph assert, not a
    graph break), and a good batch still runs."""
    torch.manual_seed(0)
    model = CASES[case]().train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    good = batches(case)[0]
    name = "next_token_labels" if case.startswith("causal") else "labels"
    bad = {**good, name: good[name].clone()}
    bad[name][1, 1] = VOCAB
    compiled(**good).loss.backward()
    with pytest.raises(RuntimeError, match=f"{name} has ids outside \\[0, vocab_size={VOCAB}\\)"):
        compiled(**bad)
    bad_ids = {**good, "input_ids": good["input_ids"].clone()}
    bad_ids["input_ids"][0, 0] = -1
    with pytest.raises(RuntimeError, match=f"input_ids has ids outside the vocabulary; expected token ids in "
                                           f"\\[0, vocab_size={VOCAB}\\)"):
        compiled(**bad_ids)


# Inductor compiles the adaptive input (div_val 2: one table per cluster, `AdaptiveEmbedding.masked_forward`) with
# dynamic shapes, as a compiled training step does once a shape changes (the generated kernel of issue 50's crash), and
# runs it on ids of every cluster, batches whose token count is not a multiple of the vector width (the kernel's tail).
EMBEDDING_CHILD = textwrap.dedent("""
    import json, sys, torch
    from modeling_xl import TransformerXLConfig
    from modeling_xl.adaptive_softmax import AdaptiveEmbedding

    torch.set_num_threads(1)
    torch.manual_seed(0)
    eager = AdaptiveEmbedding(TransformerXLConfig.from_preset("debug", vocab_size=66))  # clusters of 20, 30, 16 rows
    compiled = torch.compile(eager, backend="inductor", dynamic=True, fullgraph=True)
    worst = 0.0
    for shape in [(2, 8), (3, 5)]:
        ids = torch.randint(0, 66, shape)
        ids[0, :3] = torch.tensor([0, 20, 65])  # the first and the last row of the tables, the first of a tail cluster
        want, got = eager(ids), compiled(ids)
        grad = torch.randn_like(want)
        want_grads = torch.autograd.grad(want, list(eager.parameters()), grad)
        got_grads = torch.autograd.grad(got, list(eager.parameters()), grad)
        for a, b in [(want, got), *zip(want_grads, got_grads)]:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
            worst = max(worst, float((a - b).detach().abs().max()))
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "worst": worst}))
""")


@pytest.mark.parametrize("capability", available_capabilities())
def test_compiled_adaptive_embedding_equals_eager_under_each_cpu_capability(capability):
    """Inductor's C++ kernel of the adaptive input, forward and backward, under each kernel set of this processor (the
    scalar one, AVX2, AVX-512), in a fresh process each (torch reads ATEN_CPU_CAPABILITY on import, and Inductor
    picks its vector instructions from it): the eager module's embeddings and gradients. Each set has its own Inductor
    cache: a shared one hands the second set the first one's kernels (docs/testing.md)."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir(capability),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", EMBEDDING_CHILD], env=env, capture_output=True, text=True,
                            timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    assert json.loads(result.stdout.splitlines()[-1])["capability"] == capability.upper(), result.stdout


@pytest.mark.slow  # two launches of 2 processes, one of them compiling
def test_accelerate_launch_with_dynamo_trains_like_eager(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2 --dynamo_backend aot_eager` of the training loop (DDP over
    gloo, the debug preset: adaptive input and softmax with two tail clusters, div_val 2, memory): no graph break in
    the model, one recompilation per process (the memory, absent at step 1), and the eager run's losses (dropout 0).
    Graph breaks and recompilations are Dynamo's, whatever the backend; `aot_eager` traces forward and backward as
    Inductor does without generating C++ (with `inductor` this test took 163 s of the suite's 14 minutes on 2 cores,
    2026-11-29). Inductor's own kernels are checked in a fresh process per CPU kernel set
    (`test_compiled_adaptive_embedding_equals_eager_under_each_cpu_capability`)."""
    from generated_corpora import play_text
    from test_training_runs import COMMON, DRIVER, losses

    (tmp_path / "corpus.txt").write_text(play_text(30_000)[:30_000])
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "CORPUS": str(tmp_path / "corpus.txt"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "ACCELERATE_USE_CPU": "1", "TORCH_LOGS": "recompiles,graph_breaks"}
    runs = {}
    for backend in ("no", "aot_eager"):
        out = tmp_path / backend
        result = warm_launch.run(tmp_path / "driver.py", [*COMMON, "--max_train_steps", "6", "--eval_steps", "100",
                                                          "--dropout", "0", "--dropatt", "0", "--output_dir", str(out)],
                                 env=env, cwd=tmp_path, timeout=1200, processes=2,
                                 launcher=["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", backend])
        assert result.returncode == 0, result.stderr[-4000:]
        runs[backend] = (losses(out), result.stderr)
    (eager, _), (compiled, log) = runs["no"], runs["aot_eager"]
    # DDP's own wrapper breaks once before the model (its `_pre_forward` logging); the model's code never does
    breaks = re.findall(r"Graph break.*? in user code at (\S+)", log)
    assert breaks and not [b for b in breaks if "modeling_xl" in b], sorted(set(breaks))
    # the model's forward recompiles once per process (the memory, absent at step 1); dynamo's wrapper around it under
    # DDP (`inner` in torch/_dynamo/external_utils.py) recompiles for the same reason
    recompiled = re.findall(r"Recompiling function (\S+) in (\S+)", log)
    assert len([path for _, path in recompiled if "modeling_xl" in path]) == 2, recompiled
    reasons = re.findall(r"- \d+/\d+: (.*)", log)
    assert reasons and all(re.match(r"(kwargs\['mems'\]|mems) is None", r) for r in reasons), reasons
    assert sorted(compiled) == sorted(eager) == list(range(1, 7))
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-5), (step, compiled, eager)


def test_routed_tail_capacity_compiles_to_one_graph_and_equals_eager(fresh_dynamo):
    """With a tail capacity (each tail cluster scores only its own targets, `AdaptiveLogSoftmax.routed_log_probs`):
    still one graph, no recompilation after the memory's first step, and eager's losses and gradients, whose eager
    softmax selects each cluster's rows with `nonzero` instead."""
    from modeling_xl.training.tail_capacity import batch_tail_counts, tail_capacity

    torch.manual_seed(0)
    model = CASES["causal-div1"]().train()
    eager = copy.deepcopy(model)
    data = batches("causal-div1")
    model.lm_head.tail_capacity = tail_capacity(batch_tail_counts(data, model.lm_head.bounds), multiple=1)
    compiled_at, step = [], [0]

    def counting_backend(graph, example_inputs):
        compiled_at.append(step[0])
        return aot_eager(graph, example_inputs)

    expected = train(eager, data)
    got = train(torch.compile(model, backend=counting_backend, fullgraph=True), data,
                on_step=lambda i: step.__setitem__(0, i))
    assert compiled_at == [0, 1]
    for (loss, grads), (loss_eager, grads_eager) in zip(got, expected):
        torch.testing.assert_close(loss, loss_eager)
        for name in grads:
            torch.testing.assert_close(grads[name], grads_eager[name])
