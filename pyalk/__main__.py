import sys

from pyalk.cli import main

sys.exit(main())
