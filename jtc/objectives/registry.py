"""What a loss is and where it is registered: one `LossSpec` per loss, in ``LOSSES``.

A loss is a surrogate function ``fn(LossInputs, **hparams) -> Surrogate`` (keyword-only
hyper-parameters with their defaults, `jtc.objectives.surrogates`) registered once with its
decorator::

  @registry.register('grpo', aggregation='seq_mean_token_mean', ranges={'eps_low': POSITIVE, ...},
                     about='token PPO clip (Shao et al. 2024; Eq. 8)')
  def grpo(inp, *, eps_low=0.2, ...): ...

Everything that needs to know a loss reads its spec: `jtc.objectives.loss` (the valid names, the
defaults, the validation, whether it takes token weights), `configs.common.set_loss` (the keys a
config exposes), `jtc.rl.config_check` and docs/objectives.md's table (`markdown_table`). The
built-in losses register when `jtc.objectives` is imported (docs/objectives.md: adding one).

Dimension key (docs/dimensions.md): B completions (= M * G, each group of G contiguous), M groups,
G group size, T completion length.
"""

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import flax.struct
import jax

from jtc import checks


@flax.struct.dataclass
class LossInputs:
  """What a loss sees. log_ratio_BT is log r (0 on padding); group_size is static."""
  log_ratio_BT: jax.Array
  adv_B: jax.Array
  mask_BT: jax.Array
  token_weights_BT: jax.Array | None
  group_size: int = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class Surrogate:
  """A loss's per-token objective (maximised) plus what the metrics need.

  obj_BT: per-token objective, aggregated then negated into the loss.
  clip_low_BT / clip_high_BT: 1.0 where the token is clipped from below / above.
  w_B: the trajectory weight w_i of Eq. 14 that Eq. 23's ``asym`` uses: s_i for GSPO (clipped
    or not), s_tilde_i for DFPO, the token-mean ratio for the token-level losses.
  w_grad_B: the weight the gradient actually carries: w_B with 0 wherever the clip switches
    the trajectory's (or, token-averaged, the tokens') gradient off (``asym_gated``).
  """
  obj_BT: jax.Array
  clip_low_BT: jax.Array
  clip_high_BT: jax.Array
  w_B: jax.Array
  w_grad_B: jax.Array


@dataclasses.dataclass(frozen=True)
class Range:
  """A hyper-parameter's valid values: ``check(key, value)`` raises ValueError naming the key
  and the value; ``text`` is how docs/objectives.md writes them."""
  text: str
  check: Callable[[str, Any], None]


def _greater_than_one(key, value):
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 1:
    raise ValueError(f'{key}={value!r} must be None (off) or > 1')


def optional(r):
  """``r`` or None (off)."""
  return Range(f'None or {r.text}', lambda k, v: None if v is None else r.check(k, v))


def one_of(options):
  return Range(' \\| '.join(f'`{o}`' for o in options), lambda k, v: checks.choice(k, v, options))


POSITIVE = Range('> 0', checks.positive)
NON_NEGATIVE = Range('>= 0', lambda k, v: checks.in_range(k, v, low=0))
ABOVE_ONE = Range('None or > 1', lambda k, v: None if v is None else _greater_than_one(k, v))
BOOLEAN = Range('True \\| False', lambda k, v: checks.choice(k, v, (True, False)))
ANY_NUMBER = Range('None or a number', lambda k, v: None)


@dataclasses.dataclass(frozen=True)
class LossSpec:
  """One loss: its surrogate, default aggregation, whether it weighs tokens with
  ``token_weights`` (then the trainer needs a token-weight plug-in), the valid values of each
  hyper-parameter (the defaults are the surrogate's keyword defaults), a rule spanning several
  hyper-parameters (``check(hparams)``, optional) and one line for the docs."""
  name: str
  surrogate: Callable[..., Surrogate]
  aggregation: str
  ranges: Mapping[str, Range]
  about: str
  token_weighted: bool = False
  check: Callable[[dict], None] | None = None

  @property
  def defaults(self):
    """{key: default} of the surrogate's keyword-only hyper-parameters."""
    params = inspect.signature(self.surrogate).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}

  def validate(self, hparams):
    """ValueError naming the key for a value out of its range (values given as traced arrays,
    a population's, are checked by the population before compiling)."""
    static = {k: v for k, v in hparams.items() if not isinstance(v, jax.Array)}
    for key, r in self.ranges.items():
      if key in static:
        r.check(key, static[key])
    if self.check is not None:
      self.check(static)


LOSSES: dict[str, LossSpec] = {}


def register(name, *, aggregation, ranges, about, token_weighted=False, check=None):
  """Decorator: registers ``fn`` as loss ``name`` and returns it unchanged. ValueError for a
  name already taken or ``ranges`` that do not name exactly the keyword-only hyper-parameters."""

  def add(fn):
    spec = LossSpec(name=name, surrogate=fn, aggregation=aggregation, ranges=dict(ranges),
                    about=about, token_weighted=token_weighted, check=check)
    if name in LOSSES:
      raise ValueError(f'loss {name!r} is already registered (by {LOSSES[name].surrogate})')
    if set(spec.ranges) != set(spec.defaults):
      raise ValueError(f'loss {name!r}: ranges name {sorted(spec.ranges)}, the surrogate\'s '
                       f'keyword-only hyper-parameters are {sorted(spec.defaults)}')
    LOSSES[name] = spec
    return fn

  return add


def get(name):
  """The spec of loss ``name``; ValueError naming the valid losses for another name."""
  if name not in LOSSES:
    raise ValueError(f'unknown loss {name!r}; valid: {sorted(LOSSES)}')
  return LOSSES[name]


def token_weighted():
  """The losses that weigh their tokens with ``token_weights`` (they need a token-weight plug-in
  in the trainer)."""
  return tuple(n for n, spec in LOSSES.items() if spec.token_weighted)


def markdown_table():
  """docs/objectives.md's table of the registered losses (tests/objectives/test_registry.py
  keeps the two equal)."""
  lines = [
      '| loss | what it is | default aggregation | hyper-parameters: default (valid) |',
      '|---|---|---|---|'
  ]
  for name, spec in LOSSES.items():
    hp = '; '.join(
        f'`{k}` {spec.defaults[k]!r} ({r.text})' for k, r in spec.ranges.items()) or 'none'
    weights = ' (needs `token_weights`)' if spec.token_weighted else ''
    lines.append(f'| `{name}` | {spec.about}{weights} | `{spec.aggregation}` | {hp} |')
  return '\n'.join(lines)
