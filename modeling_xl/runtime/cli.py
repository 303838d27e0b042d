"""One dataclass -> argparse builder for every script: `--name` per field, typed from its annotation.

    parser = dataclass_parser(FinetuneArguments, description=__doc__)
    given = vars(parser.parse_args(argv))          # only the arguments given on the command line
    args = FinetuneArguments(**given)              # the dataclass fills in its defaults

Fields without a default are required. Booleans accept `--flag` (true) or `--flag false`. Defaults are left out of
the parsed namespace (`argparse.SUPPRESS`), so a caller can tell what was given (pretraining layers a preset recipe
and a YAML file under the command line); the dataclass supplies them. A field's `metadata["help"]` is its help text.
"""

from __future__ import annotations

import argparse
import dataclasses


def parse_bool(text) -> bool:
    lowered = str(text).lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def base_type(annotation) -> type:
    """`int | None` -> int, 'float' -> float (annotations are strings under `from __future__ import annotations`)."""
    text = str(annotation).replace("None", "").replace("|", "").strip()
    kinds = {"int": int, "float": float, "bool": bool, "str": str, "<class 'int'>": int, "<class 'float'>": float,
             "<class 'bool'>": bool, "<class 'str'>": str}
    if text not in kinds:
        raise TypeError(f"field annotation {annotation!r} is not supported; expected int, float, bool or str "
                        "(optionally | None)")
    return kinds[text]


def dataclass_parser(cls, description: str | None = None, *,
                     formatter_class=argparse.RawDescriptionHelpFormatter) -> argparse.ArgumentParser:
    """argparse parser with one `--name` per field of the dataclass `cls` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=formatter_class)
    for field in dataclasses.fields(cls):
        kind = base_type(field.type)
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        default = None if required else field.default
        help_text = field.metadata.get("help", field.name)
        if not required and default is not None:
            help_text = f"{help_text} (default: {default})"
        kwargs = {"help": help_text, "required": required}
        if not required:
            kwargs["default"] = argparse.SUPPRESS
        if kind is bool:
            kwargs.update(nargs="?", const=True, type=parse_bool)
        else:
            kwargs["type"] = kind
        parser.add_argument(f"--{field.name}", **kwargs)
    return parser
