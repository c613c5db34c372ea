"""Benchmarks, side by side in one run: ``stoker bench`` (:mod:`.loader`: the Loader against the
usual loaders), ``stoker bench-model`` (:mod:`.model`: the model alone), ``stoker bench-pack``
(:mod:`.packing`: packing speed), the frameworks figure (:mod:`.frameworks`); the pipelines they
time are :mod:`.runners`, and the peers' own programs, run by path, :mod:`.peers`."""
