"""`--objective plm`: XLNet-style permutation LM (Yang et al. 2019) on the same loop as the causal LM.

Samples come from `modeling_xl.data.plm_sampling` (layout `reuse ++ A <sep> B <sep> <cls>`, span targets, one local
permutation per half). The layout is step-major, so batch t holds step t of every row; process r takes rows
[r·B/W, (r+1)·B/W) of each step, like the ordered streams of the causal LM, and each accumulation chunk carries its
memory `cat(mem, h[:, :reuse_len])[-mem_len:]` to the next step (the model computes it).
"""

from __future__ import annotations

import torch

from ..data.plm_layout import NUM_SPECIAL_TOKENS
from ..data.plm_rows import PLMRowLayout
from ..data.plm_sampling import PLMCollator, PLMSamplingConfig
from ..evaluation.stream_scoring import perplexity, recurrence_settings

SPECIAL = {"sep_token": "<sep>", "cls_token": "<cls>"}


def plm_settings(args) -> dict:
    """reuse_len (default tgt_len // 2), num_predict (default ~ tgt_len / 6, at least 1 per half), perm_size."""
    seq_len = args.tgt_len
    reuse_len = args.reuse_len if args.reuse_len is not None else seq_len // 2
    num_predict = args.num_predict if args.num_predict is not None else max(2, round(seq_len / 6))
    perm_size = args.perm_size if args.perm_size is not None else reuse_len
    if seq_len - reuse_len < NUM_SPECIAL_TOKENS + 2:
        raise ValueError(f"tgt_len={seq_len} with reuse_len={reuse_len} leaves no room for A <sep> B <sep> <cls>; "
                         f"expected tgt_len - reuse_len >= {NUM_SPECIAL_TOKENS + 2}")
    return dict(seq_len=seq_len, reuse_len=reuse_len, num_predict=num_predict, perm_size=perm_size)


def add_plm_tokens(tokenizer):
    """<sep> and <cls> (added when the tokenizer lacks them); returns (sep_id, cls_id)."""
    missing = {k: v for k, v in SPECIAL.items() if getattr(tokenizer, k, None) is None}
    if missing:
        tokenizer.add_special_tokens(missing)
    return tokenizer.sep_token_id, tokenizer.cls_token_id


def bidirectional_row_order(num_streams: int, groups: int) -> list[int]:
    """Row order of a bi_data batch split into `groups` consecutive parts (processes x accumulation chunks): the model
    reads the first half of whatever rows it is given with the forward position table and the second half with the
    backward one, so every part holds forward rows followed by the same rows read backwards (layout rows [B/2, B)).
    Example: 8 streams (forward 0-3, backward 4-7), 2 groups -> [0, 1, 4, 5, 2, 3, 6, 7]."""
    half = num_streams // 2
    if half % groups:
        raise ValueError(f"bi_data=True with train_batch_size={num_streams} cannot give each of the {groups} "
                         f"processes x gradient-accumulation chunks forward rows and their backward copies; expected "
                         f"train_batch_size / 2 = {half} to be a multiple of {groups}")
    size = half // groups
    return [row for g in range(groups) for start in (g * size, half + g * size) for row in range(start, start + size)]


