"""Where the repository is, for tests in any folder of tests/ (their own depth differs)."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
