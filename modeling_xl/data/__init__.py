"""Data pipelines (not imported by the model files, so `trust_remote_code` never needs them).

- `corpora.load_corpus(source, config)`: Hub dataset, local text/json/csv/parquet files, or the built-in offline corpus.
- `tokenize.tokenize_corpus(corpus, tokenizer)`: batched, multi-process, cached -> {split: flat token ids}.
- `streams.OrderedStreams` / `EvalStreams` / `StreamingOrderedStreams`: ordered batches for recurrence.
- `token_cache`: a corpus tokenized once into flat token files, memory-mapped (crash-safe build, fingerprint keys).
- `plm_sampling`, `plm_layout`: permutation-LM data; `plm_rows`: the same layout, one sample at a time, read lazily.
Submodules are imported explicitly (`from modeling_xl.data.streams import OrderedStreams`) so that importing one does
not pull in `datasets`.
"""
