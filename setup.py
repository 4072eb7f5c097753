"""jtc: token-level views of intra-group RL objectives for language models, in JAX.

The repository's `configs/` and `experiments/` folders are shipped inside jtc's namespace, as
`jtc/_shipped/configs` and `jtc/_shipped/experiments`: an installed jtc adds no generic
top-level package to site-packages. jtc's commands make them importable as `configs` and
`experiments` in their own processes (`jtc.cli.absl_program.REPO`), as in a checkout.
"""
import setuptools

# The repository's folders, shipped under jtc's namespace (see the module docstring).
SHIPPED = {'configs': ('', '.real'), 'experiments': ('', '.sweeps')}

setuptools.setup(
    name='jtc',
    version='0.2.0',
    description='JAX research codebase for RL of language models with sequence-level rewards.',
    packages=setuptools.find_packages(include=['jtc', 'jtc.*']) +
    [f'jtc._shipped.{top}{sub}' for top, subs in SHIPPED.items() for sub in subs],
    package_dir={f'jtc._shipped.{top}': top for top in SHIPPED},
    package_data={'jtc': ['assets/**/*']},
    # `jtc train | sft | ledger | plot ...` (the same commands as `python -m jtc.<command>`).
    entry_points={'console_scripts': ['jtc = jtc.cli:main']},
    include_package_data=True,
    python_requires='>=3.10',
    install_requires=[
        'jax>=0.5',
        'flax>=0.10',
        'optax>=0.2.4',
        'orbax-checkpoint>=0.11',
        'grain>=0.2.10',
        'tensorflow-datasets>=4.9.9',
        'array-record>=0.7',
        'ml-collections>=1.0',
        'chex>=0.1.89',
        'absl-py',
        'numpy',
        'safetensors>=0.4',
        'tokenizers>=0.20',
        'pyarrow>=14',  # jtc.data.formats: parquet files and saved Hugging Face datasets
        'tensorboardX>=2.6',
        'matplotlib>=3.8',
        'tqdm',
        'scipy',  # experiments/stats.py: t quantiles (JAX needs it too)
    ],
    extras_require={
        # Accelerators: the jax wheels for the backend (same jax version as the CPU install).
        'cuda': ['jax[cuda12]'],  # NVIDIA GPUs, CUDA 12 wheels (driver >= 525)
        'cuda13': ['jax[cuda13]'],  # NVIDIA GPUs, CUDA 13 wheels
        'tpu': ['jax[tpu]'],  # Cloud TPU VMs (libtpu)
        # `python -m jtc.plan`: libtpu compiles for TPU slices without the hardware. Kept out of
        # the default install and of `test`: with it, jax's start-up on a CPU machine prints
        # libtpu errors. The README's test command (and CI) installs `test` and `plan` together,
        # so that tests/plan compile for TPUs; without `plan` they skip.
        'plan': ['jax[tpu]'],
        # The viewer for the TensorBoard event files the trainer writes (tensorboardX).
        'tensorboard': ['tensorboard>=2.16'],
        # `--config.data.reward=math_verify`: Hugging Face's Math-Verify answer checker
        # (jtc.data.math_verifier; docs/verifiers.md).
        'math': ['math-verify>=0.9'],
        # Weights & Biases tracking (config.log.wandb_project; jtc.analysis.tracking).
        'wandb': ['wandb>=0.31'],
        'test': [
            'pytest>=8',
            'pytest-xdist>=3.5',  # the README's test command runs the suite on 2 workers
            'yapf==0.43.0',  # tests/test_style.py: the one code style (.style.yapf)
            'hypothesis>=6.100',
            'nbclient>=0.10',
            'nbformat>=5.10',
            'ipykernel>=6',
            'wandb>=0.31',  # tests/analysis/test_tracking.py: offline W&B runs read back
            # tests/analysis/test_ledger_view.py drives the system's Chromium (/usr/bin/chromium,
            # Debian's `chromium` package; .ci/run installs it), never playwright's own download.
            'playwright==1.65.2',
            # Reference implementations for the Hugging Face import tests.
            # torch==2.13.0 resolves to the CPU build that lies on this machine's disk.
            'torch==2.13.0',
            'transformers>=4.51',
            'math-verify>=0.9',  # tests/data/test_math_verifier.py, benchmarks/verifiers.py
            # tests/data/test_formats.py: datasets saved with save_to_disk, in their real layout.
            'datasets>=2.14',
        ],
    },
)
