"""The explicit fields a pretraining run's data is built from (`pretraining.build_pretraining_data`), so that no
module of the data pipeline reads a script's argument object: where the corpus is (`CorpusSource`), which tokenizer
reads it (`TokenizerRecipe`), how its token stream is cut into rows (`StreamLayout`) and, for the permutation LM, how
samples are laid out (`PLMRows`)."""

from __future__ import annotations

from dataclasses import dataclass

# <sep> and <cls>: the permutation LM's layout `reuse ++ A <sep> B <sep> <cls>` (added to a tokenizer that lacks them)
PLM_SPECIAL_TOKENS = {"sep_token": "<sep>", "cls_token": "<cls>"}


@dataclass(frozen=True)
class CorpusSource:
    """A local file or folder (`train_file`), or a dataset (`dataset_name`: a Hub id, or "builtin") with its
    `dataset_config_name`; an optional `validation_file` (else the corpus's validation split, or the training
    split's last rows); the `text_column`."""

    train_file: str | None = None
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    validation_file: str | None = None
    text_column: str = "text"

    @property
    def location(self) -> str:
        return self.train_file or self.dataset_name

    @property
    def argument(self) -> str:
        """The argument that names the corpus, for error messages."""
        return "train_file" if self.train_file else "dataset_name"


@dataclass(frozen=True)
class TokenizerRecipe:
    """A saved tokenizer (`saved`: a folder or Hub id, from the argument `saved_argument`), or one trained on the
    training split: `kind` "word", "unigram", "char" or "byte", of `vocab_size` symbols (word and unigram).
    `plm_tokens`: the permutation LM's <sep> and <cls> are added (a word-level vocabulary keeps room for them)."""

    kind: str = "word"
    vocab_size: int = 8000
    saved: str | None = None
    saved_argument: str = "tokenizer_name"
    plm_tokens: bool = False

    @property
    def word_vocabulary_size(self) -> int:
        """Symbols of a word-level vocabulary trained here: `vocab_size` less <sep> and <cls> when they are added."""
        return self.vocab_size - (len(PLM_SPECIAL_TOKENS) if self.plm_tokens else 0)


@dataclass(frozen=True)
class StreamLayout:
    """`num_streams` rows in all (over every process); segments of `tgt_len` tokens in training, `eval_tgt_len` in
    validation; this is process `process_index` of `num_processes`."""

    num_streams: int
    tgt_len: int
    eval_tgt_len: int
    num_processes: int = 1
    process_index: int = 0


@dataclass(frozen=True)
class PLMRows:
    """Permutation-LM samples: `seq_len` tokens (`reuse_len` of them the part the next step reuses as memory),
    `num_predict` targets in spans of at most `max_gram` tokens, permutations in blocks of `perm_size`; drawn from
    `seed`; laid out for `max_steps` steps; `bi_data`: half the rows read backwards; `chunks`: the parts (gradient
    accumulation) each process's rows are split into."""

    seq_len: int
    reuse_len: int
    num_predict: int
    perm_size: int
    seed: int
    max_steps: int | None = None
    bi_data: bool = False
    chunks: int = 1
    max_gram: int = 5

    def sampling(self) -> dict:
        return dict(seq_len=self.seq_len, reuse_len=self.reuse_len, num_predict=self.num_predict,
                    perm_size=self.perm_size, max_gram=self.max_gram)
