import sys

from medusa.cli import main

sys.exit(main())
