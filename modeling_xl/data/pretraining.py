"""The data of a pretraining run, built from explicit fields (`sources`): `build_pretraining_data(corpus, tokenizer,
layout, ...)` is the one entry point. Where the tokens come from: the corpus in memory (`corpora.load_splits` ->
`tokenizer_choice.load_tokenizer` -> `tokenize.tokenize_corpus`), the memory-mapped token cache (`cached_corpus`,
a cache folder given) or a `datasets` stream (`streaming_corpus`); then this process's rows of them: ordered streams
(`streams`) for the causal LM, permutation-LM samples (`plm_streams`) for the permutation LM.

Every failure here (missing file or dataset, undecodable text, empty corpus, too few tokens for the streams) happens
before the model is built, so bad input costs seconds, not a training run.
"""

from __future__ import annotations

from .pretrain_data import PretrainData, data_from_tokens, describe
from .sources import CorpusSource, PLMRows, StreamLayout, TokenizerRecipe
from .tokenizer_choice import load_tokenizer


def build_pretraining_data(corpus: CorpusSource, tokenizer: TokenizerRecipe, layout: StreamLayout, *,
                           plm: PLMRows | None = None, cache_dir: str | None = None, streaming: bool = False,
                           num_train_tokens: int | None = None, num_proc: int | None = None,
                           show_progress: bool = True, char_level: bool | None = None) -> PretrainData:
    """The tokenizer and this process's training and validation rows of `corpus`, read by `tokenizer`, cut by
    `layout`: ordered streams, or permutation-LM samples laid out by `plm`. The tokens come from a `datasets` stream
    (`streaming`, causal LM only; `num_train_tokens` saves its counting pass), from the token cache in `cache_dir`
    (built once, memory-mapped by every process and later run), or from the corpus tokenized in memory with
    `num_proc` processes. `char_level` overrides what the card says of the tokenizer. With several processes the
    main one loads and tokenizes first (it fills the `datasets` cache); the others then read it."""
    from accelerate import PartialState

    if streaming:
        from .streaming_corpus import build_streaming_data

        return build_streaming_data(corpus, tokenizer, layout, num_train_tokens=num_train_tokens,
                                    char_level=char_level)
    with PartialState().main_process_first():
        if cache_dir is not None:
            from .cached_corpus import cached_tokens

            cache = cached_tokens(corpus, tokenizer, cache_dir, num_proc=num_proc, show_progress=show_progress)
            loaded, ids = cache.tokenizer(), {split: cache.tokens(split) for split in ("train", "validation")}
        else:
            from .corpora import load_splits
            from .tokenize import tokenize_corpus

            splits, _ = load_splits(corpus)
            loaded = load_tokenizer(tokenizer, splits["train"].data.column(corpus.text_column))
            ids = tokenize_corpus(splits, loaded, text_column=corpus.text_column, num_proc=num_proc)
    info = describe(corpus, tokenizer, loaded, ids, char_level)
    if plm is not None:
        return plm_data_from_tokens(loaded, ids["train"], ids["validation"], plm, layout, info)
    return data_from_tokens(loaded, ids["train"], ids["validation"], layout, info)


def plm_data_from_tokens(tokenizer, train_ids, valid_ids, rows: PLMRows, layout: StreamLayout,
                         info: dict | None = None) -> PretrainData:
    """PretrainData of permutation-LM samples: training rows laid out for `rows.max_steps` steps, validation samples
    (fixed, drawn from `rows.seed + 1`) from the whole split."""
    from .plm_streams import PLMStreams

    where = dict(num_processes=layout.num_processes, process_index=layout.process_index, bi_data=rows.bi_data)
    train = PLMStreams(train_ids, tokenizer, layout.num_streams, rows.sampling(), seed=rows.seed,
                       max_steps=rows.max_steps, chunks=rows.chunks, **where)
    validation = PLMStreams(valid_ids, tokenizer, layout.num_streams, rows.sampling(), seed=rows.seed + 1, **where)
    facts = {"train_tokens": len(train_ids), "eval_tokens": len(valid_ids), **(info or {})}
    return PretrainData(tokenizer, train, validation, facts)
