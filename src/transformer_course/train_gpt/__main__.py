"""``python -m transformer_course.train_gpt``: see the package docstring."""

import sys

from .cli import main

sys.exit(main())
