"""Rollouts: prompts -> G completions -> text -> verifier rewards, written once.

The same code samples and scores for training (`collect`, with DAPO's dynamic sampling and
refill), for held-out evaluation (`jtc.rl.evaluation`, used by `jtc.train` and `jtc.sft`) and for
the behaviour pass (`behaviour_pass`: the log-probs, and hidden states when asked, of the rollouts
under the policy that produced them).

Dimension key (docs/dimensions.md): B rows (= prompts x G, each group contiguous), G samples per
prompt, M prompts (problems), P prompt width, T new tokens, L = P + T, D model width, E population
members.
"""

import dataclasses
import functools
from typing import Any, Callable

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jtc import checks
from jtc.data import pipeline as data_lib
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.data import rewards as rewards_lib
from jtc.data import verifiers
from jtc.models import decode_loop
from jtc.models import sampler as sampler_lib
from jtc.objectives import corrections
from jtc.rl import population as population_lib
from jtc.rl import sharding as sharding_lib

# Verifiers return 1 for a correct solution and 0 otherwise (shaping may add fractions):
# "correct" means a reward above one half, everywhere in jtc.
CORRECT_ABOVE = 0.5

# The sampler keyword arguments a config's `sampling` section holds (rollout and evaluation).
SAMPLING_KEYS = ('num_samples', 'max_new_tokens', 'temperature', 'top_k', 'top_p', 'min_p')


def is_correct(rewards_B):
  """[B] bool: the completions whose verifier reward counts as a correct solution."""
  return np.asarray(rewards_B) > CORRECT_ABOVE


@flax.struct.dataclass
class Rollout:
  """Sampled and scored completions, on the host. Row b * G + g is sample g of prompt b.

  tokens_BL / input_mask_BL: prompt (left-padded) then completion, as the sampler returns them.
  completion_BT / completion_mask_BT: the completion tokens (mask 1 up to and including EOS).
  sampler_logps_BT: log-probs of the chosen tokens under the sampling distribution.
  truncated_B: no EOS within T tokens.
  rewards_B: verifier rewards (before any shaping).
  texts: the decoded completions.
  versions_BT: None, or each token's policy version (`jtc.rl.partial`: its RL step; -1: none).
  prompts / answers: each row's prompt and reference answer (a `Reference`, with its
    ``data_source``), for the sample generations a run logs (`jtc.analysis.samples`).
  experts_BLYW: a mixture-of-experts policy's experts of every token in every layer as the
    sampler routed them (`SampleOutput.experts_RLYW`; `jtc.rl.routing`), else None.
  """
  tokens_BL: np.ndarray
  input_mask_BL: np.ndarray
  completion_BT: np.ndarray
  completion_mask_BT: np.ndarray
  sampler_logps_BT: np.ndarray
  truncated_B: np.ndarray
  rewards_B: np.ndarray
  texts: tuple = flax.struct.field(pytree_node=False)
  versions_BT: np.ndarray | None = None
  prompts: tuple = flax.struct.field(pytree_node=False, default=())
  answers: tuple = flax.struct.field(pytree_node=False, default=())
  experts_BLYW: np.ndarray | None = None

  @property
  def lengths_B(self):
    return self.completion_mask_BT.sum(-1)

  @property
  def correct_B(self):
    return is_correct(self.rewards_B)


