"""The sampler's decode loop and its two schedulers (`jtc.models.sampler.sample(scheduler=...)`).

  static      the R = B * G rows of a call decode side by side from the first token until the
              last of them has ended (EOS or T tokens): every step runs all R rows, the ended
              ones too, so a call takes as many steps as its longest completion.
  continuous  O <= R decode slots: when a slot's row ends, the slot takes the next (prompt,
              sample) pair of the call; a call takes about sum(lengths) / O steps of O rows
              (and at least as many as its longest completion).

Both keep each prompt's keys/values once (`decode.GroupCache`: its rows are the R samples, or
the O slots with their own lengths and prompts) and run inside one `jax.lax.while_loop`, with
no host round-trip per token. Token t of row r = b * G + g (sample g of prompt b) is drawn with
the key ``fold_in(fold_in(rng, t), r)`` (`token_keys`), so both schedulers draw the same tokens
and log-probs for the same key, whatever the slot count.

Dimension key (docs/dimensions.md): B prompts, G samples per prompt, R = B * G rows, O decode
slots (O = R under `static`), T max new tokens, V vocab.
"""

import functools

import flax
import jax
import jax.numpy as jnp

from jtc.models import decode
from jtc.models.model_config import ModelConfig

SCHEDULERS = ('static', 'continuous')

SLOT_MEMORY_FRACTION = 0.5  # of the devices' free memory the continuous scheduler's slots take


