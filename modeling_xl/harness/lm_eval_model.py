"""The lm-evaluation-harness model `transformer-xl`: a causal Transformer-XL folder scored segment by segment with
memory (Dai et al. 2019, Sec. 3.2), as `scripts/evaluate_lm.py` scores a stream.

lm_eval's `hf` model reads a document in windows of its `max_length` (2048 for these folders), each a fresh forward
without the text before it. Here a document is read `tgt_len` tokens at a time; each segment attends to the `mem_len`
states the previous segments left, so every token is scored once, with up to `mem_len` tokens of context before its
segment, at a cost linear in the document's length:

- `loglikelihood_rolling` (perplexity tasks): the tokens of the document after lm_eval's prefix token (`<eos>` here,
  as for `hf`), its end-of-line token included (the corpus pipeline's encoding of one line), summed;
- `loglikelihood` (multiple choice, ...): context and continuation, encoded without special tokens, read as one row,
  so a context longer than a segment fills the memory instead of being cut; the continuation's tokens summed, and
  whether each is the most likely one. A row that fits in one segment is exactly `hf`'s forward (no memory yet;
  `hf` with `add_bos_token=False`, which encodes pairs as here);
- `generate_until`: the context read into the memory, then `generate` carries it.

Model args (`--model_args pretrained=FOLDER,tgt_len=64,mem_len=640`): `pretrained`, `tokenizer` (default: the
folder's), `tgt_len`, `mem_len`, `clamp_len`, `same_length` (default: the folder's evaluation settings,
`settings.evaluation_settings`), `dtype`; lm_eval's `batch_size` (documents read side by side) and `device`
(`max_batch_size` is accepted and unused: there is no automatic batch size).
"""

from __future__ import annotations

import logging

import lm_eval.models  # noqa: F401  (lm_eval's own models first: from 0.4.10 its registry loads them only while empty)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from ..evaluation.stream_scoring import recurrence_settings
from .settings import MODEL_NAME, evaluation_settings

logger = logging.getLogger(__name__)


