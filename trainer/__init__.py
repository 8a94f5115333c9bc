"""The compact PPO trainer: models.py, rollout.py (TITO), ppo.py (pure arithmetic), train.py (the loop), config.py."""
