"""The ``explore`` family set, the main job's (``make demo``): tasks a scripted teacher usually gets
wrong in one systematic way, and two in which the right action depends on what the environment
shows.

Every family here has one ``Flaw`` (``termgym.envs.families.spec``), the teacher's mistake at a
stated rate (0.3 for ``write-file``, 0.6 for the others): the supervised start imitates the
teacher's demonstrations, mistakes included, and the verifier's reward is what can teach the
policy to do better than its teacher. ``two-files`` is held out (never trained on).

Each family's mistake, and why the rates are what they are:
docs/guides/tasks.md#the-explore-family-set-and-the-scripted-teacher."""
