"""The compact PPO trainer (installed as ``termgym.trainer``): ``ppo.py`` (setup, the loop, the
update), ``losses.py`` (the arithmetic), ``rollout.py`` (TITO episodes through the scheduler),
``sampler.py`` (the sampler seam), ``pipeline.py`` (the main job), ``cli.py`` (``termgym train``).

Importing it sets ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it already, before any of
its modules loads torch (the OpenMP runtime reads it once, as torch loads it): torch's threads
then sleep while they wait instead of spinning, which changes how they wait, never what they
compute (the same bits), and keeps a CPU job's sandboxes and other processes off a spinning core
(docs/guides/training.md#determinism). A process that imported torch before has it unchanged."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
