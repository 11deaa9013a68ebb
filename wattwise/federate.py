"""`wattwise federate --config FILE`: run the federation front door (federation.front).

FILE holds a `federation:` block (federation.config.FederationConfig): the clouds, each a
wattwise app's URL with its models and keys. The front serves the OpenAI API on
`host:port` until interrupted.
"""

from __future__ import annotations

import argparse

import uvicorn

from federation.config import load_federation
from federation.front import FrontDoor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="wattwise federate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML file with a `federation:` block")
    p.add_argument("--host", help="listen here instead of the config's host")
    p.add_argument("--port", type=int, help="listen here instead of the config's port")
    args = p.parse_args(argv)
    config = load_federation(args.config)
    door = FrontDoor(config)
    uvicorn.run(door.app(), host=args.host or config.host, port=args.port or config.port, log_level="info")
    return 0
