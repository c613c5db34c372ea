"""``python -m stoker``: the ``stoker`` command (also ``torchrun -m stoker train ...``)."""

import sys

from stoker.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