@dataclasses.dataclass(frozen=True)
class Generator:
  """What sampling and scoring need besides the parameters and the sampling settings.

  ``to_device`` places a host [B, ...] array (a population's [E, B, ...]) for the sampler (the
  trainer: on its mesh with the batch sharding); ``chunk_prompts`` bounds the prompts per sampler
  call (0 = all at once); ``population``: the members whose policies sample together (the
  functions below take and return one value per member, `population_lib.Population`);
  ``mesh``: the devices' mesh, over whose batch axes the sampler splits its KV cache's rows
  (`sharding_lib.RowSharding`; None: the cache follows the prompts' sharding).
  """
  model_config: model_lib.ModelConfig
  tokenizer: Any
  reward_fn: Callable
  prompt_width: int
  chat_template: bool = True
  prompt_suffix: str = ''
  overlong: str = 'error'  # data.overlong: 'truncate' cuts a longer prompt (jtc.data.overlong)
  chunk_prompts: int = 0
  to_device: Callable = jnp.asarray
  population: population_lib.Population = population_lib.SINGLE
  mesh: Any = None
  scheduler: str = 'static'  # the sampler's scheduler and slots (`jtc.models.decode_loop`)
  slots: int | None = None
  decode_layout: Any = None  # None or a `sharding_lib.DecodeLayout`
  return_routing: bool = False  # keep a MoE sampler's routed experts (`Rollout.experts_BLYW`)

  @classmethod
  def from_config(cls, c, model_config, tokenizer, task, *, to_device=jnp.asarray,
                  population=population_lib.SINGLE, mesh=None):
    """The generator of a run config: its verifier (`jtc.data.verifiers.from_config`: the task's
    own, `data.reward`, a user's function), prompt encoding and chunking, the sampler's decoding;
    a pooled verifier (math_verify, a user's function) starts here: `close` ends it."""
    return cls(
        model_config=model_config, tokenizer=tokenizer,
        reward_fn=verifiers.from_config(c.data, task), prompt_width=c.data.prompt_width,
        chat_template=c.data.chat_template, prompt_suffix=c.data.prompt_suffix,
        overlong=c.data.overlong, chunk_prompts=c.rollout.chunk_prompts, to_device=to_device,
        population=population, mesh=mesh, return_routing=model_config.is_moe,
        scheduler=c.rollout.scheduler, slots=c.rollout.decode_slots,
        decode_layout=sharding_lib.decode_layout(c.rollout.decode_layout, mesh, model_config,
                                                 decode_loop.free_device_bytes()))

  def close(self):
    """Ends the verifier's worker processes, if it has any."""
    rewards_lib.close_reward_fn(self.reward_fn)

  def check_prompt_width(self, prompts):
    """ValueError naming config.data.prompt_width when the longest of ``prompts`` (suffix and
    chat template included) does not fit, before any compute (under data.overlong='truncate',
    when one cannot be cut to fit)."""
    if self.overlong == 'truncate':
      for p in prompts:
        data_lib.fitted_ids(self.tokenizer, p + self.prompt_suffix, width=self.prompt_width,
                            chat_template=self.chat_template)
      return
    need, longest = max(((len(
        data_lib.prompt_ids(self.tokenizer, p + self.prompt_suffix,
                            chat_template=self.chat_template)), p)
                         for p in prompts), default=(0, ''))
    if need > self.prompt_width:
      raise ValueError(f'config.data.prompt_width={self.prompt_width} is too small: the prompt '
                       f'{longest!r} takes {need} tokens with the template; set it to >= {need}')

  def encode(self, prompts):
    """(tokens_BP, mask_BP) of ``prompts``, left-padded to the prompt width (numpy)."""
    return data_lib.encode_prompts(self.tokenizer, [p + self.prompt_suffix for p in prompts],
                                   width=self.prompt_width, chat_template=self.chat_template,
                                   truncate=self.overlong == 'truncate')

  def sample(self, params, prompts_M, rng, sampling, temperature=None, *, encoded_M=None,
             max_new_tokens_B=None, **more):
    """Every member's samples of its own prompts (``prompts_M``: a list of prompt lists, one per
    member; ``params`` and ``rng`` stacked as `Population.stack`): per-member `SampleOutput`s
    on the host. ``temperature`` (per member, stacked) replaces sampling['temperature'] in a
    population that varies it. ``encoded_M``: each member's (tokens_BP', mask_BP') instead;
    ``max_new_tokens_B``: each member's [B] budgets; ``more``: `sampler.sample`'s."""
    encoded_M, pop = encoded_M or [self.encode(prompts) for prompts in prompts_M], self.population
    tokens_BP, mask_BP = (self.to_device(pop.stack(list(x))) for x in zip(*encoded_M))
    rows = np.shape(encoded_M[0][0])[0] * sampling['num_samples']
    kwargs = dict(sampling, eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
                  row_sharding=None if self.mesh is None else sharding_lib.RowSharding(self.mesh),
                  scheduler=self.scheduler, decode_layout=self.decode_layout,
                  slots=None if self.slots is None else min(self.slots, rows),
                  return_routing=self.return_routing, **more)
    if max_new_tokens_B is not None:
      kwargs['max_new_tokens_B'] = self.to_device(pop.stack(max_new_tokens_B))
    if temperature is not None:
      kwargs['temperature'] = temperature if pop.batched else float(temperature)
    sample = sampler_lib.sample_members if pop.batched else sampler_lib.sample
    out = sample(params, self.model_config, tokens_BP, mask_BP, rng=rng, **kwargs)
    return pop.unstack(sharding_lib.to_host(out))

  def decode(self, completion_BT, completion_mask_BT):
    return tuple(
        self.tokenizer.decode(row[m > 0].tolist())
        for row, m in zip(completion_BT, completion_mask_BT))


