"""Where the project's own files are, whether run from a checkout or an editable install."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVE_CONFIG = ROOT / "serve_config.yaml"
