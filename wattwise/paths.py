"""Where the project's own files are, whether run from a checkout or an editable install."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
SERVE_CONFIG = ROOT / "serve_config.yaml"


def trace_path(name: str) -> Path:
    """'conv' or 'code' name a shipped Azure trace; anything else is a CSV path."""
    shipped = {"conv": "AzureLLMInferenceTrace_conv.csv", "code": "AzureLLMInferenceTrace_code.csv"}
    path = DATA_DIR / "azure" / shipped[name] if name in shipped else Path(name)
    if not path.exists():
        raise FileNotFoundError(f"trace {name!r} not found at {path}")
    return path
