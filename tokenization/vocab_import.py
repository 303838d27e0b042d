"""Import an existing word vocabulary: a plain list, or a legacy Transformer-XL vocabulary, never by unpickling.

Formats:
- plain list / Transformer-XL `vocab.txt` / sym list: one symbol per line, first whitespace-separated field (a count
  may follow, as in the reference's `vocab_file`); line i is id i.
- legacy Hugging Face `vocab.pkl` (transformers <= 4.35 `TransfoXLTokenizer`, a pickle of the tokenizer's `__dict__`):
  read by `read_legacy_vocab_pkl`, a restricted parser that walks the pickle opcodes with `pickletools.genops` and
  rebuilds only strings, numbers, lists, tuples and dicts. It never imports a module nor calls anything: a global
  reference (class or function) becomes an inert `_Opaque` placeholder. `idx2sym` is taken from the top-level dict.
"""

from __future__ import annotations

import pickletools
from pathlib import Path

from .word_level import EOS, UNK, word_level_tokenizer

PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin")


def read_vocab_list(path: str | Path) -> list[str]:
    """Symbols of a one-symbol-per-line file (extra fields such as counts are ignored)."""
    path = Path(path)
    symbols = []
    with path.open("r", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.split()
            if not fields:
                raise ValueError(f"{path}: line {number} is empty; expected one symbol per line")
            symbols.append(fields[0])
    if not symbols:
        raise ValueError(f"{path} holds no symbols; expected one symbol per line")
    return symbols


def tokenizer_from_vocab(path: str | Path, *, unk_token: str = UNK, eos_token: str = EOS, add_eos: bool = True,
                         lowercase: bool | None = None):
    """Word-level tokenizer with the ids of an existing vocabulary file (list, or legacy `vocab.pkl`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"vocabulary file {path} does not exist; expected a vocab.txt list or a legacy vocab.pkl")
    if _is_pickle(path):
        state = read_legacy_vocab_pkl(path)
        symbols = state["idx2sym"]
        unk_token = state.get("unk_token") if isinstance(state.get("unk_token"), str) else unk_token
        lowercase = bool(state.get("lower_case", False)) if lowercase is None else lowercase
    else:
        symbols = read_vocab_list(path)
    return word_level_tokenizer(symbols, unk_token=unk_token, eos_token=eos_token,
                                add_eos=add_eos and eos_token in symbols, lowercase=bool(lowercase))


def _is_pickle(path: Path) -> bool:
    with path.open("rb") as handle:
        head = handle.read(2)
    return path.suffix in PICKLE_SUFFIXES or (len(head) == 2 and head[0] == 0x80 and head[1] <= 5)


class _Opaque:
    """Stands for a global (class/function) or an object built from one; nothing is imported or called."""

    def __init__(self, name: str, args=None):
        self.name, self.args, self.items, self.state = name, args, {}, None

    def as_plain(self):
        """OrderedDict / Counter / dict rebuilt from their arguments and set items; anything else stays opaque."""
        if self.name.rsplit(".", 1)[-1] in ("OrderedDict", "Counter", "dict", "defaultdict"):
            plain = {}
            if self.args and isinstance(self.args[0], (list, tuple)):
                plain.update(dict(pair for pair in self.args[0] if isinstance(pair, (list, tuple))))
            if self.args and isinstance(self.args[0], dict):
                plain.update(self.args[0])
            plain.update(self.items)
            return plain
        return self


def read_legacy_vocab_pkl(path: str | Path) -> dict:
    """The top-level dict of a legacy `vocab.pkl`, parsed without unpickling; must contain `idx2sym` (list of str)."""
    path = Path(path)
    try:
        result = _walk(path.read_bytes())
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as error:  # any malformed opcode sequence
        raise ValueError(f"{path} is not a legacy Transformer-XL vocab.pkl this safe parser can read ({error}); "
                         f"expected a pickled dict with 'idx2sym', or convert the vocabulary to a vocab.txt list") \
            from error
    result = result.as_plain() if isinstance(result, _Opaque) else result
    symbols = result.get("idx2sym") if isinstance(result, dict) else None
    if not isinstance(symbols, list) or not symbols or not all(isinstance(s, str) for s in symbols):
        raise ValueError(f"{path} has no 'idx2sym' list of strings; expected a legacy Transformer-XL vocab.pkl")
    return result


_PUSH_CONSTANT = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}
_PUSH_ARG = {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BININT", "BININT1", "BININT2", "INT",
             "LONG", "LONG1", "LONG4", "BINFLOAT", "FLOAT", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BINSTRING",
             "SHORT_BINSTRING", "STRING"}
_NO_OP = {"PROTO", "FRAME", "POP_MARK"}


class _PickleMachine:
    """The data-only subset of the pickle machine: a stack, marks and a memo; `step` runs one opcode."""

    def __init__(self):
        self.stack, self.marks, self.memo = [], [], {}

    def pop_mark(self) -> list:
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def step(self, name: str, arg) -> None:
        if name in _PUSH_CONSTANT:
            self.stack.append(_PUSH_CONSTANT[name])
        elif name in _PUSH_ARG:
            self.stack.append(arg)
        elif name == "MARK":
            self.marks.append(len(self.stack))
        elif name in ("EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "EMPTY_SET"):
            self.stack.append({"EMPTY_DICT": {}, "EMPTY_LIST": [], "EMPTY_TUPLE": (), "EMPTY_SET": []}[name])
        elif name in ("TUPLE", "LIST", "DICT", "FROZENSET"):
            items = self.pop_mark()
            self.stack.append(dict(zip(items[::2], items[1::2])) if name == "DICT" else
                              tuple(items) if name == "TUPLE" else list(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            count = int(name[-1])
            items = tuple(self.stack[-count:])
            del self.stack[-count:]
            self.stack.append(items)
        elif name == "APPEND":
            value = self.stack.pop()
            self.stack[-1].append(value)
        elif name in ("APPENDS", "ADDITEMS"):
            items = self.pop_mark()
            self.stack[-1].extend(items)
        elif name in ("SETITEM", "SETITEMS"):
            items = [self.stack.pop(-2), self.stack.pop()] if name == "SETITEM" else self.pop_mark()
            target = self.stack[-1]
            (target.items if isinstance(target, _Opaque) else target).update(zip(items[::2], items[1::2]))
        elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            self.stack.append(self.memo[arg])
        elif name == "GLOBAL":
            self.stack.append(_Opaque(arg.replace(" ", ".")))
        elif name == "STACK_GLOBAL":
            qualname, module = self.stack.pop(), self.stack.pop()
            self.stack.append(_Opaque(f"{module}.{qualname}"))
        elif name in ("REDUCE", "NEWOBJ"):
            args, callable_ = self.stack.pop(), self.stack.pop()
            self.stack.append(_Opaque(getattr(callable_, "name", "?"), tuple(args)).as_plain())
        elif name == "NEWOBJ_EX":
            self.stack.pop()
            args, cls = self.stack.pop(), self.stack.pop()
            self.stack.append(_Opaque(getattr(cls, "name", "?"), tuple(args)).as_plain())
        elif name == "BUILD":
            state = self.stack.pop()
            if isinstance(self.stack[-1], _Opaque):
                self.stack[-1].state = state
            elif isinstance(self.stack[-1], dict) and isinstance(state, dict):
                self.stack[-1].update(state)
        else:
            raise ValueError(f"unsupported pickle opcode {name}")


def _walk(data: bytes):
    """Evaluate the data-only subset of the pickle machine; returns the top object."""
    machine = _PickleMachine()
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name == "STOP":
            return machine.stack.pop()
        if opcode.name not in _NO_OP:
            machine.step(opcode.name, arg)
    raise ValueError("no STOP opcode")
