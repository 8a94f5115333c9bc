"""The compact PPO trainer (installed as ``termgym.trainer``): ``ppo.py`` (setup, the loop, the
update), ``losses.py`` (the arithmetic), ``rollout.py`` (TITO episodes through the scheduler),
``sampler.py`` (the sampler seam), ``pipeline.py`` (the main job), ``cli.py`` (``termgym train``)."""