class PLMStreams:
    """Permutation-LM batches of one process: step t -> rows [r·B/W, (r+1)·B/W) of the layout's step t (with bi_data,
    in `bidirectional_row_order`, `chunks` being the parts each process's rows are split into)."""

    def __init__(self, tokens, tokenizer, num_streams, settings, num_processes, process_index, seed,
                 max_steps: int | None = None, bi_data=False, chunks: int = 1):
        sep_id, cls_id = add_plm_tokens(tokenizer)
        self.sampling = PLMSamplingConfig(sep_id=sep_id, cls_id=cls_id, **settings)
        # Samples are laid out on demand (`PLMRowLayout`, equal to the eager `plm_layout`), reading windows of
        # `tokens`, which may be a memory-mapped token cache: nothing is materialised, and a sample depends only on
        # (seed, row, step), so a resumed run (with any --max_train_steps) reads the batches of the uninterrupted one.
        self.layout = PLMRowLayout(tokens, num_streams, settings["seq_len"], settings["reuse_len"], sep_id, cls_id,
                                   seed, eos_id=tokenizer.eos_token_id, bi_data=bi_data)
        self.collator = PLMCollator(self.sampling, seed=seed)
        self.num_streams = num_streams
        self.steps_per_epoch = self.layout.num_steps if max_steps is None else min(self.layout.num_steps, max_steps)
        share = num_streams // num_processes
        order = bidirectional_row_order(num_streams, num_processes * chunks) if bi_data else range(num_streams)
        self.rows = list(order[process_index * share : (process_index + 1) * share])

    def __len__(self) -> int:
        """Steps per epoch."""
        return self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Targets and permutations are drawn afresh every epoch (as the original's online parser)."""
        self.collator.set_epoch(epoch)

    def batch(self, index: int) -> dict:
        first = index * self.num_streams  # example ids are step-major, as in `build_plm_dataset`
        return self.collator([{**self.layout.sample(row, index), "example_id": first + row} for row in self.rows])

    def __iter__(self):
        for index in range(self.steps_per_epoch):
            yield self.batch(index)


def plm_step(model, batch: dict, mems):
    """Summed cross-entropy over real predictions, their number, the new memory (from the reuse part)."""
    out = model(input_ids=batch["input_ids"], perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"],
                token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"], mems=mems,
                labels=batch["labels"], target_mask=batch["target_mask"])
    return out.losses.float().sum(), batch["target_mask"].sum(), out.mems


def plm_target_count(batch) -> int:
    return int(batch["target_mask"].sum())


@torch.no_grad()
def plm_evaluate(model, config, data, args, device, max_segments, reduce) -> dict:
    """Permutation-LM NLL per predicted token on the validation layout (fixed samples), memory carried."""
    was_training = model.training
    model.eval()
    nll = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    mems = None
    with recurrence_settings(config, args.eval_mem_len, args.eval_clamp_len, args.eval_same_length):
        for index, batch in enumerate(data.validation_batches(device)):
            if max_segments is not None and index >= max_segments:
                break
            loss_sum, targets, mems = plm_step(model, batch, mems)
            nll += loss_sum.double()
            count += targets.double()
    model.train(was_training)
    totals = torch.stack([nll, count])
    if reduce is not None:
        totals = reduce(totals)
    nll, count = float(totals[0]), int(round(float(totals[1])))
    return {"eval_loss": nll / max(count, 1), "perplexity": perplexity(nll, count), "eval_tokens": count}


def plm_model_class():
    from ..modeling_permutation_lm import TransformerXLForPermutationLM

    return TransformerXLForPermutationLM


def plm_config_overrides(args) -> dict:
    """A permutation LM uses one embedding tied to its output layer (no adaptive softmax) and bidirectional
    relative attention."""
    return dict(adaptive=False, cutoffs=[], tie_projs=[False], attn_type="bi", reuse_len=plm_settings(args)["reuse_len"],
                bi_data=args.bi_data)


def plm_data_from_tokens(tokenizer, train_ids, valid_ids, args, *, num_streams: int, num_processes: int = 1,
                         process_index: int = 0, info: dict | None = None):
    """PretrainData of permutation-LM samples: training rows laid out for max_train_steps steps, validation samples
    (fixed) from the whole split; `--max_eval_segments` caps only the evaluations during training."""
    from .data import PretrainData

    settings = plm_settings(args)
    train = PLMStreams(train_ids, tokenizer, num_streams, settings, num_processes, process_index, args.seed,
                       args.max_train_steps, args.bi_data, chunks=args.gradient_accumulation_steps)
    validation = PLMStreams(valid_ids, tokenizer, num_streams, settings, num_processes, process_index, args.seed + 1,
                            None, args.bi_data)
    facts = {"train_tokens": len(train_ids), "eval_tokens": len(valid_ids), **(info or {})}
    return PretrainData(tokenizer, train, validation, facts)
