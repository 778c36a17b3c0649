"""Entry point of the PyInstaller bundle: one executable for the window and the command line.

    kvprimer                      opens the window (app.__main__.main)
    kvprimer --screenshot X.png   the window's own options go to the window
    kvprimer --version            versions of KV Primer, llama-cpp-python and llama.cpp
    kvprimer info|prime|run|bench|demo ...   the `kvprimer` command line (app.cli)
"""
from __future__ import annotations

import sys

CLI_COMMANDS = {"info", "prime", "run", "bench", "demo"}


def main() -> int:
    argv = sys.argv[1:]
    if argv and (argv[0] in CLI_COMMANDS or argv[0] == "--version"):
        from app.cli import main as cli_main

        return cli_main(argv)
    from app.__main__ import main as gui_main

    return gui_main()


if __name__ == "__main__":
    sys.exit(main())