def generate(gen, params, prompts_M, answers_M, rng, sampling, temperature=None):
  """G samples of every member's prompts, decoded and scored by the verifier: a `Rollout` per
  member. ``rng``: the members' keys, stacked.

  Prompts go to the sampler `gen.chunk_prompts` at a time (key folded with the chunk index;
  one chunk keeps ``rng`` as it is).
  """
  pop, G = gen.population, sampling['num_samples']
  n_prompts = len(prompts_M[0])
  chunk = gen.chunk_prompts or n_prompts
  outs = []
  for i, s in enumerate(range(0, n_prompts, chunk)):
    key = rng if chunk == n_prompts else pop.fold_in(rng, i)
    outs.append(gen.sample(params, [p[s:s + chunk] for p in prompts_M], key, sampling, temperature))
  rollouts = []
  for m, (prompts, answers) in enumerate(zip(prompts_M, answers_M)):
    out = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *[o[m] for o in outs])
    texts = gen.decode(out.completion_RT, out.completion_mask_RT)
    rewards_B = np.asarray(
        gen.reward_fn([p for p in prompts for _ in range(G)], list(texts),
                      [a for a in answers for _ in range(G)]), np.float32)
    rollouts.append(
        Rollout(tokens_BL=out.tokens_RL, input_mask_BL=out.input_mask_RL,
                completion_BT=out.completion_RT, completion_mask_BT=out.completion_mask_RT,
                sampler_logps_BT=out.logps_RT, truncated_B=out.truncated_R, rewards_B=rewards_B,
                texts=texts, prompts=tuple(p for p in prompts for _ in range(G)),
                answers=tuple(a for a in answers for _ in range(G)), experts_BLYW=out.experts_RLYW))
  return rollouts


# ---------------------------------------------------------------------------------------------
# Training rollouts: DAPO dynamic sampling (refill zero-variance groups), overlong shaping.
# ---------------------------------------------------------------------------------------------

# The fields of a `Rollout` that are not arrays (one Python value per row).
STATIC_FIELDS = ('texts', 'prompts', 'answers')


def informative_groups(rewards_B, group_size):
  """[B / G] bool: groups whose rewards are not all equal (DAPO dynamic sampling)."""
  r = np.asarray(rewards_B).reshape(-1, group_size)
  return r.max(-1) > r.min(-1)


def refill(rollout, donor, keep_M, group_size):
  """``rollout`` with its groups where ``keep_M`` is False replaced, in order, by the
  informative groups of ``donor`` (as many as it has)."""
  G = group_size
  donors = list(np.flatnonzero(informative_groups(donor.rewards_B, G)))
  arrays = {
      f.name: np.array(getattr(rollout, f.name))
      for f in dataclasses.fields(rollout)
      if f.name not in STATIC_FIELDS and getattr(rollout, f.name) is not None
  }
  static = {name: list(getattr(rollout, name)) for name in STATIC_FIELDS}
  for g in np.flatnonzero(~keep_M):
    if not donors:
      break
    d = donors.pop(0)
    dst, src = slice(g * G, (g + 1) * G), slice(d * G, (d + 1) * G)
    for name, x in arrays.items():
      x[dst] = np.asarray(getattr(donor, name))[src]
    for name, values in static.items():
      values[dst] = getattr(donor, name)[src]
  return rollout.replace(**{k: tuple(v) for k, v in static.items()}, **arrays)


