"""The Daytona backend: cloud sandboxes through the real SDK (``backend``), its provider with paced
creation and retries (``provider``), the persistent shell over a session (``channel``) and the pure
rules they follow (``policy``)."""
