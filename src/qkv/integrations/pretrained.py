"""``qkv.hf.pretrained`` under its old name (the very module: ``sys.modules`` maps this name to it)."""

import sys

from ..hf import pretrained as _module

sys.modules[__name__] = _module
