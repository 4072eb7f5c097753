"""The sampler's decode loop and its two schedulers (`jtc.models.sampler.sample(scheduler=...)`).

  static      the B * G rows of a call decode side by side from the first token until the
              last of them has ended (EOS or T tokens): every step runs all R rows, the ended
              ones too, so a call takes as many steps as its longest completion.
  continuous  a number of decode slots (at most B * G): when a slot's row ends, the slot takes
              the next (prompt, sample) pair of the call; with R slots a call takes about
              sum(lengths) / R steps of R rows (and at least as many as its longest completion).

Both keep each prompt's keys/values once (`decode.GroupCache`: its rows are the R samples, or
the decode slots with their own lengths and prompts) and run inside one `jax.lax.while_loop`, with
no host round-trip per token. Token t of row r = b * G + g (sample g of prompt b) is drawn with
the key ``fold_in(fold_in(rng, t), r)`` (`token_keys`), so both schedulers draw the same tokens
and log-probs for the same key, whatever the slot count.

Dimension key (docs/dimensions.md): B prompts, G samples per prompt, R the rows one decode step
runs (the B * G samples under `static`, the decode slots under `continuous`), T max new tokens,
V vocab.
"""

import functools

import flax
import jax
import jax.numpy as jnp

from jtc.models import decode
from jtc.models import gated_deltanet
from jtc.models import layer_types
from jtc.models.model_config import ModelConfig

SCHEDULERS = ('static', 'continuous')

SLOT_MEMORY_FRACTION = 0.5  # of the devices' free memory the continuous scheduler's slots take


def row_bytes(config: ModelConfig, max_new_tokens: int, block_size: int) -> int:
  """Bytes a decode row (a slot) holds: its completion keys and values in every full-attention
  layer (T rounded up to whole blocks), a hybrid's linear-attention states (the convolutions'
  last W - 1 inputs, the float32 delta-rule state) and three float32 [V] rows (its logits, the
  noise and filtered logits)."""
  c = config
  stacks, size = layer_types.stack_sizes(c), jnp.dtype(c.jnp_dtype).itemsize
  T_pad = -(-max_new_tokens // block_size) * block_size
  kv = stacks.get('attn', 0) * 2 * c.n_kv_heads * c.head_dim * T_pad * size
  K, H, N, Hv, W = gated_deltanet.dims(c)
  linear = stacks.get('linear_attn', 0) * ((W - 1) * (2 * K * H + N * Hv) * size + N * H * Hv * 4)
  return int(kv + linear + 3 * 4 * c.vocab_size)


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
                  free_bytes: int | None, members: int = 1) -> int:
  """The continuous scheduler's slot count when none is given (config.rollout.decode_slots
  None): the rows whose `row_bytes` fit in `SLOT_MEMORY_FRACTION` of ``free_bytes`` (the
  devices' free memory, summed; all ``rows`` where it is None), shared by ``members`` policies
  decoding side by side (a population), at least 1 and at most ``rows``. The one rule the
  sampler (`resolve_slots`) and `jtc plan` (`jtc.rl.decoding`) apply."""
  if free_bytes is None:
    return rows
  fit = int(SLOT_MEMORY_FRACTION *
            max(free_bytes, 0)) // (members * row_bytes(config, max_new_tokens, block_size))
  return max(1, min(rows, fit))


@functools.lru_cache(maxsize=None)
def _memory_slots(config, rows, max_new_tokens, block_size, members):
  """`default_slots` from the free memory at the first call of this shape, then kept (a slot
  count that followed every change of free memory would recompile the sampler)."""
  return default_slots(config, rows, max_new_tokens, block_size, free_device_bytes(), members)


def resolve_slots(scheduler, slots, rows, config, max_new_tokens, block_size, members=1):
  """None under 'static'; the given or the memory-derived slot count under 'continuous'."""
  if scheduler != 'continuous':
    return None
  if slots is not None:
    return int(slots)
  if rows is None:
    raise ValueError("sample: scheduler='continuous' needs slots (or the prompt count)")
  return _memory_slots(config, rows, max_new_tokens, block_size, members)


def token_keys(rng, t_R, row_R):
  """[R] keys: token ``t_R`` of sampler row ``row_R`` is drawn with fold_in(fold_in(rng, t), row)."""
  return jax.vmap(lambda t, r: jax.random.fold_in(jax.random.fold_in(rng, t), r))(t_R, row_R)


