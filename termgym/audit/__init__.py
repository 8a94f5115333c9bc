"""The task audit: pure scoring and verdicts (``rubric``), the checks in fresh sandboxes
(``runner``), the verdict cache (``cache``) and the optional judge (``judge``)."""
