"""Evaluation of language models on token streams: stream perplexity and bits per character with the memory carried
across segments (`stream_scoring`, also what pretraining validates with), and the long-context evaluation behind
`scripts/evaluate_lm.py` (`long_context`: memory-length sweeps, the vanilla sliding-window baseline, the results' card
section)."""
