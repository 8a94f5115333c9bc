"""Agent harnesses people already run, unchanged, on termgym: each behind the recording gateway
(``termgym.gateway``) as a termgym agent (``harness``), mini-swe-agent first (``mini_swe_agent``)."""
