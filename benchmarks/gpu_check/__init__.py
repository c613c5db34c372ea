"""``stoker gpu-check``: the prepared GPU measurement in one command.

:mod:`.command` (the function and its flags) runs each part of :mod:`.steps` in a process of
its own within a time box (:mod:`.proc`) and renders the result (:mod:`.report`).
``python -m stoker.benchmarks.gpu_check`` runs it too.
"""
