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

``HFTokenizer``: the one tokenizer of a Hugging Face checkpoint directory (also what
``jtc.models.hf_import.load_hf_tokenizer`` returns). It wraps ``tokenizer.json`` (Hugging Face
``tokenizers``); special tokens and the chat template come from ``tokenizer_config.json`` beside
it (or ``chat_template.jinja``), and every end-of-generation id from ``generation_config.json``
(``eos_ids``: the tokenizer's EOS first, then the generation config's, e.g. Qwen3's
``<|im_end|>`` and ``<|endoftext|>``). A jinja2 chat template is rendered in a sandboxed jinja2
environment with ``messages`` (a prompt string becomes one user message) and
``add_generation_prompt=True``. Fallback (no template, or jinja2 not installed): the prompt
string is returned unchanged.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

PAD, EOS, BOS = '<pad>', '<eos>', '<bos>'
DEFAULT_ALPHABET = '\n' + ''.join(chr(c) for c in range(32, 127))  # newline + printable ASCII


@runtime_checkable
class Tokenizer(Protocol):
  """What the sampler, the trainer and the data pipeline need from a tokenizer."""

  @property
  def vocab_size(self) -> int:
    ...

  @property
  def pad_id(self) -> int:
    ...

  @property
  def eos_id(self) -> int:
    ...

  @property
  def bos_id(self) -> int | None:
    ...

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Iterable[int]) -> str:
    ...

  def apply_chat_template(self, prompt: str) -> str:
    ...


class CharTokenizer:
  """One token per character of a fixed alphabet, plus pad (0), eos (1) and bos (2)."""

  NUM_SPECIAL = 3

  def __init__(self, alphabet: str = DEFAULT_ALPHABET, *, chat_separator: str = ' '):
    if len(set(alphabet)) != len(alphabet):
      dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
      raise ValueError(f'alphabet has repeated characters: {dupes!r}')
    if not alphabet:
      raise ValueError('alphabet must not be empty')
    bad = [c for c in chat_separator if c not in alphabet]
    if bad:
      raise ValueError(f'chat_separator characters {bad!r} are not in the alphabet')
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
  def eos_ids(self) -> tuple[int, ...]:
    return (1,)

  @property
  def bos_id(self) -> int | None:
    return 2

  def encode(self, text: str) -> list[int]:
    ids = []
    for pos, c in enumerate(text):
      i = self._char_to_id.get(c)
      if i is None:
        raise ValueError(
            f'character {c!r} at position {pos} of {text!r} is not in the CharTokenizer alphabet')
      ids.append(i)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i < self.NUM_SPECIAL:
        continue
      if i >= self.vocab_size:
        raise ValueError(f'token id {i} out of range [0, {self.vocab_size})')
      out.append(self.alphabet[i - self.NUM_SPECIAL])
    return ''.join(out)

  def apply_chat_template(self, prompt: str) -> str:
    if not isinstance(prompt, str):
      raise ValueError('CharTokenizer has no chat template for a prompt of several chat messages; '
                       'use a Hugging Face tokenizer with one, or set data.chat_template=False '
                       '(the plain text of the messages)')
    return prompt + self.chat_separator

  def id_to_token(self, i: int) -> str:
    """Human-readable token (for per-token plots)."""
    specials = (PAD, EOS, BOS)
    return specials[i] if i < self.NUM_SPECIAL else self.alphabet[i - self.NUM_SPECIAL]


def _token_content(value: Any) -> str | None:
  """tokenizer_config.json stores special tokens as strings or as {"content": ...} dicts."""
  if isinstance(value, dict):
    value = value.get('content')
  return value if isinstance(value, str) else None


def _read_json(path: str | None) -> dict[str, Any]:
  if path is None or not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


_COMMON_EOS = ('<|endoftext|>', '</s>', '<eos>', '<|end_of_text|>', '<|im_end|>')


