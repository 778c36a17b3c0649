"""Entry point of the PyInstaller bundle: one executable for the window and the command line.

    kvprimer                      opens the window (app.__main__.main)
    kvprimer --screenshot X.png   the window's own options go to the window
    kvprimer --version            versions of KV Primer, llama-cpp-python and llama.cpp
    kvprimer info|prime|run|...   the `kvprimer` command line (app.cli); its commands are read
                                  from the CLI's own list, so none is left to the window

The engine also starts this executable as its crash check's child process (a bundle has no
`python -m`): CRASH_PROBE_ARG sends it to app/crash_probe_child.py.
"""
from __future__ import annotations

import sys

CRASH_PROBE_ARG = "--kvprimer-crash-probe"  # app.engine.llama.crash_probe.CHILD_ARG


def wants_cli(argv: list[str]) -> bool:
    from app.cli.parser import COMMAND_NAMES

    return bool(argv) and (argv[0] in COMMAND_NAMES or argv[0] == "--version")


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == [CRASH_PROBE_ARG]:
        from app.crash_probe_child import main as crash_probe_child

        return crash_probe_child(argv[1:])
    if wants_cli(argv):
        from app.cli import main as cli_main

        return cli_main(argv)
    from app.__main__ import main as gui_main

    return gui_main()


if __name__ == "__main__":
    sys.exit(main())
