"""Permutation-LM batches of one process (XLNet, Yang et al. 2019): samples laid out step-major from a token array
(`plm_rows.PLMRowLayout`), targets and permutations drawn by `plm_sampling.PLMCollator`. Batch t holds step t of
every row; process r takes rows [r·B/W, (r+1)·B/W) of each step, like the ordered streams of the causal LM."""

from __future__ import annotations

from .plm_rows import PLMRowLayout
from .plm_sampling import PLMCollator, PLMSamplingConfig
from .tokenizer_choice import add_plm_tokens


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
