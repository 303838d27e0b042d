"""`generate()` with the memory as the cache: the pieces of transformers' `GenerationMixin` that a memory of fixed
length changes. transformers carries a key/value cache that grows with every token; Transformer-XL carries `mems`
(n_layer tensors [B, M, d], M <= mem_len), which `update_memory` keeps at a fixed length.

- `_update_model_kwargs_for_generation`: the step's `mems` go back in as `mems` (not transformers' cache names).
- `prepare_inputs_for_generation`: once the memory holds the sequence only the newest token is fed; the attention
  mask is cut to the memory's tokens plus the fed ones.
- `_expand_inputs_for_generation`: a caller's `mems` repeated for `num_beams` / `num_return_sequences`.
- `_reorder_cache`: beam search reorders the memory rows (and the keys and values kept for them).
- `_sample`, `_beam_search`: greedy decoding, top-k sampling and beam search skip the adaptive softmax's tail
  clusters that cannot hold one of a row's k best tokens (`tokens_read`).
After the prompt's forward, the memory becomes a `static_decoding.DecodeState` (ring buffers of `mem_len` slots):
every later step has the same shapes, and runs as plain ops on them (`static_decoding = "eager"`, the default), compiled
(`"compiled"`: `torch.compile`, on CUDA with CUDA graphs) or not at all (None: every step is the backbone's forward).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import GenerationMixin
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from .inference_cache import enabled as cache_enabled
from .kernel_registry import kernel
from .static_decoding import DecodeState


def tokens_read(logits_processor, do_sample: bool, kept: int = 1) -> tuple[int, float] | None:
    """(k, penalty) when the tokens chosen from each row's scores depend only on its k most likely tokens, whatever
    the rest are, provided that every token's score s stays at least min(penalty * s, s / penalty) through the
    processors. The processors up to a top-k filter may only divide by a temperature (order-preserving) or apply a
    repetition penalty >= 1 (which lowers the scores of some tokens by that factor; penalties multiply), and every
    token below the k-th is then -inf; without sampling the step itself keeps the `kept` best (greedy decoding 1,
    beam search (1 + end-of-sequence ids, at least 2) x beams) after those processors. None when a processor may
    raise or reorder scores otherwise (a penalty below 1, bad words, ...) or nothing filters a sample (sampling from
    the whole distribution)."""
    penalty = 1.0
    for processor in logits_processor or ():
        if isinstance(processor, TopKLogitsWarper):
            return processor.top_k, penalty
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and processor.penalty >= 1:
            penalty *= processor.penalty
        elif not isinstance(processor, TemperatureLogitsWarper):
            return None
    return None if do_sample else (kept, penalty)


class MemoryGenerationMixin(GenerationMixin):
    """`GenerationMixin` for a causal LM whose forward takes and returns `mems` (the head holds the backbone as
    `self.transformer` and the adaptive softmax as `self.lm_head`)."""

    static_decoding: str | None = "eager"  # "eager", "compiled" or None: how generation runs its one-token steps
    static_decoding_options: dict = {}  # torch.compile's options for "compiled" (default: CUDA graphs on CUDA)
    skip_unread_tails: bool = True  # False: every step computes every log-probability (`_skipping_tails`)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # memory is a tuple of per-layer tensors, not a key/value cache

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        """`generate` carries our memory under `mems` (one of the state names transformers' beam search reorders
        through `_reorder_cache`). Set here because transformers moves the state under a name of its own that
        changed between releases: up to 5.23 `past_key_values`, read from an output's `mems`; from 5.24 `cache`,
        read only from an output field of that name, so the memory was dropped and every step re-read the whole
        sequence."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        for name in ("past_key_values", "cache"):
            if name in model_kwargs and model_kwargs[name] is outputs.mems:
                del model_kwargs[name]
        if model_kwargs.get("use_cache") is False:  # no state carried: every step reads the whole sequence again
            return model_kwargs  # (after the caller's `mems`, if any)
        model_kwargs["mems"] = self._decode_state(outputs.mems, model_kwargs)
        model_kwargs["mems_hold_input"] = True  # every token but the newest is in the memory now
        return model_kwargs

    def _decode_state(self, mems, model_kwargs: dict):
        """`mems` as the `DecodeState` the next steps advance in place, where static decoding applies: a memory of
        fixed length, no attentions or hidden states asked for; else `mems` as they are."""
        if isinstance(mems, DecodeState) or mems is None or self.static_decoding is None or self.training:
            return mems
        if model_kwargs.get("output_attentions") or model_kwargs.get("output_hidden_states"):
            return mems
        real = None
        mask = model_kwargs.get("attention_mask")
        if mask is not None:  # the memory's positions among [the caller's memory; the prompt] (its newest token aside)
            mask = mask[:, :-1]
            missing = mems[0].size(1) - mask.size(1)
            if missing > 0:  # the caller's memory came before the prompt: real tokens
                mask = torch.cat([mask.new_ones(mask.size(0), missing), mask], dim=1)
            real = mask[:, mask.size(1) - mems[0].size(1):]
        if self.static_decoding != "compiled":
            return DecodeState.from_mems(self.transformer, mems, real)
        return self._compiled_decode_state(mems, real)

    def _compiled_decode_state(self, mems, real) -> DecodeState:
        """The model keeps the state of its last compiled generation and loads the new memory into its buffers when
        the rows, device and dtype match: the compiled step (on CUDA a CUDA graph of those buffers' addresses) is then
        captured once for every `generate` call, as transformers keeps its static cache. Else a new state is built and
        its step compiled. (So two `generate` calls of one model must not run at once with "compiled".)"""
        options = {"mode": "reduce-overhead"} if self.device.type == "cuda" else {}  # CUDA graphs: captured once
        options.update(self.static_decoding_options)
        kept_options, state = getattr(self, "_compiled_decoding", (None, None))  # a plain attribute: not saved
        if state is not None and kept_options == options and state.fits(self.transformer, mems):
            return state.load_(mems, real)
        state = DecodeState.from_mems(self.transformer, mems, real)
        state.compiled_step = torch.compile(state._step, fullgraph=True, **options)
        self._compiled_decoding = (options, state)
        return state

    def prepare_inputs_for_generation(self, input_ids, mems=None, attention_mask=None, mems_hold_input=False,
                                      **kwargs):
        """Once the memory holds the sequence (`mems_hold_input`, set by `_update_model_kwargs_for_generation` from
        the second step on) only the newest token is fed; at the first step the whole prompt is, after the caller's
        `mems` if any. The attention mask (which `generate` extends by one real token per step) is cut to the
        memory's tokens plus the fed ones, so that padding stays hidden once it is in memory."""
        if isinstance(mems, DecodeState):  # the state tracks its own padding
            return {"input_ids": input_ids[:, -1:], "mems": mems}
        if mems is not None and mems_hold_input:
            input_ids = input_ids[:, -1:]
        inputs = {"input_ids": input_ids, "mems": mems}
        if attention_mask is not None:
            mlen = 0 if mems is None else mems[0].size(1)
            missing = mlen + input_ids.size(1) - attention_mask.size(1)
            if missing > 0 and mems_hold_input:  # the caller's memory came before the prompt the mask covers: real
                ones = attention_mask.new_ones(attention_mask.size(0), missing)
                attention_mask = torch.cat([ones, attention_mask], 1)
            inputs["attention_mask"] = attention_mask[:, -(mlen + input_ids.size(1)):]
        for name in ("logits_to_keep", "output_attentions", "output_hidden_states", "use_cache"):
            if kwargs.get(name) is not None:
                inputs[name] = kwargs[name]
        return inputs

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **model_kwargs):
        """transformers' greedy/sampling loop, inside `_skipping_tails`' context (greedy: the best token alone)."""
        with self._skipping_tails(logits_processor, generation_config, kept=1):
            return super()._sample(input_ids, logits_processor, stopping_criteria, generation_config, *args,
                                   **model_kwargs)

    def _beam_search(self, input_ids, logits_processor, stopping_criteria, generation_config, *args, **model_kwargs):
        """transformers' beam search, inside `_skipping_tails`' context: a step keeps each row's (1 + end-of-sequence
        ids, at least 2) x beams best continuations, as transformers' `beams_to_keep`; a skipped tail's probability is
        spread over its tokens, so that the log-softmax beam search takes of the scores is unchanged."""
        eos = generation_config._eos_token_tensor
        kept = max(2, 1 + (0 if eos is None else eos.shape[0])) * generation_config.num_beams
        with self._skipping_tails(logits_processor, generation_config, kept, spread=True):
            return super()._beam_search(input_ids, logits_processor, stopping_criteria, generation_config, *args,
                                        **model_kwargs)

    def _skipping_tails(self, logits_processor, generation_config, kept: int, spread: bool = False):
        """Where the tokens chosen depend only on each row's k most likely tokens (`tokens_read`) and no score is
        returned, the context of the "greedy_decoding" (k = 1) or "top_k_decoding" kernel: the log-probabilities of
        tail clusters that cannot hold one of those k tokens are not computed, which gives the same tokens. Else, or
        with `skip_unread_tails` False, no context."""
        scores_returned = generation_config.return_dict_in_generate and (
            generation_config.output_scores or generation_config.output_logits)
        read = tokens_read(logits_processor, generation_config.do_sample, kept) if self.skip_unread_tails else None
        if read is None or scores_returned or read[0] >= self.lm_head.shortlist:
            return contextlib.nullcontext()
        k, penalty = read
        if k == 1 and not spread and (greedy := kernel("greedy_decoding", self.device.type)) is not None:
            return greedy(self.lm_head, penalty)
        if k > 1 and self.lm_head.n_clusters and (top_k := kernel("top_k_decoding", self.device.type)):
            return top_k(self.lm_head, k, penalty, spread)
        return contextlib.nullcontext()

    def _expand_inputs_for_generation(self, expand_size: int = 1, is_encoder_decoder: bool = False, input_ids=None,
                                      **model_kwargs):
        """As in transformers, and the caller's `mems` (a tuple, which transformers leaves alone) repeated row by row
        too, for `num_beams` / `num_return_sequences` > 1."""
        mems = model_kwargs.pop("mems", None)
        input_ids, model_kwargs = super()._expand_inputs_for_generation(expand_size, is_encoder_decoder, input_ids,
                                                                        **model_kwargs)
        if mems is not None:
            model_kwargs["mems"] = tuple(m.repeat_interleave(expand_size, dim=0) for m in mems)
        return input_ids, model_kwargs

    def _reorder_cache(self, mems, beam_idx):
        """Beam search: memory rows follow their beams, and so do the keys and values each layer keeps for its memory
        (`inference_cache`; without them every step would project the whole memory again)."""
        if mems is None:
            return None
        if isinstance(mems, DecodeState):
            return mems.reorder_(beam_idx)
        reordered = tuple(m.index_select(0, beam_idx.to(m.device)) for m in mems)
        if cache_enabled():
            for layer, old, new in zip(self.transformer.layers, mems, reordered):
                layer.attn.reorder_memory_projection(old, new, beam_idx.to(old.device))
        return reordered
