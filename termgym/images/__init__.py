"""Task images for the Docker backend: Dockerfiles parsed for the embedded backend (``dockerfile``,
its lexer ``dockerfile_syntax``), built by content hash with offline ``FROM`` aliases (``build``),
pulled by policy (``pull``)."""
