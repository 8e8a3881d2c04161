"""The `imagebatch` command: parsing, the terminal's display and exit codes (`imagebatch.cli.main:main`)."""
