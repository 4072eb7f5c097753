"""Tokenizers behind one interface: characters for the synthetic tasks, HF `tokenizers` for real models.

Interface (``Tokenizer``)::

    encode(text) -> list[int]          # no special tokens added
    decode(ids) -> str                 # special tokens (pad/eos/bos) dropped
    vocab_size, pad_id, eos_id, bos_id (int | None)
    apply_chat_template(prompt) -> str # the text the policy sees before its completion

``CharTokenizer``: ids 0/1/2 are pad/eos/bos, then one id per character of a fixed alphabet
(printable ASCII and newline by default); an unknown character is a ``ValueError`` naming it.
Its chat template appends one separator (a space by default): ``"What is 2+3?"`` ->
``"What is 2+3? "``, after which the completion starts.

``HFTokenizer``: wraps a ``tokenizer.json`` (Hugging Face ``tokenizers``). Special tokens and the
chat template come from ``tokenizer_config.json`` beside it when present. A jinja2 chat template
is rendered with ``messages=[{"role": "user", "content": prompt}]`` and
``add_generation_prompt=True`` in a sandboxed jinja2 environment. Fallback (no template, or
jinja2 not installed): the prompt is returned unchanged.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Protocol, runtime_checkable

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
DEFAULT_ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # newline + printable ASCII


@runtime_checkable
class Tokenizer(Protocol):
    """What the sampler, the trainer and the data pipeline need from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def apply_chat_template(self, prompt: str) -> str: ...


class CharTokenizer:
    """One token per character of a fixed alphabet, plus pad (0), eos (1) and bos (2)."""

    NUM_SPECIAL = 3

    def __init__(self, alphabet: str = DEFAULT_ALPHABET, *, chat_separator: str = " "):
        if len(set(alphabet)) != len(alphabet):
            dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise ValueError(f"alphabet has repeated characters: {dupes!r}")
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        bad = [c for c in chat_separator if c not in alphabet]
        if bad:
            raise ValueError(f"chat_separator characters {bad!r} are not in the alphabet")
        self.alphabet = alphabet
        self.chat_separator = chat_separator
        self._char_to_id = {c: i + self.NUM_SPECIAL for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + self.NUM_SPECIAL

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def bos_id(self) -> int | None:
        return 2

    def encode(self, text: str) -> list[int]:
        ids = []
        for pos, c in enumerate(text):
            i = self._char_to_id.get(c)
            if i is None:
                raise ValueError(
                    f"character {c!r} at position {pos} of {text!r} is not in the CharTokenizer alphabet"
                )
            ids.append(i)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < self.NUM_SPECIAL:
                continue
            if i >= self.vocab_size:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
            out.append(self.alphabet[i - self.NUM_SPECIAL])
        return "".join(out)

    def apply_chat_template(self, prompt: str) -> str:
        return prompt + self.chat_separator

    def id_to_token(self, i: int) -> str:
        """Human-readable token (for per-token plots)."""
        specials = (PAD, EOS, BOS)
        return specials[i] if i < self.NUM_SPECIAL else self.alphabet[i - self.NUM_SPECIAL]


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as {"content": ...} dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


_COMMON_EOS = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>")


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer.json plus its tokenizer_config.json."""

    def __init__(self, tokenizer_json: str, tokenizer_config: str | None = None):
        import tokenizers  # local import: only real-model users need it

        if not os.path.isfile(tokenizer_json):
            raise ValueError(f"tokenizer file not found: {tokenizer_json!r}")
        self._tok = tokenizers.Tokenizer.from_file(tokenizer_json)
        if tokenizer_config is None:
            candidate = os.path.join(os.path.dirname(tokenizer_json), "tokenizer_config.json")
            tokenizer_config = candidate if os.path.isfile(candidate) else None
        self.config: dict[str, Any] = {}
        if tokenizer_config is not None:
            with open(tokenizer_config) as f:
                self.config = json.load(f)
        self.chat_template = self._pick_template(self.config.get("chat_template"))
        self.eos_token = _token_content(self.config.get("eos_token")) or next(
            (t for t in _COMMON_EOS if self._tok.token_to_id(t) is not None), None
        )
        if self.eos_token is None or self._tok.token_to_id(self.eos_token) is None:
            raise ValueError(
                f"no eos token found for {tokenizer_json!r}: set eos_token in tokenizer_config.json "
                f"or include one of {_COMMON_EOS}"
            )
        self.bos_token = _token_content(self.config.get("bos_token"))
        if self.bos_token is not None and self._tok.token_to_id(self.bos_token) is None:
            self.bos_token = None
        pad = _token_content(self.config.get("pad_token"))
        self.pad_token = pad if pad is not None and self._tok.token_to_id(pad) is not None else self.eos_token

    @classmethod
    def from_dir(cls, path: str) -> "HFTokenizer":
        """Loads ``path/tokenizer.json`` (and ``path/tokenizer_config.json`` if present)."""
        return cls(os.path.join(path, "tokenizer.json"))

    @staticmethod
    def _pick_template(template: Any) -> str | None:
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = by_name.get("default") or next(iter(by_name.values()), None)
        return template if isinstance(template, str) else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._tok.token_to_id(self.pad_token)

    @property
    def eos_id(self) -> int:
        return self._tok.token_to_id(self.eos_token)

    @property
    def bos_id(self) -> int | None:
        return None if self.bos_token is None else self._tok.token_to_id(self.bos_token)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def apply_chat_template(self, prompt: str, **template_kwargs: Any) -> str:
        if self.chat_template is None:
            return prompt
        try:
            import jinja2.sandbox
        except ImportError:  # documented fallback
            return prompt

        def raise_exception(message):
            raise ValueError(f"chat template error: {message}")

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token,
            **template_kwargs,
        )


def _char_from_spec(spec: dict[str, Any]) -> CharTokenizer:
    return CharTokenizer(**spec)


def _hf_from_spec(spec: dict[str, Any]) -> HFTokenizer:
    spec = dict(spec)
    if "path" not in spec:
        raise ValueError(f"tokenizer spec of kind 'hf' needs a 'path', got {spec!r}")
    path = spec.pop("path")
    if os.path.isdir(path):
        return HFTokenizer(os.path.join(path, "tokenizer.json"), **spec)
    return HFTokenizer(path, **spec)


TOKENIZERS = {"char": _char_from_spec, "hf": _hf_from_spec}


def from_spec(spec: dict[str, Any]) -> Tokenizer:
    """Builds a tokenizer from a config dict: ``{'kind': 'char'}`` (other keys go to
    ``CharTokenizer``) or ``{'kind': 'hf', 'path': DIR_OR_TOKENIZER_JSON}``."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    if kind not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; valid: {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind](spec)


def get_tokenizer(name_or_path: str) -> Tokenizer:
    """``"char"`` -> ``CharTokenizer()``; a directory or tokenizer.json path -> ``HFTokenizer``."""
    if name_or_path == "char":
        return CharTokenizer()
    if os.path.isdir(name_or_path):
        return HFTokenizer.from_dir(name_or_path)
    if os.path.isfile(name_or_path):
        return HFTokenizer(name_or_path)
    raise ValueError(
        f"unknown tokenizer {name_or_path!r}; valid: 'char' or a path to tokenizer.json / its directory"
    )