def collect(gen, params, next_examples_M, rng, *, sampling, dynamic_sampling, max_rounds,
            temperature=None):
  """The training rollouts of one RL step; returns (a `Rollout` per member, extra rounds sampled
  per member).

  ``next_examples_M[m]()`` gives member m's next batch {'prompt': [...], 'answer': [...]} of its
  prompt stream; ``rng``: the members' keys, stacked. With ``dynamic_sampling`` (DAPO)
  zero-variance groups are replaced by informative groups of up to ``max_rounds`` further
  batches, per member: a member draws a batch (and splits its key) only in the rounds it needs,
  exactly as a single run would; the others fill the program with a stand-in whose samples are
  dropped.
  """
  pop, G = gen.population, sampling['num_samples']
  keys = pop.unstack(rng)
  examples = [f() for f in next_examples_M]
  subs = []
  for m in range(pop.n):
    keys[m], sub = jax.random.split(keys[m])
    subs.append(sub)
  rollouts = generate(gen, params, [e['prompt'] for e in examples], [e['answer'] for e in examples],
                      pop.stack(subs), sampling, temperature)
  rounds = [0] * pop.n
  keep = [informative_groups(r.rewards_B, G) for r in rollouts]
  while dynamic_sampling:
    need = [not k.all() and r < max_rounds for k, r in zip(keep, rounds)]
    if not any(need):
      break
    for m in np.flatnonzero(need):
      rounds[m] += 1
      keys[m], subs[m] = jax.random.split(keys[m])
      examples[m] = next_examples_M[m]()
    donors = generate(gen, params, [e['prompt'] for e in examples], [e['answer'] for e in examples],
                      pop.stack(subs), sampling, temperature)
    for m in np.flatnonzero(need):
      rollouts[m] = refill(rollouts[m], donors[m], keep[m], G)
      keep[m] = informative_groups(rollouts[m].rewards_B, G)
  return rollouts, rounds


def overlong_shaping(lengths_B, *, max_new_tokens, buffer, penalty):
  """DAPO soft overlong punishment: a linear penalty over the last ``buffer`` tokens."""
  if buffer <= 0:
    return np.zeros_like(lengths_B, dtype=np.float32)
  start = max_new_tokens - buffer
  over = np.clip(lengths_B - start, 0, buffer).astype(np.float32)
  return -penalty * over / buffer


def behaviour_pass(params, tokens_BL, input_mask_BL, replay_BLYW=None, *, model_config,
                   completion_start, return_hidden, row_sharding=None):
  """Log-probs [B, T] (and hidden states [B, T, D] when asked) of the rollouts: one forward
  pass, no gradient; a MoE policy routes by ``replay_BLYW`` (`jtc.rl.routing`) when given and
  returns its router's own experts (not its load-balancing loss, a scalar no chunk could be
  concatenated with). Jit with everything but the arrays static."""
  chex.assert_equal_shape([tokens_BL, input_mask_BL])
  out = logprobs.sequence_logprobs(params, model_config, tokens_BL, input_mask_BL,
                                   completion_start=completion_start, return_hidden=return_hidden,
                                   row_sharding=row_sharding, replay_BLYW=replay_BLYW)
  return {k: v for k, v in out.items() if k != 'router_aux'}


def jit_behaviour(model_config, *, completion_start, return_hidden,
                  population=population_lib.SINGLE, mesh=None):
  """`behaviour_pass` jitted (and mapped over a population's members): fn(params, tokens_BL,
  input_mask_BL[, replay_BLYW]) -> {'logps', 'entropy'(, 'hidden')(, 'experts')};
  with a ``mesh``, the activations' rows over its batch axes (`sharding_lib.RowSharding`)."""
  row_sharding = None if mesh is None else sharding_lib.RowSharding(mesh)
  return jax.jit(
      population.map(
          functools.partial(behaviour_pass, model_config=model_config,
                            completion_start=completion_start, return_hidden=return_hidden,
                            row_sharding=row_sharding), spmd=mesh is not None))


def score_chunk_prompts(rollout):
  """Prompts per behaviour / reference pass of config section ``rollout`` (0 = all at once)."""
  return rollout.get('score_chunk_prompts', 0) or rollout.chunk_prompts


