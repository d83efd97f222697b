"""``python -m qkv.bench ...``: the same as ``qkv bench ...``."""

import sys

from . import main

sys.exit(main())
