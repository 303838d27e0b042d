"""`build_data(args, ...)`: where a pretraining run's tokens come from — the corpus in memory (`corpus`), the
memory-mapped token cache (`cached_corpus`, `--token_cache_dir`) or a `datasets` stream (`streaming_corpus`,
`--streaming`) — and this process's rows of them (modeling_xl.data.streams, or training.plm).

Every failure here (missing file or dataset, undecodable text, empty corpus, too few tokens for the streams) happens
before the model is built, so bad input costs seconds, not a training run.
"""

from __future__ import annotations

from accelerate import PartialState

from .corpus import describe, load_splits, load_tokenizer
from .data import PretrainData, data_from_tokens


def build_data(args, process_index: int, num_processes: int, per_process: int) -> PretrainData:
    """Tokenizer and ordered streams of this process. The main process loads and tokenizes first (it fills the
    `datasets` cache); the others then read the cache."""
    if args.streaming:
        from .streaming_corpus import build_streaming_data

        return build_streaming_data(args, process_index, num_processes, per_process)
    with PartialState().main_process_first():
        if args.token_cache_dir is not None:  # tokenized once, memory-mapped by every process and later run
            from .cached_corpus import cached_tokens

            cache = cached_tokens(args)
            tokenizer, source = cache.tokenizer(), str(args.train_file or args.dataset_name)
            ids = {split: cache.tokens(split) for split in ("train", "validation")}
        else:
            corpus, source = load_splits(args)
            tokenizer = load_tokenizer(args, corpus)
            if args.objective == "plm":
                from .plm import add_plm_tokens

                add_plm_tokens(tokenizer)
            from ..data.tokenize import tokenize_corpus

            ids = tokenize_corpus(corpus, tokenizer, text_column=args.text_column,
                                  num_proc=args.preprocessing_num_workers)
    info = describe(args, source, tokenizer, ids)
    num_streams = per_process * num_processes
    if args.objective == "plm":
        from .plm import plm_data_from_tokens

        return plm_data_from_tokens(tokenizer, ids["train"], ids["validation"], args, num_streams=num_streams,
                                    num_processes=num_processes, process_index=process_index, info=info)
    return data_from_tokens(tokenizer, ids["train"], ids["validation"], num_streams=num_streams, tgt_len=args.tgt_len,
                            eval_tgt_len=args.eval_tgt_len, num_processes=num_processes, process_index=process_index,
                            info=info)
