"""`build_data(args, ...)`: a pretraining run's arguments turned into the explicit fields of the data pipeline
(`corpus_source`, `tokenizer_recipe`, `plm_rows` make the `modeling_xl.data.sources` dataclasses), and its one call,
`modeling_xl.data.pretraining.build_pretraining_data`."""

from __future__ import annotations

from ..configuration_transformer_xl import PRESETS
from ..data.plm_layout import NUM_SPECIAL_TOKENS
from ..data.pretrain_data import PretrainData
from ..data.sources import CorpusSource, PLMRows, StreamLayout, TokenizerRecipe


def corpus_source(args) -> CorpusSource:
    return CorpusSource(train_file=args.train_file, dataset_name=args.dataset_name,
                        dataset_config_name=args.dataset_config_name, validation_file=args.validation_file,
                        text_column=args.text_column)


def tokenizer_recipe(args) -> TokenizerRecipe:
    """--tokenizer_name, else the tokenizer saved with --model_name_or_path, else one trained on the training split
    (--tokenizer_type, of --tokenizer_vocab_size or the preset's vocabulary size)."""
    return TokenizerRecipe(kind=args.tokenizer_type,
                           vocab_size=args.tokenizer_vocab_size or PRESETS[args.preset]["vocab_size"],
                           saved=args.tokenizer_name or args.model_name_or_path,
                           saved_argument="tokenizer_name" if args.tokenizer_name else "model_name_or_path",
                           plm_tokens=args.objective == "plm")


def plm_rows(args) -> PLMRows:
    """The permutation-LM sample layout of a run: reuse_len (default tgt_len // 2), num_predict (default ~ tgt_len / 6,
    at least 1 per half), perm_size (default reuse_len), spans of at most max_gram tokens, drawn from `--seed`, laid
    out for `--max_train_steps`."""
    seq_len = args.tgt_len
    reuse_len = args.reuse_len if args.reuse_len is not None else seq_len // 2
    num_predict = args.num_predict if args.num_predict is not None else max(2, round(seq_len / 6))
    perm_size = args.perm_size if args.perm_size is not None else reuse_len
    if seq_len - reuse_len < NUM_SPECIAL_TOKENS + 2:
        raise ValueError(f"tgt_len={seq_len} with reuse_len={reuse_len} leaves no room for A <sep> B <sep> <cls>; "
                         f"expected tgt_len - reuse_len >= {NUM_SPECIAL_TOKENS + 2}")
    return PLMRows(seq_len=seq_len, reuse_len=reuse_len, num_predict=num_predict, perm_size=perm_size, seed=args.seed,
                   max_steps=args.max_train_steps, bi_data=args.bi_data, chunks=args.gradient_accumulation_steps,
                   max_gram=args.max_gram)


def build_data(args, process_index: int, num_processes: int, per_process: int) -> PretrainData:
    """Tokenizer and rows of this process (`per_process` streams of each process's share)."""
    from ..data.pretraining import build_pretraining_data

    corpus, recipe = corpus_source(args), tokenizer_recipe(args)
    layout = StreamLayout(num_streams=per_process * num_processes, tgt_len=args.tgt_len,
                          eval_tgt_len=args.eval_tgt_len, num_processes=num_processes, process_index=process_index)
    plm = plm_rows(args) if args.objective == "plm" else None
    return build_pretraining_data(corpus, recipe, layout, plm=plm, cache_dir=args.token_cache_dir,
                                  streaming=args.streaming, num_train_tokens=args.num_train_tokens,
                                  num_proc=args.preprocessing_num_workers, show_progress=not args.disable_tqdm,
                                  char_level=args.char_level)


def token_cache(args):
    """The token cache entry of a run's corpus and tokenizer in `--token_cache_dir`, built when absent (without
    training: e.g. to build it once before several runs)."""
    from ..data.cached_corpus import cached_tokens

    return cached_tokens(corpus_source(args), tokenizer_recipe(args), args.token_cache_dir,
                         num_proc=args.preprocessing_num_workers, show_progress=not args.disable_tqdm)
