import sys

from swarmlm.cli import main

sys.exit(main())
