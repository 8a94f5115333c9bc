"""The ``long`` family set: several turns and 8 to 20 assertions a task (issue 21).

Built for the comparisons in which one bit per trajectory carries little: a policy that has
learnt the short families resolves few of these in full (every turn must be right), while each
command it gets right still earns its assertions. Like the short families, every command of a
reference solution is copied from the instruction by a fixed pattern, doing nothing passes no
assertion, and every command of the reference passes more of them than the one before.
``copy-chain`` (6 to 8 turns) is much longer than the rest (4 to 5): the straggler family.
``two-dirs`` is held out (never trained on).
"""