class HFTokenizer:
  """A Hugging Face ``tokenizers`` tokenizer.json plus its tokenizer_config.json and
  generation_config.json (see the module docstring).

  Attributes:
    eos_token, bos_token, pad_token: the special token strings (bos may be None; pad falls
      back to the EOS token when none is declared).
    eos_ids: every id that ends generation: `eos_id` first, then generation_config.json's
      ``eos_token_id`` (an int or a list), without repeats.
    chat_template: the Jinja chat template string, or None.
    config: the parsed tokenizer_config.json ({} if absent).
  """

  def __init__(self, tokenizer_json: str, tokenizer_config: str | None = None,
               generation_config: str | None = None):
    import tokenizers  # local import: only real-model users need it

    if not os.path.isfile(tokenizer_json):
      raise FileNotFoundError(
          f'tokenizer file not found: {tokenizer_json!r} (a tokenizer.json is needed: only '
          'fast tokenizers are supported)')
    self._tok = tokenizers.Tokenizer.from_file(tokenizer_json)
    directory = os.path.dirname(tokenizer_json)
    if tokenizer_config is None:
      tokenizer_config = os.path.join(directory, 'tokenizer_config.json')
    if generation_config is None:
      generation_config = os.path.join(directory, 'generation_config.json')
    self.config: dict[str, Any] = _read_json(tokenizer_config)
    generation = _read_json(generation_config)
    template = self._pick_template(self.config.get('chat_template'))
    jinja_file = os.path.join(directory, 'chat_template.jinja')
    if template is None and os.path.isfile(jinja_file):
      with open(jinja_file) as f:
        template = f.read()
    self.chat_template = template

    declared = _token_content(self.config.get('eos_token'))
    if declared is not None and self._tok.token_to_id(declared) is None:
      raise ValueError(f'no eos token found for {tokenizer_json!r}: eos_token={declared!r} in '
                       'tokenizer_config.json is not in its vocabulary')
    gen_eos = generation.get('eos_token_id')
    gen_eos = [] if gen_eos is None else [gen_eos] if isinstance(gen_eos, int) else list(gen_eos)
    vocab = self.vocab_size
    bad = [i for i in gen_eos if not isinstance(i, int) or not 0 <= i < vocab]
    if bad:
      raise ValueError(f'eos_token_id {bad} in generation_config.json of {tokenizer_json!r} '
                       f'are not ids of its vocabulary [0, {vocab})')
    if declared is None and gen_eos:
      declared = self._tok.id_to_token(gen_eos[0])
    self.eos_token = declared or next(
        (t for t in _COMMON_EOS if self._tok.token_to_id(t) is not None), None)
    if self.eos_token is None:
      raise ValueError(
          f'no eos token found for {tokenizer_json!r}: set eos_token in tokenizer_config.json, '
          f'eos_token_id in generation_config.json, or include one of {_COMMON_EOS}')
    self.eos_ids = tuple(dict.fromkeys([self.eos_id, *gen_eos]))
    self.bos_token = _token_content(self.config.get('bos_token'))
    if self.bos_token is not None and self._tok.token_to_id(self.bos_token) is None:
      self.bos_token = None
    pad = _token_content(self.config.get('pad_token'))
    self.pad_token = pad if pad is not None and self._tok.token_to_id(
        pad) is not None else self.eos_token

  @classmethod
  def from_dir(cls, path: str) -> 'HFTokenizer':
    """Loads ``path/tokenizer.json`` (and the config files beside it, when present)."""
    return cls(os.path.join(os.fspath(path), 'tokenizer.json'))

  @staticmethod
  def _pick_template(template: Any) -> str | None:
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
      by_name = {t.get('name'): t.get('template') for t in template if isinstance(t, dict)}
      template = by_name.get('default') or next(iter(by_name.values()), None)
    return template if isinstance(template, str) else None

  @property
  def tokenizer(self):
    """The underlying `tokenizers.Tokenizer`."""
    return self._tok

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

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

  def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, prompt: str | Sequence[Mapping[str, str]], *,
                          add_generation_prompt: bool = True, **template_kwargs: Any) -> str:
    """Renders a prompt string (as one user message) or a list of ``{'role', 'content'}``
    messages with the checkpoint's chat template."""
    messages = ([{
        'role': 'user',
        'content': prompt
    }] if isinstance(prompt, str) else [dict(m) for m in prompt])
    if self.chat_template is None:
      if isinstance(prompt, str):
        return prompt  # documented fallback
      raise ValueError('this tokenizer has no chat_template (tokenizer_config.json or '
                       'chat_template.jinja) to render messages with')
    try:
      template = _compiled_template(self.chat_template)
    except ImportError:  # documented fallback
      if isinstance(prompt, str):
        return prompt
      raise
    return template.render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or '',
        eos_token=self.eos_token,
        pad_token=self.pad_token,
        **template_kwargs,
    )


