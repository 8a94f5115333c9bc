"""The ``explore`` family set, the main job's (``make demo``): tasks a scripted teacher usually gets
wrong in one systematic way, and two in which the right action depends on what the environment
shows.

Every family here has one ``Flaw`` (``termgym.envs.families.spec``), the teacher's mistake at a
stated rate: the supervised start imitates the teacher's demonstrations, mistakes included, and
the verifier's reward is what can teach the policy to do better than its teacher. The rates:

=============  ==============================================================  =====
family         the teacher's mistake                                           rate
=============  ==============================================================  =====
write-file     ``touch`` the file and stop: it forgets the content             0.3
make-path      ``mkdir`` without ``-p`` for a nested path (it fails)           0.6
copy-file      ``mv`` instead of ``cp``: the source is gone                    0.6
dir-and-file   stops after the ``mkdir``: the file is never written            0.6
read-config    acts before looking: creates the key's name, not its value      0.6
find-file      acts before looking: copies ``file.txt``, which is not there    0.6
two-files      stops after the first file (held out: never trained on)         0.6
=============  ==============================================================  =====

Where the rate is above one half, a policy that imitates the teacher makes the mistake when it
decodes greedily; sampling, it gets the task right about four times in ten, which is what PPO
has to work with.
"""
