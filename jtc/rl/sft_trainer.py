r"""Supervised fine-tuning of the default base policy on task solutions.

  python -m jtc.sft --config configs/sft_arith.py --workdir W

Each training example is a prompt followed by one of its equivalent solution texts, the format
drawn uniformly, so the resulting policy writes every format (the drift between formats under
RL is what the paper's Corollary 3.2 is about). The loss is the mean negative log-likelihood
of the completion tokens, computed with the same chunked `logprobs.sequence_logprobs` that the RL
trainer uses. At the end the policy is evaluated (avg@k at the config's temperature) and
written as a policy bundle to `<workdir>/policy` (and to `--config.export_to`, e.g.
`jtc/assets/base_policy` to rebuild the shipped one).

Dimension key (docs/dimensions.md): B examples, P prompt width, T completion width, L = P + T.
"""

import functools
import json
import os
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jtc.models import bundles

from jtc.data import pipeline as data_lib
from jtc.models import model as model_lib
from jtc.models import logprobs
from jtc.rl import distributed
from jtc.rl import evaluation
from jtc.rl import rollout as rollout_lib
from jtc.rl import sharding as sharding_lib
from jtc.data import tasks as tasks_lib
from jtc.models import tokenizer as tokenizer_lib


def encode_pairs(tokenizer, prompts, completions, *, prompt_width, completion_width):
  """Left-padded prompts then right-padded, EOS-terminated completions.

  Returns tokens [B, P+T], input_mask [B, P+T] and completion loss mask [B, T].
  """
  tokens_BP, mask_BP = data_lib.encode_prompts(tokenizer, prompts, width=prompt_width)
  B = len(completions)
  comp_BT = np.full((B, completion_width), tokenizer.pad_id, np.int32)
  cmask_BT = np.zeros((B, completion_width), np.int32)
  for b, text in enumerate(completions):
    ids = tokenizer.encode(text) + [tokenizer.eos_id]
    if len(ids) > completion_width:
      raise ValueError(f'completion {text!r} has {len(ids)} tokens with EOS, more than '
                       f'completion_width={completion_width}')
    comp_BT[b, :len(ids)] = ids
    cmask_BT[b, :len(ids)] = 1
  tokens = np.concatenate([tokens_BP, comp_BT], axis=1)
  input_mask = np.concatenate([mask_BP, cmask_BT], axis=1)
  return tokens, input_mask, cmask_BT.astype(np.float32)


def sft_step(params, opt_state, tokens_BL, input_mask_BL, mask_BT, *, model_config, optimizer,
             prompt_width, router_aux_coef=0.0):
  """One AdamW step on the mean completion-token negative log-likelihood (+ ``router_aux_coef``
  times a mixture-of-experts policy's load-balancing loss, `jtc.models.moe`, as Hugging Face
  adds it); returns (params, opt_state, loss, router_aux or 0)."""
  chex.assert_rank([tokens_BL, input_mask_BL, mask_BT], 2)
  chex.assert_equal_shape([tokens_BL, input_mask_BL])

  def loss_fn(p):
    out = logprobs.sequence_logprobs(p, model_config, tokens_BL, input_mask_BL,
                                     completion_start=prompt_width)
    nll = -jnp.sum(out['logps'] * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)
    aux = out.get('router_aux', jnp.zeros(()))
    return nll + router_aux_coef * aux, (nll, aux)

  (_, (loss, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss, aux


def eval_sampling(k, max_new_tokens):
  """The sampling settings of the base policy's evaluation: k samples at temperature 1."""
  return dict(num_samples=k, max_new_tokens=max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
              min_p=0.0)


def train_sft(c, workdir):
  """Runs SFT from scratch; returns the final evaluation dict."""
  task = tasks_lib.get_task(c.task)
  tokenizer = tokenizer_lib.from_spec(dict(c.tokenizer))
  model_config = getattr(model_lib.ModelConfig, c.model_preset)(vocab_size=tokenizer.vocab_size)
  rng = np.random.default_rng(c.seed)
  params = model_lib.init_params(model_config, jax.random.key(c.seed))
  schedule = optax.warmup_cosine_decay_schedule(0.0, c.learning_rate, c.warmup_steps, c.num_steps,
                                                c.learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(schedule, weight_decay=c.weight_decay))
  # Data parallel over every device of every process: parameters replicated, each batch split.
  mesh = sharding_lib.make_mesh(data=-1, fsdp=1, tensor=1)
  replicated = sharding_lib.replicated(mesh)
  params = jax.tree.map(lambda x: sharding_lib.to_device(np.asarray(x), replicated), params)
  opt_state = jax.jit(optimizer.init, out_shardings=replicated)(params)
  step_fn = jax.jit(
      functools.partial(sft_step, model_config=model_config, optimizer=optimizer,
                        prompt_width=c.prompt_width, router_aux_coef=c.get('router_aux_coef', 0.0)),
      donate_argnums=(0, 1))
  batched = lambda x: sharding_lib.to_device(x, sharding_lib.batch_sharding(mesh, x.shape))
  primary = distributed.is_primary()
  train = data_lib.load_examples(c.task, split='train', data_dir=os.path.join(workdir, 'data'),
                                 limit=c.train_problems)
  test = data_lib.load_examples(c.task, split='test', data_dir=os.path.join(workdir, 'data'),
                                limit=c.eval_problems)
  t0 = time.time()
  log = open(os.path.join(workdir, 'sft_metrics.jsonl') if primary else os.devnull, 'w')
  for step in range(1, c.num_steps + 1):
    idx = rng.integers(0, len(train), c.batch_size)
    prompts = [train[i]['prompt'] for i in idx]
    sols = []
    for i in idx:
      solutions = train[i]['solutions']
      sols.append(solutions[task.formats[rng.integers(len(task.formats))]])
    tokens, input_mask, mask = encode_pairs(tokenizer, prompts, sols, prompt_width=c.prompt_width,
                                            completion_width=c.max_new_tokens)
    params, opt_state, loss, aux = step_fn(params, opt_state, batched(tokens), batched(input_mask),
                                           batched(mask))
    if (step % 50 == 0 or step == c.num_steps) and primary:
      rec = dict(step=step, loss=float(loss), time=time.time() - t0)
      if model_config.is_moe:
        rec['router_aux'] = float(aux)
      log.write(json.dumps(rec) + '\n')
      log.flush()
      print(rec, file=sys.stderr)
  gen = rollout_lib.Generator(model_config=model_config, tokenizer=tokenizer,
                              reward_fn=task.reward_fn, prompt_width=c.prompt_width,
                              to_device=batched)
  result, = evaluation.evaluate(gen, params, test, jax.random.key(c.seed + 1),
                                sampling=eval_sampling(c.eval_k, c.max_new_tokens),
                                batch_prompts=32, task=task)
  result['train_seconds'] = time.time() - t0
  log.write(json.dumps(dict(step=c.num_steps, **result)) + '\n')
  log.close()
  meta = dict(made_by=f'python -m jtc.sft (task {c.task}, {c.num_steps} steps)', task=c.task,
              sft_steps=c.num_steps, seed=c.seed, eval=result)
  for path in ([os.path.join(workdir, 'policy')] +
               ([c.export_to] if c.export_to else []) if primary else []):
    bundles.save_policy_bundle(path, model_config=model_config, params=sharding_lib.to_host(params),
                               tokenizer_spec=dict(c.tokenizer), meta=meta)
  return result
