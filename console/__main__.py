"""`python -m console`: the same as the `libreyolo-console` command."""

import sys

from libreyolo_console.app import main

sys.exit(main())
