"""The console's screens: run list, new-run form, run view, and small dialogs."""
