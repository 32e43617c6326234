"""`python -m reflact.report`: a sweep's grid report from MLflow (reflact.sweeps.grid_report)."""

import sys

from reflact.sweeps.grid_report import main

if __name__ == "__main__":
    sys.exit(main())