@flax.struct.dataclass
class Completions:
  """What a call samples: sample g of prompt b (the sampler's row b * G + g).

  Attributes:
    tokens_BGT: int32 completion tokens, ``pad_id`` after a row's end.
    mask_BGT: int32, 1 on sampled tokens (up to and including EOS).
    logps_BGT: float32 log-probs of the sampled tokens under the sampling distribution.
    eos_BG: bool, the row ended with an EOS id.
    ended_BG: bool, the row ended (EOS, or its token budget); False: the loop stopped first
      (``max_decode_steps``), the row is unfinished.
    experts_BGTYW: None, or int16 [B, G, T, Y, W]: the experts token t was routed to in each
      layer by the decode step that fed it (-1: not fed; a row's last token never is).
  """
  tokens_BGT: jax.Array
  mask_BGT: jax.Array
  logps_BGT: jax.Array
  eos_BG: jax.Array
  ended_BG: jax.Array
  experts_BGTYW: jax.Array | None = None

  @classmethod
  def empty(cls, B, G, T, pad_id, experts_YW=None):
    zeros = lambda *shape, dtype: jnp.zeros(shape, dtype)
    experts = None if experts_YW is None else jnp.full((B, G, T, *experts_YW), -1, jnp.int16)
    return cls(tokens_BGT=jnp.full((B, G, T), pad_id,
                                   jnp.int32), mask_BGT=zeros(B, G, T, dtype=jnp.int32),
               logps_BGT=zeros(B, G, T, dtype=jnp.float32), eos_BG=zeros(B, G, dtype=bool),
               ended_BG=zeros(B, G, dtype=bool), experts_BGTYW=experts)

  def write(self, row_R, t_R, token_R, logp_R, eos_R, ended_R):
    """Token ``t_R`` of sampler row ``row_R`` = b * G + g (a row >= B * G writes nothing)."""
    B, G = self.eos_BG.shape
    b_R, g_R = row_R // G, row_R % G
    at = lambda buf, x_R: buf.at[b_R, g_R, t_R].set(x_R.astype(buf.dtype), mode='drop')
    flag = lambda buf, x_R: buf.at[jnp.where(x_R, b_R, B), g_R].set(True, mode='drop')
    return self.replace(tokens_BGT=at(self.tokens_BGT,
                                      token_R), mask_BGT=at(self.mask_BGT, jnp.ones_like(token_R)),
                        logps_BGT=at(self.logps_BGT, logp_R), eos_BG=flag(self.eos_BG, eos_R),
                        ended_BG=flag(self.ended_BG, ended_R))

  def write_experts(self, row_R, t_R, experts_RYW):
    """The experts token ``t_R`` of sampler row ``row_R`` was routed to (a row >= B * G writes
    nothing)."""
    G = self.eos_BG.shape[1]
    experts = self.experts_BGTYW.at[row_R // G, row_R % G, t_R].set(experts_RYW.astype(jnp.int16),
                                                                    mode='drop')
    return self.replace(experts_BGTYW=experts)


@flax.struct.dataclass
class _Slots:
  """The loop's state: what each of the R rows of a decode step (the decode slots) runs, the
  cache, the outputs."""
  row_R: jax.Array  # int32, the sampler row b * G + g the slot runs (B * G: none yet)
  t_R: jax.Array  # int32, index of that row's next token
  token_R: jax.Array  # int32, the last token drawn (the next decode step feeds it)
  positions_R: jax.Array  # int32, RoPE position of token_R
  live_R: jax.Array  # bool, the slot's row has not ended
  logits_RV: jax.Array  # float32, logits of token t_R
  cache: decode.GroupCache
  next_row: jax.Array  # [] int32, how many rows have started (`_start`'s order)
  steps: jax.Array  # [] int32, decode steps run
  out: Completions


