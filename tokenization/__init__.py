"""Fast tokenizers (the `tokenizers` library) saved as folders that `AutoTokenizer.from_pretrained(dir)` loads alone.

- `train_word_level_tokenizer` / `word_level_tokenizer`: Transformer-XL word level (WikiText), `<eos>` per line.
- `train_char_level_tokenizer`, `byte_level_tokenizer`: enwik8-style symbols, bits-per-character evaluation.
- `train_unigram_tokenizer`: XLNet-style Unigram, `A <sep> B <sep> <cls>`, left padding.
- `tokenizer_from_vocab`: a plain vocab list or a legacy Transformer-XL vocabulary (parsed, never unpickled).
- `check_vocab_matches(tokenizer, config)`: ValueError when the model's vocab_size does not fit the tokenizer.
- `declare_task_tokens(tokenizer)`: `<eos>` also as pad, separator and summary token (saved model folders).
"""

from ._wrapping import check_vocab_matches, declare_task_tokens
from .arrow_words import WordLevelPlan, encode_lines
from .char_level import byte_level_tokenizer, char_level_tokenizer, train_char_level_tokenizer
from .unigram import SPECIAL_TOKENS as XLNET_SPECIAL_TOKENS
from .unigram import train_unigram_tokenizer
from .vocab_import import read_legacy_vocab_pkl, read_vocab_list, tokenizer_from_vocab
from .word_level import WordCounter, build_vocab, count_words, train_word_level_tokenizer, word_level_tokenizer

__all__ = [
    "XLNET_SPECIAL_TOKENS", "WordCounter", "WordLevelPlan",
    "build_vocab", "byte_level_tokenizer", "char_level_tokenizer",
    "check_vocab_matches", "count_words", "declare_task_tokens", "encode_lines", "read_legacy_vocab_pkl", "read_vocab_list",
    "tokenizer_from_vocab", "train_char_level_tokenizer", "train_unigram_tokenizer", "train_word_level_tokenizer",
    "word_level_tokenizer",
]