def behaviour_logps(behaviour_fn, params, *, tokens_BL, input_mask_BL, host_tokens_BL,
                    host_input_mask_BL, chunk_rows, to_device, axis=0, host_replay_BLYW=None):
  """``behaviour_fn`` (a jitted `behaviour_pass`) over the rollouts already on the device, or
  ``chunk_rows`` rows at a time from their host copies (0 = all at once); the rows are on
  ``axis`` (1 behind a population's member axis). ``host_replay_BLYW``: the experts a MoE
  policy replays (`jtc.rl.routing`), or None."""
  B = tokens_BL.shape[axis]
  replay = () if host_replay_BLYW is None else (host_replay_BLYW,)
  if not chunk_rows or chunk_rows >= B:
    return behaviour_fn(params, tokens_BL, input_mask_BL, *map(to_device, replay))
  rows = lambda x, s: x[(slice(None),) * axis + (slice(s, s + chunk_rows),)]
  parts = [
      behaviour_fn(params,
                   *(to_device(rows(x, s))
                     for x in (host_tokens_BL, host_input_mask_BL, *replay)))
      for s in range(0, B, chunk_rows)
  ]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=axis), *parts)


def check_sampling(section, name):
  """A config `sampling` section: its keys are exactly SAMPLING_KEYS, with valid values."""
  keys = set(section.keys())
  if keys != set(SAMPLING_KEYS):
    raise ValueError(f'{name} has keys {sorted(keys)}; expected {sorted(SAMPLING_KEYS)}')
  checks.positive_int(f'{name}.num_samples', section.num_samples)
  checks.positive_int(f'{name}.max_new_tokens', section.max_new_tokens)
  checks.in_range(f'{name}.temperature', section.temperature, low=0.0, low_open=True)
  checks.in_range(f'{name}.top_k', section.top_k, low=0, integer=True)
  checks.in_range(f'{name}.top_p', section.top_p, low=0.0, high=1.0, low_open=True)
  checks.in_range(f'{name}.min_p', section.min_p, low=0.0, high=1.0)


def check_config(c):
  """The sections a run's rollouts consume: data (prompt width), rollout, eval, dapo."""
  checks.positive_int('config.data.prompt_width', c.data.prompt_width)
  checks.positive_int('config.rollout.prompts_per_step', c.rollout.prompts_per_step)
  check_sampling(c.rollout.sampling, 'config.rollout.sampling')
  check_sampling(c.eval.sampling, 'config.eval.sampling')
  G = c.rollout.sampling.num_samples
  if G < 2:
    raise ValueError(f'config.rollout.sampling.num_samples={G} must be >= 2: intra-group '
                     'objectives compare at least two completions of a prompt')
  checks.choice('config.rollout.behaviour_logps', c.rollout.behaviour_logps,
                ('recompute', 'sampler'))
  corrections.check(c.rollout.correction, cap=c.rollout.correction_cap,
                    icepop_low=c.rollout.icepop_low, icepop_high=c.rollout.icepop_high,
                    behaviour_logps=c.rollout.behaviour_logps)
  checks.choice('config.rollout.sampler_dtype', c.rollout.sampler_dtype,
                ('', 'float32', 'bfloat16'))
  checks.in_range('config.rollout.policy_lag', c.rollout.policy_lag, low=0, integer=True)
  checks.choice('config.rollout.policy_lag_mode', c.rollout.policy_lag_mode,
                ('behaviour', 'decoupled'))
  if c.rollout.policy_lag_mode == 'decoupled' and not c.rollout.policy_lag:
    raise ValueError("config.rollout.policy_lag_mode='decoupled' needs config.rollout.policy_lag "
                     '>= 1 (without a lag the proximal and behaviour policies are the same)')
  for key in ('chunk_prompts', 'score_chunk_prompts'):
    chunk = c.rollout.get(key, 0)
    if chunk < 0 or (chunk and c.rollout.prompts_per_step % chunk):
      raise ValueError(f'config.rollout.{key}={chunk} must be 0 (off) or a divisor of '
                       f'config.rollout.prompts_per_step={c.rollout.prompts_per_step}')
  checks.in_range('config.eval.every', c.eval.every, low=0, integer=True)
  checks.positive_int('config.eval.problems', c.eval.problems)
  checks.positive_int('config.eval.batch_prompts', c.eval.batch_prompts)
  checks.in_range('config.eval.probe_problems', c.eval.probe_problems, low=0, integer=True)
  checks.in_range('config.dapo.dynamic_sampling_rounds', c.dapo.dynamic_sampling_rounds, low=0,
                  integer=True)
  checks.in_range('config.dapo.overlong_buffer', c.dapo.overlong_buffer, low=0,
                  high=c.rollout.sampling.max_new_tokens, high_open=True, integer=True)
  checks.in_range('config.dapo.overlong_penalty', c.dapo.overlong_penalty, low=0.0)
