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
    python_requires='>=3.10',
    install_requires=[
        'tensorflow>=2.16',  # tested on 2.21.0
        'numpy',
        'absl-py',
        'tensorboard',  # tf.summary writes through it
        'matplotlib',  # the timeline's PNG Gantt chart
    ],
    extras_require={'test': ['pytest', 'pytest-xdist']},
    entry_points={
        'console_scripts': ['lingvo_pipe_trainer=trainer.trainer:Run'],
    },
)
