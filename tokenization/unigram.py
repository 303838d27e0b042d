"""XLNet-style Unigram (SentencePiece) tokenizer: `A <sep> B <sep> <cls>`, left padding, segment ids A=0, B=1, CLS=2.

Special tokens and ids follow XLNet's vocabulary (<unk>=0, <s>=1, </s>=2, <cls>=3, <sep>=4, <pad>=5, <mask>=6,
<eod>=7, <eop>=8). Padding goes on the left so that <cls>, whose hidden state summarises the sequence, is always
the last position. Padded positions get segment id 0 (transformers' default, which survives save/load; XLNet's
own tokenizer uses 3) - they are masked out by `attention_mask`, so the value never reaches the model's output.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ._wrapping import wrap_tokenizer
from .arrow_words import check_lines

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>")


def train_unigram_tokenizer(lines: Iterable[str], *, vocab_size: int = 8000, lowercase: bool = False,
                            max_piece_length: int = 16):
    """Train a Unigram model on `lines` and return the XLNet-formatted fast tokenizer."""
    check_lines(lines)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size}; expected more than the {len(SPECIAL_TOKENS)} special tokens")
    tokenizer = Tokenizer(models.Unigram())
    # XLNet's `preprocess_text`: whitespace runs (tabs too) become one space and the ends are stripped, so "a  b"
    # reads as "a b" rather than gaining a lone "▁" piece; then `` and '' become ".
    steps = [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(),
             normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps.append(normalizers.Lowercase())
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token="<unk>",
                                      max_piece_length=max_piece_length, show_progress=False)
    try:
        tokenizer.train_from_iterator(_non_empty(lines), trainer)
    except Exception as error:  # the Rust trainer raises a bare Exception
        if "not large enough to contain all chars" not in str(error):
            raise
        if isinstance(lines, (list, tuple)):
            characters = len({ch for line in lines for ch in tokenizer.normalizer.normalize_str(line)})
            need = f"at least {characters} (its distinct characters after normalisation)"
        else:
            need = "at least the corpus's number of distinct characters"
        raise ValueError(f"vocab_size={vocab_size} is too small for this corpus: a Unigram vocabulary holds every "
                         f"character of the corpus (the {len(SPECIAL_TOKENS)} special tokens come on top); expected "
                         f"{need} (--tokenizer_vocab_size for scripts/pretrain.py)") from None
    if tokenizer.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("the corpus has no text; expected at least one non-empty line")
    return xlnet_format(tokenizer)


def xlnet_format(tokenizer: Tokenizer):
    """Add the `A <sep> B <sep> <cls>` template and wrap with XLNet's special tokens and left padding."""
    sep, cls = tokenizer.token_to_id("<sep>"), tokenizer.token_to_id("<cls>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)])
    wrapped = wrap_tokenizer(tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", cls_token="<cls>",
                             sep_token="<sep>", pad_token="<pad>", mask_token="<mask>",
                             additional_special_tokens=["<eod>", "<eop>"], padding_side="left",
                             model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    return wrapped


def _non_empty(lines):
    for line in lines:
        if line and not line.isspace():
            yield line