def _start(s: _Slots, logits_BV, prompt_lengths_B, G, order_N, n_run):
  """Every idle slot takes the next row not started yet, in slot order (rank among the idle
  ones): sampler row ``order_N[i]`` is the i-th to start, the first ``n_run`` rows run (the
  others have no tokens to draw). Its first token's logits come from the prompt's prefill."""
  B = logits_BV.shape[0]
  idle_R = ~s.live_R
  index_R = s.next_row + jnp.cumsum(idle_R) - 1
  start_R = idle_R & (index_R < n_run)
  row_R = jnp.where(start_R, order_N[jnp.minimum(index_R, order_N.shape[0] - 1)], s.row_R)
  b_R = jnp.minimum(row_R // G, B - 1)
  cache = s.cache
  if cache.per_row:
    cache = decode.start_rows(cache, start_R, b_R)
  return s.replace(row_R=row_R, t_R=jnp.where(start_R, 0, s.t_R),
                   positions_R=jnp.where(start_R, prompt_lengths_B[b_R], s.positions_R),
                   live_R=s.live_R | start_R, logits_RV=jnp.where(start_R[:, None], logits_BV[b_R],
                                                                  s.logits_RV), cache=cache,
                   next_row=s.next_row + jnp.sum(start_R, dtype=jnp.int32))


def _draw(s: _Slots, draw, budget_B, G, eos_ids, pad_id):
  """Each live slot draws its row's token t, written to the outputs; a slot whose row ended
  (EOS, or its prompt's token budget) goes idle (a per-row cache then reads none of its
  completion slots)."""
  B = budget_B.shape[0]
  token_R, logp_R = draw(s.logits_RV, s.t_R, s.row_R)
  live_R = s.live_R
  token_R = jnp.where(live_R, token_R, pad_id)
  eos_R = live_R & jnp.any(token_R[:, None] == jnp.asarray(eos_ids)[None], axis=-1)
  ended_R = live_R & (eos_R | (s.t_R + 1 >= budget_B[jnp.minimum(s.row_R // G, B - 1)]))
  out = s.out.write(jnp.where(live_R, s.row_R, B * G), s.t_R, token_R, logp_R, eos_R, ended_R)
  cache = s.cache
  if cache.per_row:
    cache = decode.start_rows(cache, ended_R, cache.prompt_R)
  return s.replace(token_R=token_R, t_R=s.t_R + 1, live_R=live_R & ~ended_R, out=out, cache=cache)


def run(step, draw, logits_BV, cache: decode.GroupCache, prompt_lengths_B, *, num_samples,
        max_new_tokens, eos_ids, pad_id, budget_B=None, max_decode_steps=None,
        experts_YW=None) -> Completions:
  """Decodes G = ``num_samples`` completions of each of B prompts.

  Args:
    step: fn(tokens_R, positions_R, cache) -> (logits_RV, cache(, experts_RYW)), one
      `decode.decode_step` of the cache's R rows (the experts with ``experts_YW``).
    draw: fn(logits_RV, t_R, row_R) -> (token_R, logp_R): token t of sampler row b * G + g
      (`token_keys`).
    logits_BV: float32 logits of each prompt's first new token (`decode.prefill`).
    cache: the prefilled `GroupCache`: a shared length (its R = B * G rows are the samples: the
      `static` scheduler) or per row (its R rows are the decode slots of `continuous`).
    prompt_lengths_B: [B] int, real tokens of each prompt (the first new token's position).
    num_samples, max_new_tokens: G and T.
    eos_ids: tuple of ids that end a row (kept, mask 1); pad_id: written after a row's end.
    budget_B: None (T), or [B] int, the tokens each of prompt b's rows may draw (<= T; 0: the
      rows are not run, and count as ended). Per-row caches only.
    max_decode_steps: None, or stop after this many decode steps (static int): the rows not
      ended then are unfinished (`Completions.ended_BG` False), their tokens so far kept.
    experts_YW: None, or (Y, W): ``step`` also returns the fed tokens' experts, kept in
      `Completions.experts_BGTYW` (a mixture-of-experts model's `return_routing`).

  Returns:
    `Completions` of the B * G samples.
  """
  B, V = logits_BV.shape
  G, T = num_samples, max_new_tokens
  R = cache.prompt_R.shape[0] if cache.per_row else B * G
  if budget_B is None:
    budget_B, order_N, n_run = jnp.full((B,), T, jnp.int32), jnp.arange(B * G), B * G
  elif not cache.per_row:
    raise ValueError('decode_loop.run: per-prompt budgets need a per-row cache (continuous)')
  else:  # rows with a budget first (a stable order): the others never start
    budget_B = jnp.minimum(jnp.asarray(budget_B, jnp.int32), T)
    runs_N = jnp.repeat(budget_B > 0, G)
    order_N, n_run = jnp.argsort(~runs_N, stable=True), jnp.sum(runs_N, dtype=jnp.int32)
  start = functools.partial(_start, logits_BV=logits_BV, prompt_lengths_B=prompt_lengths_B, G=G,
                            order_N=order_N, n_run=n_run)
  draw_write = functools.partial(_draw, draw=draw, budget_B=budget_B, G=G, eos_ids=eos_ids,
                                 pad_id=pad_id)
  zeros = lambda dtype: jnp.zeros((R,), dtype)
  out = Completions.empty(B, G, T, pad_id, experts_YW)
  out = out.replace(ended_BG=jnp.broadcast_to((budget_B <= 0)[:, None], (B, G)))
  idle = _Slots(row_R=jnp.full((R,), B * G, jnp.int32), t_R=zeros(jnp.int32), token_R=jnp.full(
      (R,), pad_id, jnp.int32), positions_R=zeros(jnp.int32), live_R=zeros(bool),
                logits_RV=jnp.zeros((R, V), jnp.float32), cache=cache, next_row=jnp.zeros(
                    (), jnp.int32), steps=jnp.zeros((), jnp.int32), out=out)

  def body(s):
    """Feed each slot's last token, then (continuous) start rows in idle slots, then draw."""
    logits_RV, cache, *experts = step(s.token_R, s.positions_R, s.cache)
    out = s.out
    if experts_YW is not None:  # a live slot fed its row's token t - 1
      out = out.write_experts(jnp.where(s.live_R, s.row_R, B * G), s.t_R - 1, experts[0])
    s = s.replace(logits_RV=logits_RV, cache=cache, positions_R=s.positions_R + 1,
                  steps=s.steps + 1, out=out)
    return draw_write(start(s) if cache.per_row else s)

  def going(s):
    more = jnp.any(s.live_R) | (s.next_row < n_run)
    return more if max_decode_steps is None else more & (s.steps < max_decode_steps)

  return jax.lax.while_loop(going, body, draw_write(start(idle))).out
