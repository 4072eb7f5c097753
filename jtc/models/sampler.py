"""In-house autoregressive sampler: one prefill per prompt, then a `jax.lax.while_loop` of
decode steps that read only what they need.

`sample` takes B left-padded prompts and runs them through the model once (prefill). The
prompt's keys/values are stored ONCE per prompt and shared by its G = num_samples samples
(row b*G + g is sample g of prompt b); each row has its own completion cache of T slots.
Every decode step (`jtc.models.decode.decode_step`) attends from the G rows of a group to their
prompt's block (read once per prompt, not once per row) and to the live prefix of their own
completion cache, in fixed-size blocks up to the current length. A row ends at an EOS id or
at T = max_new_tokens tokens; tokens after a row's EOS are `pad_id` with mask 0. Which rows a decode step runs is the scheduler's (`jtc.models.decode_loop`):
'static' runs all R rows until the last has ended, 'continuous' runs decode slots that each
take the next (prompt, sample) pair when their row ends (the same samples either way).

Sampling distribution at each step (float32): logits / temperature, then top-k (keep the k
largest), then top-p (keep the smallest prefix of the sorted distribution whose mass reaches
p), then min-p (keep tokens with prob >= min_p * max prob). The returned `logps` are the
log-probs of the chosen tokens under that filtered, renormalised distribution (usable as
behaviour log-probs). With `greedy=True` the token is the argmax and `logps` are the
log-probs under the unfiltered temperature-1 model distribution (a point mass would give 0).

Everything inside `sample` is one jitted function, compiled once per
(B, P, T, G, sampling-hyper-parameter, scheduler, slots) bucket; randomness comes only from
`rng`: token t of row r is drawn with `fold_in(fold_in(rng, t), r)`, whatever the scheduler.

Dimension key (docs/dimensions.md):
  B prompts, G samples per prompt, R = B * G rows, P prompt width, T max new tokens,
  V vocab, D model dim, E population members (`sample_members`), Y layers, W experts per token.
"""

import functools
from typing import Sequence

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

from jtc.models import decode
from jtc.models import decode_loop
from jtc.models import lora
from jtc.models import model as model_lib


@flax.struct.dataclass
class SampleOutput:
  """Result of `sample`; R = B * G rows, row b*G + g is sample g of prompt b.

  Attributes (L = P + T):
    tokens_RL: int32, the prompt (left-padded) then the completion (pad_id after EOS).
    input_mask_RL: int32, 1 on real tokens (prompt mask | completion_mask_RT).
    completion_RT: int32.
    completion_mask_RT: int32, 1 up to and including EOS.
    logps_RT: float32, log-prob of each chosen token under the sampling distribution
      (0 where completion_mask_RT is 0).
    truncated_R: bool, True when the row ended without an EOS, at its T tokens.
    finished_R: bool, the row ended (EOS or T tokens); False only when the call stopped first
      (``max_decode_steps``): an unfinished row, its tokens so far kept.
    experts_RLYW: int16, with `return_routing` (a mixture-of-experts model), the experts each
      token of tokens_RL was routed to in each layer as the sampler ran it: the prompt's in the
      prefill, completion token t's in the decode step that fed it ([:, P:] is [R, T, Y, W]);
      -1 where no real token was fed: padding, and each row's last token (decoding does not
      feed a row's last token: its routing changes no log-prob).
  """
  tokens_RL: jax.Array
  input_mask_RL: jax.Array
  completion_RT: jax.Array
  completion_mask_RT: jax.Array
  logps_RT: jax.Array
  truncated_R: jax.Array
  finished_R: jax.Array
  experts_RLYW: jax.Array | None = None


# ----------------------------------------------------------------------------------------
# Logit filters: each maps float32 logits [..., V] to logits with removed tokens at -inf.


def apply_top_k(logits_RV, top_k: int):
  """Keep the `top_k` largest logits (ties at the k-th value are kept)."""
  kth_R1 = jax.lax.top_k(logits_RV, top_k)[0][..., -1:]
  return jnp.where(logits_RV < kth_R1, -jnp.inf, logits_RV)


