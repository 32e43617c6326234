"""`python -m reflact.importers`: other logs as a dataset folder (reflact.inputs.importers)."""

import sys

from reflact.inputs.importers import main

if __name__ == "__main__":
    sys.exit(main())
