"""``accelerate launch [--config_file configs/accelerate/X.yaml] -m medusa.train RECIPE.yaml [key=value ...]``

An entry point (like ``medusa/__main__.py``), the same as ``medusa train RECIPE.yaml [key=value ...]``:
see :mod:`medusa.cli.train`. User errors print one ``error: ...`` line and exit 2.
"""

import sys

from medusa.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
