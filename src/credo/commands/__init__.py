"""What the ``credo`` commands do besides training: the bodies the CLI calls.

- :mod:`~credo.commands.sft`: ``credo sft`` (the warm start alone, and its evaluation);
- :mod:`~credo.commands.evaluate`: ``credo eval`` (a run's trained policy, or a model);
- :mod:`~credo.commands.check_env`: ``credo check-env`` (an env's protocol checks);
- :mod:`~credo.commands.compare`: ``credo compare`` (arms × seeds on one budget);
- :mod:`~credo.commands.study`: ``credo study`` (a study file through ``compare``);
- :mod:`~credo.commands.cast`: CAST's stages (label, critic, critique SFT) that
  ``credo pipeline`` registers (:mod:`credo.pipeline.cast`).

Each builds its run with :func:`credo.train.run.build_run` and trains with
:func:`credo.train.loop.train`; nothing in :mod:`credo.train` imports this package.
"""
