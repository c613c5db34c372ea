"""What several commands share: the result base (:mod:`.results`), flag values (:mod:`.units`)
and generated image datasets (:mod:`.synth`, the demo's and the tests' data)."""
