"""The bundled task directories (data) and the parametric task families (``families``), installed
as ``termgym.envs``."""
