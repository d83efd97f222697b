"""Make the toy model/task module (``_toy_train``) importable from the tests in this folder."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
