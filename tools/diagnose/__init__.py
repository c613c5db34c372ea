"""``stoker diagnose``: why is training slow, with numbers.

:mod:`.command` (the function :func:`~.command.diagnose` and its flags) turns what the user
names into a loader and a model (:mod:`.inputs`); :mod:`.engine` measures them apart and
together (:mod:`.measure`, timed by :mod:`.timing`); :mod:`.report` judges the figures and
ranks the next steps, :mod:`.text` writes them out.
"""
