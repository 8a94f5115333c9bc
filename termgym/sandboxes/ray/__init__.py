"""Sandboxes on the nodes of a Ray cluster (``--cluster``; the ``ray`` extra): one ``SandboxHost``
actor per node owns that node's sandboxes of the embedded or Docker backend (``host``); on the
driver, a ``RemoteSandbox`` forwards the sandbox contract to it (``remote``); ``cluster`` joins the
cluster, pins the actors, places sandboxes on nodes and ships task files. The agent loop, the
scheduler and verification's orchestration stay on the driver; commands and files stay on the node."""
