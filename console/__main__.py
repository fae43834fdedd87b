"""`python -m console`: the same as the `libreyolo-console` command."""

import sys

from console.app import main

sys.exit(main())
