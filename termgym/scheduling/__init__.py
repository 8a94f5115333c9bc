"""Rollout scheduling: the scheduler and its modes (``scheduler``), its nodes and task pool
(``pool``), the one runner of trials (``runners``), straggler-bias accounting (``bias``) and a
simulated backend with its clock (``simulated``, ``latency``, ``simclock``)."""