def row_bytes(config: ModelConfig, max_new_tokens: int, block_size: int) -> int:
  """Bytes a decode row (a slot) holds: its completion keys and values in every layer (T rounded
  up to whole blocks) and three float32 [V] rows (its logits, the noise and filtered logits)."""
  c = config
  T_pad = -(-max_new_tokens // block_size) * block_size
  kv = c.n_layers * 2 * c.n_kv_heads * c.head_dim * T_pad * jnp.dtype(c.jnp_dtype).itemsize
  return int(kv + 3 * 4 * c.vocab_size)


def free_device_bytes() -> int | None:
  """The local devices' free memory (limit minus in use, summed), or None where a device does
  not report it (XLA:CPU)."""
  free = 0
  for device in jax.local_devices():
    stats = device.memory_stats()
    if not stats or 'bytes_limit' not in stats:
      return None
    free += stats['bytes_limit'] - stats.get('bytes_in_use', 0)
  return free


def default_slots(config: ModelConfig, rows: int, max_new_tokens: int, block_size: int,
                  free_bytes: int | None) -> int:
  """The continuous scheduler's slot count when none is given: the rows whose `row_bytes` fit
  in `SLOT_MEMORY_FRACTION` of ``free_bytes`` (all ``rows`` where it is None), at least 1."""
  if free_bytes is None:
    return rows
  fit = int(SLOT_MEMORY_FRACTION * free_bytes) // row_bytes(config, max_new_tokens, block_size)
  return max(1, min(rows, fit))


@functools.lru_cache(maxsize=None)
def _memory_slots(config, rows, max_new_tokens, block_size):
  """`default_slots` from the free memory at the first call of this shape, then kept (a slot
  count that followed every change of free memory would recompile the sampler)."""
  return default_slots(config, rows, max_new_tokens, block_size, free_device_bytes())


def resolve_slots(scheduler, slots, rows, config, max_new_tokens, block_size):
  """None under 'static'; the given or the memory-derived slot count under 'continuous'."""
  if scheduler != 'continuous':
    return None
  if slots is not None:
    return int(slots)
  if rows is None:
    raise ValueError("sample: scheduler='continuous' needs slots (or the prompt count)")
  return _memory_slots(config, rows, max_new_tokens, block_size)


def token_keys(rng, t_O, row_O):
  """[O] keys: token ``t_O`` of row ``row_O`` is drawn with fold_in(fold_in(rng, t), row)."""
  return jax.vmap(lambda t, r: jax.random.fold_in(jax.random.fold_in(rng, t), r))(t_O, row_O)


@flax.struct.dataclass
class Completions:
  """What a call samples, row b * G + g = sample g of prompt b.

  Attributes:
    tokens_RT: int32 completion tokens, ``pad_id`` after a row's end.
    mask_RT: int32, 1 on sampled tokens (up to and including EOS).
    logps_RT: float32 log-probs of the sampled tokens under the sampling distribution.
    eos_R: bool, the row ended with an EOS id (not at T tokens).
  """
  tokens_RT: jax.Array
  mask_RT: jax.Array
  logps_RT: jax.Array
  eos_R: jax.Array

  @classmethod
  def empty(cls, R, T, pad_id):
    return cls(tokens_RT=jnp.full((R, T), pad_id, jnp.int32), mask_RT=jnp.zeros((R, T), jnp.int32),
               logps_RT=jnp.zeros((R, T), jnp.float32), eos_R=jnp.zeros((R,), bool))

  def write(self, row_O, t_O, token_O, logp_O, eos_O):
    """Token ``t_O`` of row ``row_O`` (a row >= R, an idle slot's, writes nothing)."""
    R = self.eos_R.shape[0]
    at = lambda buf_RT, x_O: buf_RT.at[row_O, t_O].set(x_O.astype(buf_RT.dtype), mode='drop')
    return self.replace(tokens_RT=at(self.tokens_RT,
                                     token_O), mask_RT=at(self.mask_RT, jnp.ones_like(token_O)),
                        logps_RT=at(self.logps_RT, logp_O),
                        eos_R=self.eos_R.at[jnp.where(eos_O, row_O, R)].set(True, mode='drop'))


@flax.struct.dataclass
class _Slots:
  """The loop's state: what each of the O decode slots runs, the cache, the outputs."""
  row_O: jax.Array  # int32, the row the slot runs (R: none yet)
  t_O: jax.Array  # int32, index of that row's next token
  token_O: jax.Array  # int32, the last token drawn (the next decode step feeds it)
  positions_O: jax.Array  # int32, RoPE position of token_O
  live_O: jax.Array  # bool, the slot's row has not ended
  logits_OV: jax.Array  # float32, logits of token t_O
  cache: decode.GroupCache
  next_row: jax.Array  # [] int32, the next row to start
  out: Completions


def _start(s: _Slots, logits_BV, prompt_lengths_B, G):
  """Every idle slot takes the next row not started yet, in slot order (rank among the idle
  ones): its first token's logits come from the prompt's prefill."""
  B = logits_BV.shape[0]
  idle_O = ~s.live_O
  row_O = s.next_row + jnp.cumsum(idle_O) - 1
  start_O = idle_O & (row_O < B * G)
  row_O = jnp.where(start_O, row_O, s.row_O)
  b_O = jnp.minimum(row_O // G, B - 1)
  cache = s.cache
  if cache.per_row:
    cache = decode.start_rows(cache, start_O, b_O)
  return s.replace(row_O=row_O, t_O=jnp.where(start_O, 0, s.t_O),
                   positions_O=jnp.where(start_O, prompt_lengths_B[b_O], s.positions_O),
                   live_O=s.live_O | start_O, logits_OV=jnp.where(start_O[:, None], logits_BV[b_O],
                                                                  s.logits_OV), cache=cache,
                   next_row=s.next_row + jnp.sum(start_O, dtype=jnp.int32))


def _draw(s: _Slots, draw, T, eos_ids, pad_id):
  """Each live slot draws its row's token t, written to the outputs; a slot whose row ended
  (EOS, or T tokens) goes idle (a per-row cache then reads none of its completion slots)."""
  R = s.out.eos_R.shape[0]
  token_O, logp_O = draw(s.logits_OV, s.t_O, s.row_O)
  live_O = s.live_O
  token_O = jnp.where(live_O, token_O, pad_id)
  eos_O = live_O & functools.reduce(jnp.logical_or, [token_O == e for e in eos_ids])
  out = s.out.write(jnp.where(live_O, s.row_O, R), s.t_O, token_O, logp_O, eos_O)
  ended_O = live_O & (eos_O | (s.t_O + 1 >= T))
  cache = s.cache
  if cache.per_row:
    cache = decode.start_rows(cache, ended_O, cache.prompt_R)
  return s.replace(token_O=token_O, t_O=s.t_O + 1, live_O=live_O & ~ended_O, out=out, cache=cache)


def run(step, draw, logits_BV, cache: decode.GroupCache, prompt_lengths_B, *, num_samples,
        max_new_tokens, eos_ids, pad_id) -> Completions:
  """Decodes G = ``num_samples`` completions of each of B prompts.

  Args:
    step: fn(tokens_O, positions_O, cache) -> (logits_OV, cache), one `decode.decode_step`.
    draw: fn(logits_OV, t_O, row_O) -> (token_O, logp_O): token t of row r (`token_keys`).
    logits_BV: float32 logits of each prompt's first new token (`decode.prefill`).
    cache: the prefilled `GroupCache`: a shared length (R rows: the `static` scheduler) or per
      row (its rows are the O slots of the `continuous` scheduler).
    prompt_lengths_B: [B] int, real tokens of each prompt (the first new token's position).
    num_samples, max_new_tokens: G and T.
    eos_ids: tuple of ids that end a row (kept, mask 1); pad_id: written after a row's end.

  Returns:
    `Completions` of the R = B * G rows.
  """
  B, V = logits_BV.shape
  R, T = B * num_samples, max_new_tokens
  O = cache.prompt_R.shape[0] if cache.per_row else R
  start = functools.partial(_start, logits_BV=logits_BV, prompt_lengths_B=prompt_lengths_B,
                            G=num_samples)
  draw_write = functools.partial(_draw, draw=draw, T=T, eos_ids=eos_ids, pad_id=pad_id)
  idle = _Slots(row_O=jnp.full((O,), R, jnp.int32), t_O=jnp.zeros(
      (O,), jnp.int32), token_O=jnp.full((O,), pad_id, jnp.int32), positions_O=jnp.zeros(
          (O,), jnp.int32), live_O=jnp.zeros((O,), bool), logits_OV=jnp.zeros((O, V), jnp.float32),
                cache=cache, next_row=jnp.zeros((), jnp.int32), out=Completions.empty(R, T, pad_id))

  def body(s):
    """Feed each slot's last token, then (continuous) start rows in idle slots, then draw."""
    logits_OV, cache = step(s.token_O, s.positions_O, s.cache)
    s = s.replace(logits_OV=logits_OV, cache=cache, positions_O=s.positions_O + 1)
    return draw_write(start(s) if cache.per_row else s)

  def going(s):
    return jnp.any(s.live_O) | (s.next_row < R)

  return jax.lax.while_loop(going, body, draw_write(start(idle))).out
