"""``python -m qkv ...`` is the ``qkv`` command."""

import sys

from .cli import main

sys.exit(main())
