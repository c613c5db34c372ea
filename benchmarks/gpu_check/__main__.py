"""``python -m stoker.benchmarks.gpu_check``: the GPU check without the ``stoker`` entry point."""

import sys

from .command import main_argv

if __name__ == "__main__":
    sys.exit(main_argv())
