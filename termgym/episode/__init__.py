"""One episode's parts: its shell, its sandbox's spec, Harbor's phases and steps, verification, and what ended it."""