def _raise_exception(message):
  raise ValueError(f'chat template error: {message}')


@functools.lru_cache(maxsize=8)
def _compiled_template(source: str):
  """A chat template compiled once (measuring every prompt of a dataset renders it per row)."""
  import jinja2.sandbox  # pylint: disable=import-outside-toplevel
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.filters['tojson'] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=
                                                                 False)
  env.globals['raise_exception'] = _raise_exception
  return env.from_string(source)


def _char_from_spec(spec: dict[str, Any]) -> CharTokenizer:
  return CharTokenizer(**spec)


def _hf_from_spec(spec: dict[str, Any]) -> HFTokenizer:
  spec = dict(spec)
  if 'path' not in spec:
    raise ValueError(f"tokenizer spec of kind 'hf' needs a 'path', got {spec!r}")
  path = spec.pop('path')
  if os.path.isdir(path):
    return HFTokenizer(os.path.join(path, 'tokenizer.json'), **spec)
  return HFTokenizer(path, **spec)


TOKENIZERS = {'char': _char_from_spec, 'hf': _hf_from_spec}

# ChatML (Qwen's chat format) for `write_byte_level_hf`.
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                   '<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n'
                   '{% endif %}')


def write_byte_level_hf(path: str) -> None:
  """A Hugging Face tokenizer at ``path`` (tokenizer.json, tokenizer_config.json) for random
  checkpoints in tests and benchmarks: one token per byte (byte-level BPE without merges, ids
  0-255), then '<|endoftext|>' (pad), '<|im_start|>', '<|im_end|>' (eos) and a ChatML chat
  template. Ids past its vocabulary (a larger model's) decode to nothing."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=import-outside-toplevel
  vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(['<|endoftext|>', '<|im_start|>', '<|im_end|>'])
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, 'tokenizer.json'))
  with open(os.path.join(path, 'tokenizer_config.json'), 'w') as f:
    json.dump(
        {
            'eos_token': '<|im_end|>',
            'pad_token': '<|endoftext|>',
            'chat_template': CHATML_TEMPLATE
        }, f)


def from_spec(spec: dict[str, Any]) -> Tokenizer:
  """Builds a tokenizer from a config dict: ``{'kind': 'char'}`` (other keys go to
  ``CharTokenizer``) or ``{'kind': 'hf', 'path': DIR_OR_TOKENIZER_JSON}``."""
  spec = dict(spec)
  kind = spec.pop('kind', None)
  if kind not in TOKENIZERS:
    raise ValueError(f'unknown tokenizer kind {kind!r}; valid: {sorted(TOKENIZERS)}')
  return TOKENIZERS[kind](spec)


def get_tokenizer(name_or_path: str) -> Tokenizer:
  """``"char"`` -> ``CharTokenizer()``; a directory or tokenizer.json path -> ``HFTokenizer``."""
  if name_or_path == 'char':
    return CharTokenizer()
  if os.path.isdir(name_or_path):
    return HFTokenizer.from_dir(name_or_path)
  if os.path.isfile(name_or_path):
    return HFTokenizer(name_or_path)
  raise ValueError(
      f"unknown tokenizer {name_or_path!r}; valid: 'char' or a path to tokenizer.json / its directory"
  )
