"""What people already use, on termgym. Agent harnesses, unchanged: each behind the recording gateway
(``termgym.gateway``) as a termgym agent (``harness``), mini-swe-agent first (``mini_swe_agent``).
Frameworks: termgym's episodes as a SkyRL-gym environment (``skyrl``) and as an inspect-ai sandbox
provider and scorer (``inspect``), driven from synchronous callers on one shared loop (``sync_loop``)
and through an outside sandbox API (``sandbox_io``)."""
