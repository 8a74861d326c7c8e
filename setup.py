"""Installs lingvo_pipe (the library), model_params (experiments) and trainer."""

import setuptools

setuptools.setup(
    name='lingvo_pipe',
    version='0.1.0',
    description='GPipe pipeline parallelism as a Lingvo-style layer framework '
    'on TensorFlow 2.',
    packages=setuptools.find_packages(include=[
        'lingvo_pipe', 'lingvo_pipe.*', 'model_params', 'model_params.*',
        'trainer', 'trainer.*'
    ]),
    package_data={'lingvo_pipe': ['py.typed']},
    # Only TensorFlow 2.21 on Python 3.11 has ever run the tests; the measured
    # facts in docs/design.md (op placement, optimizer slot placement,
    # allocator peaks) are TensorFlow-version specific, so claim nothing wider.
    python_requires='>=3.11,<3.12',
    install_requires=[
        'tensorflow>=2.21,<2.22',
        'numpy',
        'absl-py',
        'tensorboard',  # tf.summary writes through it
        'matplotlib',  # the timeline's PNG Gantt chart
    ],
    extras_require={'test': ['pytest', 'pytest-xdist', 'mypy', 'hypothesis']},
    entry_points={
        'console_scripts': [
            'lingvo_pipe_trainer=trainer.trainer:Run',
            'lingvo_pipe_checkpoint=trainer.checkpointing.checkpoint_tool:Run',
        ],
    },
)