@register_model(MODEL_NAME)
class TransformerXLLM(TemplateLM):
    """lm_eval's model interface over a causal Transformer-XL folder, with memory (module docstring)."""

    def __init__(self, pretrained: str, tokenizer: str | None = None, tgt_len: int | None = None,
                 mem_len: int | None = None, clamp_len: int | None = None, same_length: bool | None = None,
                 batch_size: int | str = 1, max_batch_size: int | None = None, device: str | None = None,
                 dtype: str = "float32"):
        super().__init__()
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        import modeling_xl  # noqa: F401  (registers the Auto classes)

        self.batch_size_per_device = _batch_size(batch_size)
        if not hasattr(torch, str(dtype)) or not isinstance(getattr(torch, str(dtype)), torch.dtype):
            raise ValueError(f"dtype={dtype!r} is invalid; expected a torch dtype name such as float32 or bfloat16")
        self._device = torch.device(device or "cpu")
        if self._device.type == "cuda" and not torch.cuda.is_available():  # lm_eval's default device is cuda:0
            logger.info("device=%r: CUDA is not available, using the CPU (as lm_eval's hf model)", device)
            self._device = torch.device("cpu")
        config = AutoConfig.from_pretrained(pretrained)
        if getattr(config, "attn_type", "uni") != "uni":
            raise ValueError(f"pretrained={pretrained!r} is a permutation LM (attn_type {config.attn_type!r}); "
                             "expected a causal LM (attn_type 'uni'): left-to-right likelihoods are not defined for "
                             "a bidirectional model")
        self.model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=getattr(torch, dtype)).to(self._device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or pretrained)
        self.settings = evaluation_settings(pretrained, self.model.config, tgt_len=tgt_len, mem_len=mem_len,
                                            clamp_len=clamp_len, same_length=same_length)
        logger.info("%s: tgt_len %d, mem_len %d, clamp_len %d, same_length %s (from %s)", pretrained,
                    *(self.settings[name] for name in ("tgt_len", "mem_len", "clamp_len", "same_length")),
                    self.settings["source"])

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the start of a document are conditioned on: `<bos>` if the tokenizer has one,
        else `<eos>` (as lm_eval's `hf` model)."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The tokenizer's ids; with its special tokens (None or True) as the corpus pipeline encodes a line
        (`tokenization.encode_lines`: the word-level tokenizer's `<eos>` after the text, the Unigram tokenizer's
        `</s>` instead of its `<sep> <cls>` classification layout)."""
        if add_special_tokens is False:
            return self.tokenizer.encode(string, add_special_tokens=False)
        from tokenization import encode_lines

        return encode_lines([string], self.tokenizer)[0].tolist()

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation ids without special tokens: a context must not end with the end-of-line token
        the text does not have (with it, lm_eval's split of `context + continuation` would lose the continuation's
        first token). As lm_eval's `hf` model with `add_bos_token=False`."""
        spaces = len(context) - len(context.rstrip())
        if spaces:  # lm_eval's convention: the space belongs to the continuation
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tok_encode(context + continuation, add_special_tokens=False)
        context_ids = self.tok_encode(context, add_special_tokens=False)
        return context_ids, whole[len(context_ids):]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """log P(document) for each request's `(string,)`: every token after the prefix token (the document's end
        of line included), read with memory."""
        rows = [[self.prefix_token_id, *self.tok_encode(string)] for (string,) in (r.args for r in requests)]
        scores = self.score_rows(rows, [1] * len(rows), greedy=False, disable_tqdm=disable_tqdm)
        for request, (logprob, _) in zip(requests, scores):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, logprob)
        return [logprob for logprob, _ in scores]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log P(continuation | context), greedy) for `((context, continuation), context ids, continuation ids)`."""
        rows = [list(context) + list(continuation) for _, context, continuation in requests]
        scores = self.score_rows(rows, [len(context) for _, context, _ in requests], greedy=True,
                                 disable_tqdm=disable_tqdm)
        for (pair, _, _), score in zip(requests, scores):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, score)
        return scores

    def score_rows(self, rows: list[list[int]], first: list[int], greedy: bool,
                   disable_tqdm: bool = True) -> list[tuple[float, bool]]:
        """For each token list `rows[i]`, the summed log-probability of its tokens from position `first[i]` on, each
        predicted from the tokens before it (read `tgt_len` at a time with `mem_len` of memory), and whether every
        one of them is the most likely token (computed only with `greedy`). Rows are read `batch_size` at a time,
        longest first."""
        for row, start in zip(rows, first):
            if not 1 <= start < len(row):
                raise ValueError(f"a request has {len(row)} tokens and scores from position {start}; expected at "
                                 "least one token before the first one scored and one to score")
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        size = self.batch_size_per_device
        results: list[tuple[float, bool] | None] = [None] * len(rows)
        settings = (self.settings["mem_len"], self.settings["clamp_len"], self.settings["same_length"])
        with torch.no_grad(), recurrence_settings(self.model.config, *settings):
            for start in tqdm(range(0, len(order), size), disable=disable_tqdm, desc="transformer-xl"):
                batch = order[start:start + size]
                for i, result in zip(batch, self._score_batch([rows[i] for i in batch], [first[i] for i in batch],
                                                              greedy)):
                    results[i] = result
        return results

    def _score_batch(self, rows, first, greedy: bool) -> list[tuple[float, bool]]:
        """`score_rows` of one batch: rows right-padded (a causal model's real positions never see the padding),
        targets -100 where not scored; segment by segment, the memory carried. A segment without targets only
        fills the memory (the backbone, no softmax)."""
        width = max(len(row) for row in rows) - 1
        inputs = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
        targets = torch.full((len(rows), width), -100, dtype=torch.long)
        for b, (row, start) in enumerate(zip(rows, first)):
            inputs[b, : len(row) - 1] = torch.tensor(row[:-1])
            targets[b, start - 1: len(row) - 1] = torch.tensor(row[start:])  # position t predicts row[t + 1]
        logprob = torch.zeros(len(rows), dtype=torch.float64)
        is_greedy = torch.ones(len(rows), dtype=torch.bool)
        mems, tgt_len = None, self.settings["tgt_len"]
        for begin in range(0, width, tgt_len):
            ids = inputs[:, begin:begin + tgt_len].to(self._device)
            labels = targets[:, begin:begin + tgt_len].to(self._device)
            scored = labels != -100
            if not scored.any():
                mems = self.model.transformer(input_ids=ids, mems=mems).mems
            elif greedy:
                out = self.model(input_ids=ids, mems=mems)  # logits: log-probabilities [B, T, V]
                picked = out.logits.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
                logprob += torch.where(scored, picked, 0.0).double().sum(1).cpu()
                is_greedy &= ((out.logits.argmax(-1) == labels) | ~scored).all(1).cpu()
                mems = out.mems
            else:
                out = self.model(input_ids=ids, mems=mems, next_token_labels=labels)  # losses: NLL, 0 where -100
                logprob -= out.losses.double().sum(1).cpu()
                mems = out.mems
        return [(float(value), bool(flag)) for value, flag in zip(logprob, is_greedy)]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """For each `(context, gen_kwargs)`: the context read into the memory (all but its last segment), then
        `generate` from its last segment (greedy unless `do_sample`), cut before the first `until` string."""
        results = []
        settings = (self.settings["mem_len"], self.settings["clamp_len"], self.settings["same_length"])
        for request in tqdm(requests, disable=disable_tqdm, desc="transformer-xl generate"):
            context, gen_kwargs = request.args
            kwargs = dict(gen_kwargs)
            until = kwargs.pop("until", None)
            until = [until] if isinstance(until, str) else list(until or [])
            until.append(self.tokenizer.decode([self.eot_token_id]))
            max_new_tokens = kwargs.pop("max_gen_toks", 256)
            if not kwargs.get("temperature", 0.0):
                kwargs.pop("temperature", None)
                kwargs["do_sample"] = False
            ids = self.tok_encode(context, add_special_tokens=False) or [self.prefix_token_id]
            with torch.no_grad(), recurrence_settings(self.model.config, *settings):
                prompt, mems = self._read_into_memory(ids)
                out = self.model.generate(prompt, mems=mems, max_new_tokens=max_new_tokens, **kwargs)
            text = self.tokenizer.decode(out[0, prompt.size(1):], skip_special_tokens=False)
            cuts = [text.index(stop) for stop in until if stop and stop in text]
            text = text[: min(cuts)] if cuts else text
            self.cache_hook.add_partial("generate_until", request.args, text)
            results.append(text)
        return results

    def _read_into_memory(self, ids: list[int]) -> tuple[torch.Tensor, tuple | None]:
        """(the last segment of `ids` as a [1, T] prompt, the memory the segments before it leave)."""
        tgt_len, mems = self.settings["tgt_len"], None
        last = (len(ids) - 1) // tgt_len * tgt_len
        for begin in range(0, last, tgt_len):
            segment = torch.tensor([ids[begin:begin + tgt_len]], device=self._device)
            mems = self.model.transformer(input_ids=segment, mems=mems).mems
        return torch.tensor([ids[last:]], device=self._device), mems


def _batch_size(value) -> int:
    """lm_eval's `--batch_size` as a positive integer ("auto" is not supported: rows are read side by side)."""
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if isinstance(value, bool) or size <= 0 or str(size) != str(value).strip():
        raise ValueError(f"batch_size={value!r} is invalid; expected a positive integer (the number of documents "
                         "read side by side; 'auto' is not supported by the transformer-xl model)")
    return size