def apply_top_p(logits_RV, top_p: float):
  """Nucleus: keep token v iff the mass of the tokens strictly more likely than v is < p."""
  sorted_RV = jnp.flip(jnp.sort(logits_RV, axis=-1), axis=-1)
  probs_RV = jax.nn.softmax(sorted_RV, axis=-1)
  mass_before_RV = jnp.cumsum(probs_RV, axis=-1) - probs_RV
  kept_RV = mass_before_RV < top_p
  threshold_R1 = jnp.min(jnp.where(kept_RV, sorted_RV, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits_RV < threshold_R1, -jnp.inf, logits_RV)


def apply_min_p(logits_RV, min_p: float):
  """Keep tokens with p_v >= min_p * max_v p_v, i.e. z_v >= max z + log(min_p)."""
  threshold_R1 = jnp.max(logits_RV, axis=-1, keepdims=True) + jnp.log(min_p)
  return jnp.where(logits_RV < threshold_R1, -jnp.inf, logits_RV)


def sampling_logits(logits_RV, *, temperature: float, top_k: int, top_p: float, min_p: float):
  """The (unnormalised) log-probabilities tokens are drawn from; removed tokens are -inf."""
  logits_RV = logits_RV.astype(jnp.float32) / temperature
  if top_k > 0:
    logits_RV = apply_top_k(logits_RV, top_k)
  if top_p < 1.0:
    logits_RV = apply_top_p(logits_RV, top_p)
  if min_p > 0.0:
    logits_RV = apply_min_p(logits_RV, min_p)
  return logits_RV


def first_argmax(x_RV):
  """`jnp.argmax(x_RV, axis=-1)` (the first index of the maximum; a NaN counts as the maximum),
  written as two plain reductions, which XLA:CPU runs several times faster than argmax's
  variadic (value, index) reduction. [R] int32."""
  max_R1 = jnp.max(x_RV, axis=-1, keepdims=True)
  hit_RV = (x_RV == max_R1) | jnp.isnan(x_RV)
  iota_V = jnp.arange(x_RV.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(hit_RV, iota_V, x_RV.shape[-1]), axis=-1)


def _choose(logits_RV, keys_R, *, temperature, top_k, top_p, min_p, greedy):
  """Returns (token_R int32, logp_R float32): the argmax (greedy) or, row r with key
  ``keys_R[r]``, a draw from softmax(`sampling_logits`) by `jax.random.categorical`'s Gumbel-max
  rule (the same token for the same key), and its log-softmax under the logits it was chosen
  from. Against jnp.argmax /
  jax.random.categorical and a [R, V] log-softmax, on a quiet 2-core CPU at 32 x 8192: greedy
  0.69 -> 0.17 ms, a temperature-1 draw 2.3 -> 0.9 ms (`benchmarks/sampler.py`)."""
  logits_RV = logits_RV.astype(jnp.float32)
  if greedy:
    token_R = first_argmax(logits_RV)
  else:
    logits_RV = sampling_logits(logits_RV, temperature=temperature, top_k=top_k, top_p=top_p,
                                min_p=min_p)
    gumbel = lambda key: jax.random.gumbel(key, logits_RV.shape[-1:], logits_RV.dtype)
    token_R = first_argmax(jax.vmap(gumbel)(keys_R) + logits_RV)
  # log_softmax(logits)[token], without the [R, V] log-softmax.
  max_R1 = jnp.max(logits_RV, axis=-1, keepdims=True)
  chosen_R = jnp.take_along_axis(logits_RV, token_R[:, None], axis=-1)[:, 0]
  logp_R = (chosen_R - max_R1[:, 0]) - jnp.log(jnp.sum(jnp.exp(logits_RV - max_R1), axis=-1))
  return token_R, logp_R


# ----------------------------------------------------------------------------------------
# The jitted sampler.

_STATIC = ('config', 'num_samples', 'max_new_tokens', 'eos_ids', 'pad_id', 'temperature', 'top_k',
           'top_p', 'min_p', 'greedy', 'block_size', 'layer_loop', 'row_sharding', 'scheduler',
           'slots', 'decode_layout', 'max_decode_steps', 'return_routing')
LAYER_LOOPS = ('auto', 'scan', 'unroll')


def _sample_impl(params, prompt_tokens_BP, prompt_mask_BP, rng, budget_B=None, *, config,
                 num_samples, max_new_tokens, eos_ids, pad_id, temperature, top_k, top_p, min_p,
                 greedy, block_size, layer_loop, row_sharding=None, scheduler='static', slots=None,
                 decode_layout=None, max_decode_steps=None, return_routing=False):
  G, T = num_samples, max_new_tokens
  prompt_mask_BP = prompt_mask_BP.astype(jnp.int32)
  params = dict(params)  # a LoRA policy (`lora.Adapted`) read once, as the parameters
  if decode_layout is not None:  # resharded once, outside the loop: no per-step weight gathers
    params = decode_layout(params)
  choose = functools.partial(_choose, temperature=temperature, top_k=top_k, top_p=top_p,
                             min_p=min_p, greedy=greedy)

  # Prefill once per prompt; the prompt cache stays [B, ...], shared by each prompt's G rows.
  logits_BV, cache, *prompt_experts = decode.prefill(
      params, config, prompt_tokens_BP, prompt_mask_BP, num_samples=G, max_new_tokens=T,
      block_size=block_size, row_sharding=row_sharding,
      slots=slots if scheduler == 'continuous' else None, return_routing=return_routing)
  # Per-layer weights and caches sliced once, outside the loop, for an unrolled layer loop.
  decode_params = params
  if layer_loop == 'unroll':
    # The barrier keeps the slices here: without it XLA sinks them into the loop body, which
    # then slices (and re-lays-out) the stacked weights and prompt caches at every step.
    decode_params, cache = jax.lax.optimization_barrier(
        (decode.split_layers(params), decode.split_cache(cache)))
  step = functools.partial(decode.decode_step, decode_params, config, block_size=block_size,
                           row_sharding=row_sharding, return_routing=return_routing)

  def draw(logits, t, rows):  # of the decode step's rows (`decode_loop.run`)
    return choose(logits, None if greedy else decode_loop.token_keys(rng, t, rows))

  routing_YW = (config.n_layers, config.experts_per_token) if return_routing else None
  out = decode_loop.run(step, draw, logits_BV, cache, jnp.sum(prompt_mask_BP, axis=-1),
                        num_samples=G, max_new_tokens=T, eos_ids=eos_ids, pad_id=pad_id,
                        budget_B=budget_B, max_decode_steps=max_decode_steps, experts_YW=routing_YW)
  repeat = lambda x: jnp.repeat(x, G, axis=0)
  rows = lambda x_BGT: x_BGT.reshape(-1, *x_BGT.shape[2:])  # sample g of prompt b: row b * G + g
  completion_RT, mask_RT = rows(out.tokens_BGT), rows(out.mask_BGT)
  experts_RLYW = None
  if return_routing:
    prompt_BPYW = jnp.where(prompt_mask_BP[..., None, None] > 0, prompt_experts[0], -1)
    experts_RLYW = jnp.concatenate([repeat(prompt_BPYW.astype(jnp.int16)),
                                    rows(out.experts_BGTYW)], axis=1)
  return SampleOutput(
      tokens_RL=jnp.concatenate([repeat(prompt_tokens_BP).astype(jnp.int32), completion_RT],
                                axis=1),
      input_mask_RL=jnp.concatenate([repeat(prompt_mask_BP), mask_RT], axis=1),
      completion_RT=completion_RT, completion_mask_RT=mask_RT, logps_RT=rows(out.logps_BGT),
      truncated_R=rows(out.ended_BG & ~out.eos_BG), finished_R=rows(out.ended_BG),
      experts_RLYW=experts_RLYW)


_sample_jit = jax.jit(_sample_impl, static_argnames=_STATIC)


def sample(params, config: model_lib.ModelConfig, prompt_tokens_BP, prompt_mask_BP, *,
           rng: jax.Array, num_samples: int, max_new_tokens: int, eos_id: int | Sequence[int],
           pad_id: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, greedy: bool = False, block_size: int | None = None,
           layer_loop: str = 'auto', row_sharding=None, scheduler: str = 'static',
           slots: int | None = None, decode_layout=None, max_new_tokens_B=None,
           max_decode_steps: int | None = None, return_routing: bool = False) -> SampleOutput:
  """Sample `num_samples` completions for each of B left-padded prompts.

  Args:
    params, config: the policy (`jtc.models.model`).
    prompt_tokens_BP: [B, P] int, prompts LEFT-padded to width P (each needs >= 1 real token).
    prompt_mask_BP: [B, P] 1 on real prompt tokens, 0 on the left padding.
    rng: PRNG key; the output is a deterministic function of it.
    num_samples: G completions per prompt (rows b*G .. b*G + G - 1).
    max_new_tokens: T.
    eos_id: the end-of-sequence id, or several (e.g. a tokenizer's `eos_ids`): any of them
      ends a row (kept, mask 1).
    pad_id: the id written after EOS (mask 0).
    temperature, top_k (0 = off), top_p (1 = off), min_p (0 = off), greedy: see module doc.
    block_size: completion-cache slots per attention block of a decode step (a speed knob:
      the samples do not depend on it beyond float rounding); None = `resolve_block_size`.
    layer_loop: how a decode step runs the layers (a speed knob, same samples): 'scan' (one
      `jax.lax.scan` over the stacked layers: compile time flat in depth), 'unroll' (a Python
      loop over per-layer weights sliced once before decoding: XLA:CPU copies a dynamically
      sliced weight every step, so this is faster there, but compiles in time linear in depth),
      or 'auto' = 'unroll' on the CPU backend, else 'scan'.
    row_sharding: None (XLA's propagation places the activations and the cache, which then
      follows the prompts), or a hashable function from values to their shardings
      (`jtc.rl.sharding.RowSharding`) that the activations' rows and the cache are constrained
      to: the completion cache's R rows then split over the mesh's batch axes even when the
      B prompts cannot (B smaller than the devices). Same samples either way.
    scheduler: which rows a decode step runs (`jtc.models.decode_loop`; same samples):
      'static' (all R rows until the last has ended) or 'continuous' (``slots`` decode slots,
      each taking the next (prompt, sample) pair when its row ends).
    slots: the continuous scheduler's decode slots, in [1, R]; None =
      `decode_loop.default_slots` (what the devices' free memory holds, at most R).
    decode_layout: None, or a hashable function constraining the parameters to the layout the
      decode steps read them in (`jtc.rl.sharding.DecodeLayout`: whole over the batch axes), applied
      once before the decode loop, so that no step gathers weights. Same samples either way.
    max_new_tokens_B: None, or [B] int: the tokens prompt b's rows may draw (<= T; 0: not run;
      a continued row's remaining budget, `jtc.rl.partial`). Continuous only.
    max_decode_steps: None, or the call stops after this many decode steps; rows not ended then
      come back unfinished (`SampleOutput.finished_R`). Continuous only.
    return_routing: also return the experts every token was routed to in every layer
      (`SampleOutput.experts_RLYW`; a mixture-of-experts model only). Same samples either way.

  Returns:
    `SampleOutput` with R = B * num_samples rows.
  """
  chex.assert_rank([prompt_tokens_BP, prompt_mask_BP], 2)
  static = _static_args(config, prompt_tokens_BP.shape[-1], num_samples=num_samples,
                        max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                        greedy=greedy, block_size=block_size, layer_loop=layer_loop,
                        row_sharding=row_sharding, scheduler=scheduler, slots=slots,
                        decode_layout=decode_layout, num_prompts=prompt_tokens_BP.shape[0],
                        max_decode_steps=max_decode_steps, budgets=max_new_tokens_B is not None,
                        return_routing=return_routing)
  chex.assert_equal_shape([prompt_tokens_BP, prompt_mask_BP])
  budget = () if max_new_tokens_B is None else (max_new_tokens_B,)  # no trailing None: `program`'s
  return _sample_jit(params, prompt_tokens_BP, prompt_mask_BP, rng, *budget, **static)


def sample_members(params, config: model_lib.ModelConfig, prompt_tokens_EBP, prompt_mask_EBP, *,
                   rng: jax.Array, temperature=1.0, **kwargs) -> SampleOutput:
  """`sample` for E policies at once (a seed population, `jtc.rl.population`): every argument
  but the static ones carries a leading member axis E (params leaves [E, ...], prompts
  [E, B, P], ``rng`` [E] keys) and so does every field of the output. ``temperature`` is a float
  or an [E] array (one per member, traced: members of different temperatures share one program).
  Member n's samples are those of `sample` on member n's arguments."""
  chex.assert_rank([prompt_tokens_EBP, prompt_mask_EBP], 3)
  chex.assert_equal_shape([prompt_tokens_EBP, prompt_mask_EBP])
  per_member = not isinstance(temperature, (int, float))
  if per_member and not np.all(np.asarray(temperature) > 0):
    raise ValueError(f'sample_members: temperature={temperature!r} must be > 0 for every member')
  budget_EB = kwargs.pop('max_new_tokens_B', None)
  static = _static_args(config, prompt_tokens_EBP.shape[-1],
                        temperature=1.0 if per_member else temperature,
                        num_prompts=prompt_tokens_EBP.shape[1], budgets=budget_EB is not None,
                        members=prompt_tokens_EBP.shape[0], **kwargs)
  budget = () if budget_EB is None else (budget_EB,)  # no trailing None: `program`'s
  return _sample_members_jit(params, prompt_tokens_EBP, prompt_mask_EBP, rng,
                             jnp.asarray(temperature, jnp.float32) if per_member else None, *budget,
                             **static)


def _static_args(config, P, *, num_samples, max_new_tokens, eos_id, pad_id, temperature=1.0,
                 top_k=0, top_p=1.0, min_p=0.0, greedy=False, block_size=None, layer_loop='auto',
                 row_sharding=None, scheduler='static', slots=None, decode_layout=None,
                 max_decode_steps=None, budgets=False, num_prompts=None, platform=None,
                 return_routing=False, members=1):
  """The sampler's static arguments, checked (a ValueError naming the bad one) and resolved.
  ``num_prompts`` (B) and ``members`` (E) resolve the continuous scheduler's default ``slots``."""
  V = config.vocab_size
  R = None if num_prompts is None else num_prompts * num_samples
  eos_ids = tuple(int(e) for e in (eos_id if isinstance(eos_id, (tuple, list)) else [eos_id]))
  checks = {
      'num_samples': (num_samples, isinstance(num_samples, int) and num_samples >= 1, '>= 1'),
      'max_new_tokens': (max_new_tokens, isinstance(max_new_tokens, int) and max_new_tokens >= 1 and
                         P + max_new_tokens <= config.max_seq_len,
                         f'>= 1 with P + max_new_tokens <= max_seq_len={config.max_seq_len}'),
      'eos_id': (eos_id, len(eos_ids) >= 1 and
                 all(0 <= e < V for e in eos_ids), f'an id (or non-empty list of ids) in [0, {V})'),
      'pad_id': (pad_id, 0 <= pad_id < V, f'in [0, {V})'),
      'temperature': (temperature, greedy or temperature > 0, '> 0'),
      'top_k': (top_k, isinstance(top_k, int) and 0 <= top_k <= V, f'an int in [0, {V}]'),
      'top_p': (top_p, 0 < top_p <= 1, 'in (0, 1]'),
      'min_p': (min_p, 0 <= min_p <= 1, 'in [0, 1]'),
      'block_size': (block_size, block_size is None or
                     isinstance(block_size, int) and block_size >= 1, 'a positive int or None'),
      'layer_loop': (layer_loop, layer_loop in LAYER_LOOPS, f'one of {list(LAYER_LOOPS)}'),
      'scheduler': (scheduler, scheduler
                    in decode_loop.SCHEDULERS, f'one of {list(decode_loop.SCHEDULERS)}'),
      'slots': (slots, slots is None or
                scheduler == 'continuous' and isinstance(slots, int) and 1 <= slots <=
                (R or slots), f"None, or with scheduler='continuous' an int in [1, "
                f"{R or 'the rows B x num_samples'}]"),
      'max_decode_steps': (
          max_decode_steps, max_decode_steps is None or
          scheduler == 'continuous' and isinstance(max_decode_steps, int) and max_decode_steps >= 1,
          "None, or >= 1 with scheduler='continuous'"),
      'max_new_tokens_B': ('given' if budgets else None, not budgets or
                           scheduler == 'continuous', "None with scheduler='static'"),
      'return_routing': (return_routing, not return_routing or
                         config.is_moe, 'False for a dense model (it routes nothing; n_experts=0)'),
  }
  for name, (value, ok, valid) in checks.items():
    if not ok:
      raise ValueError(f'sample: {name}={value!r} is invalid; must be {valid}')
  block = resolve_block_size(block_size, max_new_tokens, platform)
  return dict(
      config=config, num_samples=num_samples, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
      pad_id=int(pad_id), temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
      min_p=float(min_p), greedy=bool(greedy), block_size=block,
      layer_loop=resolve_layer_loop(layer_loop, platform), row_sharding=row_sharding,
      scheduler=scheduler, decode_layout=decode_layout, max_decode_steps=max_decode_steps,
      slots=decode_loop.resolve_slots(scheduler, slots, R, config, max_new_tokens, block,
                                      members), return_routing=bool(return_routing))


def _sample_members_impl(params, prompt_tokens_EBP, prompt_mask_EBP, rng_E, temperature_E,
                         budget_EB=None, **static):
  """`_sample_impl` vmapped over members; a traced per-member temperature (and per-member
  prompt budgets) when given. With a ``row_sharding`` the members' axis goes over the mesh's
  'population' axis."""
  vmap = functools.partial(jax.vmap,
                           spmd_axis_name=None if static['row_sharding'] is None else 'population')
  axes = (lora.member_in_axes(params), 0, 0, 0, None if temperature_E is None else 0,
          None if budget_EB is None else 0)

  def one(p, t, m, r, temp, budget):
    return _sample_impl(p, t, m, r, budget,
                        **(static if temp is None else {
                            **static, 'temperature': temp
                        }))

  return vmap(one, in_axes=axes)(params, prompt_tokens_EBP, prompt_mask_EBP, rng_E, temperature_E,
                                 budget_EB)


_sample_members_jit = jax.jit(_sample_members_impl, static_argnames=_STATIC)


def resolve_block_size(block_size: int | None, max_new_tokens: int,
                       platform: str | None = None) -> int:
  """None -> one block of `max_new_tokens` slots on the CPU backend, 128 on GPU/TPU (the
  backend of ``platform``, default the host's).

  On XLA:CPU each block is a trip of the decode step's loop, which costs more than reading the
  dead slots of one whole-cache block (benchmarks/sampler.py, 26M model, T = 256: 1809 tokens/s
  with one block, 1600-1640 with 128-slot and 1503 with 64-slot blocks); on an accelerator,
  blocks skip the reads of the dead part of the cache."""
  if block_size is None:
    return max_new_tokens if (platform or jax.default_backend()) == 'cpu' else 128
  return int(block_size)


def resolve_layer_loop(layer_loop: str, platform: str | None = None) -> str:
  """'auto' -> 'unroll' on the CPU backend, 'scan' on GPU/TPU (of ``platform``, default the
  host's); others unchanged."""
  if layer_loop == 'auto':
    return 'unroll' if (platform or jax.default_backend()) == 'cpu' else 'scan'
  return layer_loop


def program(config: model_lib.ModelConfig, prompt_width: int, *, members: bool, platform: str,
            **kwargs):
  """(jitted fn, static kwargs) of the program `sample` (``members``: `sample_members`) runs for
  ``kwargs`` on ``platform``: fn(params, prompt_tokens, prompt_mask, rng(, temperature_E),
  **static). For compiling ahead of time for a target (`jtc.plan`)."""
  static = _static_args(config, prompt_width, platform=platform, **kwargs)
  return (_sample_members_jit if members else _sample_jit), static
